package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/encoding"

	"github.com/berth-dev/berth/driver"
)

// Protocol is the version of the plugin protocol this package speaks. A
// plugin built against another version is refused at start, by name.
const Protocol = 1

// Handshake is go-plugin's handshake: a plugin started without the cookie
// (by hand, or by a host of another program) says it is a plugin and exits.
var Handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  Protocol,
	MagicCookieKey:   "BERTH_DRIVER_PLUGIN",
	MagicCookieValue: "a7f3c1e9-berth-driver-plugin",
}

// pluginName is the one plugin of the go-plugin set a binary serves.
const pluginName = "driver"

// The gRPC service is written by hand, without generated code: its
// messages are the Go structs below, carried by codec, a JSON codec
// registered under its own content subtype. go-plugin's own services (health,
// controller, stdio) keep their protobuf codec on the same connection.
const (
	serviceName = "berth.driver.v1.Driver"
	codecName   = "berth-json"
)

type codec struct{}

func (codec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (codec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (codec) Name() string                       { return codecName }

func init() { encoding.RegisterCodec(codec{}) }

// wireError is an error as it crosses the wire: the message, the class
// (the text of one of driver.Classes), the field errors and the nodes of a
// partial listing, so that errors.Is and errors.As work on the host side
// as they did in the plugin.
type wireError struct {
	Msg     string               `json:"msg"`
	Class   string               `json:"class,omitempty"`
	Fields  []*driver.FieldError `json:"fields,omitempty"`
	Partial []string             `json:"partial,omitempty"`
	// Context is "canceled" or "deadline" when the error wraps the
	// context's.
	Context string `json:"context,omitempty"`
}

func encodeError(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Msg: err.Error()}
	if k := driver.ClassOf(err); k != nil {
		w.Class = k.Error()
	}
	var fes driver.FieldErrors
	var fe *driver.FieldError
	switch {
	case errors.As(err, &fes):
		w.Fields = fes
	case errors.As(err, &fe):
		w.Fields = []*driver.FieldError{fe}
	}
	var pe *driver.PartialListError
	if errors.As(err, &pe) {
		w.Partial = pe.Nodes
	}
	switch {
	case errors.Is(err, context.Canceled):
		w.Context = "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		w.Context = "deadline"
	}
	return w
}

// remoteError is an error that came over the wire: it reads as it did in
// the plugin and unwraps to its class, its field errors and its context
// error.
type remoteError struct {
	msg  string
	errs []error
}

func (e *remoteError) Error() string   { return e.msg }
func (e *remoteError) Unwrap() []error { return e.errs }

func (w *wireError) err() error {
	if w == nil {
		return nil
	}
	e := &remoteError{msg: w.Msg}
	for _, k := range driver.Classes {
		if k.Error() == w.Class {
			e.errs = append(e.errs, k)
			break
		}
	}
	switch len(w.Fields) {
	case 0:
	case 1:
		e.errs = append(e.errs, w.Fields[0])
	default:
		e.errs = append(e.errs, driver.FieldErrors(w.Fields))
	}
	switch w.Context {
	case "canceled":
		e.errs = append(e.errs, context.Canceled)
	case "deadline":
		e.errs = append(e.errs, context.DeadlineExceeded)
	}
	if w.Partial != nil {
		return &driver.PartialListError{Nodes: w.Partial, Err: e}
	}
	return e
}

// reply is embedded in every answer: the error of the call, if any.
type reply struct {
	Err *wireError `json:"err,omitempty"`
}

func (r *reply) setErr(err error) { r.Err = encodeError(err) }
func (r *reply) error() error     { return r.Err.err() }

// answer is what every answer type is.
type answer interface {
	setErr(error)
	error() error
}

// Messages. Requests name what they act on; answers embed reply.
type (
	infoReq   struct{}
	infoReply struct {
		reply
		Name     string          `json:"name"`
		Summary  string          `json:"summary,omitempty"`
		Version  string          `json:"version,omitempty"`
		Options  []driver.Option `json:"options,omitempty"`
		Protocol int             `json:"protocol"`
		Open     bool            `json:"open"`
		// Key is what the driver was opened with (openReq.Key), when Open.
		Key string `json:"key,omitempty"`
	}
	openReq struct {
		Options  map[string]any `json:"options,omitempty"`
		Provider string         `json:"provider"`
		Cluster  string         `json:"cluster"`
		DataDir  string         `json:"data_dir,omitempty"`
		// Key identifies the options; a plugin already open with the
		// same key answers as if it opened now (a host that reattaches).
		Key string `json:"key"`
	}
	openReply struct {
		reply
		Capabilities []string `json:"capabilities"`
		Features     []string `json:"features"`
		CheckSpec    bool     `json:"check_spec,omitempty"`
	}
	emptyReq   struct{}
	emptyReply struct{ reply }
	stateReply struct {
		reply
		State *driver.PlatformState `json:"state,omitempty"`
	}
	createReq struct {
		Node string       `json:"node"`
		Spec *driver.Spec `json:"spec"`
		// Deadline is the deadline of the host's ctx, which bounds the
		// whole operation; zero: none.
		Deadline time.Time `json:"deadline,omitzero"`
	}
	deleteReq struct {
		ID       string    `json:"id"`
		Deadline time.Time `json:"deadline,omitzero"`
	}
	// opReply answers a create or delete with the operation's number and
	// what its first Advance, made at once in the plugin, reported: a
	// quick back-end finishes in one round trip. First is nil when that
	// Advance failed (then Err holds its error and the operation is over).
	opReply struct {
		reply
		Op    uint64        `json:"op"`
		First *advanceReply `json:"first,omitempty"`
	}
	advanceReq struct {
		Op uint64 `json:"op"`
	}
	advanceReply struct {
		reply
		Done     bool             `json:"done,omitempty"`
		Instance *driver.Instance `json:"instance,omitempty"`
		Wait     time.Duration    `json:"wait,omitempty"`
		Queued   bool             `json:"queued,omitempty"`
	}
	idReq struct {
		ID     string           `json:"id,omitempty"`
		Name   string           `json:"name,omitempty"`
		Node   string           `json:"node,omitempty"`
		Grace  time.Duration    `json:"grace,omitempty"`
		Signal string           `json:"signal,omitempty"`
		Size   driver.TTYSize   `json:"size,omitzero"`
		Res    driver.Resources `json:"resources,omitzero"`
		// Network and Aliases are a network connect's.
		Network string   `json:"network,omitempty"`
		Aliases []string `json:"aliases,omitempty"`
	}
	instanceReply struct {
		reply
		Instance *driver.Instance `json:"instance,omitempty"`
	}
	listReq struct {
		Tags map[string]string `json:"tags,omitempty"`
	}
	listReply struct {
		reply
		Instances []*driver.Instance `json:"instances"`
	}
	specReq struct {
		Spec *driver.Spec `json:"spec"`
	}
	imagesReply struct {
		reply
		Images []driver.Image `json:"images"`
	}
	usageReply struct {
		reply
		Usage *driver.Usage `json:"usage,omitempty"`
	}
	textReply struct {
		reply
		Text string `json:"text"`
	}
	// Streams: the first message from the host is the request; each
	// message from the plugin carries data, and the last one the error.
	logsReq struct {
		ID   string            `json:"id"`
		Opts driver.LogOptions `json:"opts"`
	}
	attachReq struct {
		// The first message names the instance; the ones after carry
		// stdin (Data) and its end (EOF).
		ID       string               `json:"id,omitempty"`
		Opts     driver.AttachOptions `json:"opts,omitzero"`
		HasStdin bool                 `json:"has_stdin,omitempty"`
		Data     []byte               `json:"data,omitempty"`
		EOF      bool                 `json:"eof,omitempty"`
	}
	preloadReq struct {
		Image string   `json:"image"`
		Nodes []string `json:"nodes,omitempty"`
	}
	streamMsg struct {
		reply
		// Stream is 1 for stdout and 2 for stderr.
		Stream   int                     `json:"stream,omitempty"`
		Data     []byte                  `json:"data,omitempty"`
		Event    *driver.Event           `json:"event,omitempty"`
		Progress *driver.PreloadProgress `json:"progress,omitempty"`
		// End marks the last message.
		End bool `json:"end,omitempty"`
	}
)
