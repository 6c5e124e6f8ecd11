package api

import (
	"io"
	"net/http"

	"github.com/berth-dev/berth/driver"
)

// decodeBody reads r's body (at most limit bytes) into v strictly
// (driver.DecodeJSON, the whole body named "body"); an oversized body is an
// *http.MaxBytesError.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return err
	}
	return driver.DecodeJSON(body, v, "body")
}
