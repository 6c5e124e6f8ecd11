package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/berth-dev/berth/control"
)

// Group returns the state of a group and of each of its services.
func (c *Client) Group(ctx context.Context, id string) (*control.GroupStatus, error) {
	var g control.GroupStatus
	if err := c.call(ctx, http.MethodGet, "/v1/groups/"+url.PathEscape(id), nil, nil, &g); err != nil {
		return nil, err
	}
	return &g, nil
}
