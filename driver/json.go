package driver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// DecodeJSON is Berth's one strict JSON decoder, for API bodies, workload
// files, driver options and every other JSON a user writes. It decodes data
// into v: keys match field names exactly (no case folding), and a key given
// twice, an unknown key, a wrong type, trailing data, a truncated or
// malformed document and an empty one are each a *FieldError naming the
// field (or root, the name of the whole document, such as "body") and, for
// what is not JSON, the byte offset.
func DecodeJSON(data []byte, v any, root string) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return &FieldError{Path: root, Reason: "required: a JSON value"}
	}
	err := jsonv2.Unmarshal(data, v, jsonv2.RejectUnknownMembers(true))
	if err == nil {
		return nil
	}
	return jsonError(err, len(data), root)
}

// jsonError turns an error of the JSON decoder into a field error.
func jsonError(err error, size int, root string) error {
	orRoot := func(path string) string {
		if path == "" {
			return root
		}
		return path
	}
	var se *jsontext.SyntacticError
	if errors.As(err, &se) {
		path := pointerPath(se.JSONPointer)
		reason := strings.TrimPrefix(se.Err.Error(), "jsontext: ")
		if errors.Is(se.Err, jsontext.ErrDuplicateName) {
			return &FieldError{Path: path, Reason: "given twice: give each key once"}
		}
		if errors.Is(se.Err, io.ErrUnexpectedEOF) {
			return &FieldError{Path: root, Reason: fmt.Sprintf("malformed JSON: it ends at byte %d in the middle of a value", size)}
		}
		return &FieldError{Path: root, Reason: fmt.Sprintf("malformed JSON at byte %d (%s): %s", se.ByteOffset, orRoot(path), reason)}
	}
	var me *jsonv2.SemanticError
	if errors.As(err, &me) {
		path := pointerPath(me.JSONPointer)
		switch {
		case errors.Is(me.Err, jsonv2.ErrUnknownName):
			return &FieldError{Path: path, Reason: "unknown field (keys are case-sensitive)"}
		case me.Err != nil:
			var fe *FieldError
			if errors.As(me.Err, &fe) {
				// A type's own UnmarshalJSON named what is wrong.
				return &FieldError{Path: joinPath(path, fe.Path), Reason: fe.Reason}
			}
			return &FieldError{Path: orRoot(path), Reason: me.Err.Error()}
		case me.GoType != nil:
			return &FieldError{Path: orRoot(path), Reason: fmt.Sprintf("want %s, got %s", kindName(me.GoType.Kind().String()), jsonKindName(me.JSONKind))}
		}
	}
	return &FieldError{Path: root, Reason: err.Error()}
}

// pointerPath writes a JSON pointer ("/ports/1/host_port") as Berth's
// field paths do ("ports[1].host_port").
func pointerPath(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if _, err := strconv.Atoi(tok); err == nil && b.Len() > 0 {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

func joinPath(path, key string) string {
	switch {
	case path == "":
		return key
	case key == "":
		return path
	}
	return path + "." + key
}

// kindName names a Go kind as a JSON user reads it.
func kindName(k string) string {
	switch {
	case strings.HasPrefix(k, "int"), strings.HasPrefix(k, "uint"):
		return "an integer"
	case strings.HasPrefix(k, "float"):
		return "a number"
	case k == "string":
		return "a string"
	case k == "bool":
		return "true or false"
	case k == "slice", k == "array":
		return "a list"
	case k == "map", k == "struct":
		return "an object"
	}
	return k
}

// jsonKindName names a JSON kind.
func jsonKindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 'f', 't':
		return "a boolean"
	case '"':
		return "a string"
	case '0':
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "a list"
	}
	return "something else"
}

// The options of Berth's output convention (MarshalOutput) and of reading
// it back (UnmarshalOutput).
var (
	outputMarshal = jsonv2.JoinOptions(jsonv1.DefaultOptionsV1(), jsonv2.WithMarshalers(
		jsonv2.MarshalToFunc(func(enc *jsontext.Encoder, b Bytes) error {
			return enc.WriteToken(jsontext.Int(int64(b)))
		})))
	outputUnmarshal = jsonv2.JoinOptions(jsonv1.DefaultOptionsV1(), jsonv2.WithUnmarshalers(
		jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, b *Bytes) error {
			tok, err := dec.ReadToken()
			if err != nil {
				return err
			}
			switch tok.Kind() {
			case 'n':
				return nil // null leaves it as it is, as encoding/json does
			case '0':
			default:
				return fmt.Errorf("size: want an integer number of bytes, got %s", jsonKindName(tok.Kind()))
			}
			n, err := strconv.ParseInt(tok.String(), 10, 64)
			if err != nil {
				return fmt.Errorf("size %s: want an integer number of bytes", tok.String())
			}
			*b = Bytes(n)
			return nil
		})))
)

// MarshalOutput writes v in the one JSON convention of what Berth writes for
// people and programs: API answers, event streams and every --json output.
// It is encoding/json's, except that a size (Bytes) is an integer number of
// bytes, never MiB or a string with a unit. Requests stay lenient
// (DecodeJSON: a number of MiB or a string with a unit); stored records keep
// Bytes' own form.
func MarshalOutput(v any) ([]byte, error) {
	return jsonv2.Marshal(v, outputMarshal)
}

// MarshalOutputIndent is MarshalOutput indented by two spaces, for people.
func MarshalOutputIndent(v any) ([]byte, error) {
	return jsonv2.Marshal(v, outputMarshal, jsontext.WithIndent("  "))
}

// UnmarshalOutput reads what MarshalOutput wrote, as a client reads an
// answer: keys it does not know are ignored, as encoding/json does.
func UnmarshalOutput(data []byte, v any) error {
	return jsonv2.Unmarshal(data, v, outputUnmarshal)
}

// DecodeOutput reads one JSON value of Berth's output from dec.
func DecodeOutput(dec *jsontext.Decoder, v any) error {
	return jsonv2.UnmarshalDecode(dec, v, outputUnmarshal)
}
