package client

import (
	"context"
	"net/http"

	"github.com/berth-dev/berth/api"
)

// Version returns the server's version.
func (c *Client) Version(ctx context.Context) (*api.VersionInfo, error) {
	var v api.VersionInfo
	if err := c.call(ctx, http.MethodGet, "/v1/version", nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}
