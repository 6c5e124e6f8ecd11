package api

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/berth-dev/berth/driver"
)

// BodyError is a request body that could not be read for what the client
// sent, or did not send: a body shorter than its Content-Length, chunked
// framing that does not parse, or a body that did not arrive within the
// server's read timeout. The API answers it 408 when the body was too slow
// (Timeout), 400 otherwise: never a 5xx, as the server is not at fault.
type BodyError struct {
	Err error
}

func (e *BodyError) Error() string {
	if e.Timeout() {
		return "the request body did not arrive in time: " + e.Err.Error()
	}
	return "the request body could not be read (truncated or badly framed): " + e.Err.Error()
}

func (e *BodyError) Unwrap() error { return e.Err }

// Timeout reports whether the body was cut by the server's read deadline.
func (e *BodyError) Timeout() bool {
	var ne net.Error
	return errors.Is(e.Err, os.ErrDeadlineExceeded) || errors.As(e.Err, &ne) && ne.Timeout()
}

// ReadBody reads body, w's request's, whole. An oversized body (body from
// http.MaxBytesReader) is the *http.MaxBytesError; any other failure to
// read is a *BodyError. A body cut by the read deadline gives w
// answerTime from now to answer it: the server's write deadline may have
// passed with the read deadline.
func ReadBody(w http.ResponseWriter, body io.Reader) ([]byte, error) {
	b, err := io.ReadAll(body)
	if err == nil {
		return b, nil
	}
	return nil, ReadError(w, err)
}

// ReadError is what ReadBody returns for err, an error reading w's
// request's body by any other means (a form parser): the
// *http.MaxBytesError as it is, else a *BodyError, giving w answerTime
// to answer when the read deadline cut the body.
func ReadError(w http.ResponseWriter, err error) error {
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		return err
	}
	be := &BodyError{Err: err}
	if be.Timeout() {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(answerTime))
	}
	return be
}

// answerTime is how long the answer to a body cut by the read deadline may
// take to write.
const answerTime = 5 * time.Second

// decodeBody reads r's body (at most limit bytes) into v strictly
// (driver.DecodeJSON, the whole body named "body"); an oversized body is an
// *http.MaxBytesError, one that cannot be read a *BodyError.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body, err := ReadBody(w, http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return err
	}
	return driver.DecodeJSON(body, v, "body")
}
