package api

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/berth-dev/berth/driver"
)

// decodeBody reads r's body (at most limit bytes) into v strictly (see
// decodeJSON); an oversized body is an *http.MaxBytesError.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return err
	}
	return decodeJSON(body, v)
}

// decodeJSON decodes data into v strictly: keys match field names exactly
// (no case folding), a key given twice, an unknown key, a wrong type,
// trailing data, a truncated or malformed body and an empty one are each a
// *driver.FieldError naming the field (or "body") and, for what is not
// JSON, the byte offset.
func decodeJSON(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return &driver.FieldError{Path: "body", Reason: "required: a JSON object"}
	}
	err := jsonv2.Unmarshal(data, v, jsonv2.RejectUnknownMembers(true))
	if err == nil {
		return nil
	}
	return decodeError(err, len(data))
}

// decodeError turns an error of the JSON decoder into a field error.
func decodeError(err error, size int) error {
	var se *jsontext.SyntacticError
	if errors.As(err, &se) {
		path := pointerPath(se.JSONPointer)
		reason := strings.TrimPrefix(se.Err.Error(), "jsontext: ")
		if errors.Is(se.Err, jsontext.ErrDuplicateName) {
			return &driver.FieldError{Path: path, Reason: "given twice: give each key once"}
		}
		if errors.Is(se.Err, io.ErrUnexpectedEOF) {
			return &driver.FieldError{Path: "body", Reason: fmt.Sprintf("malformed JSON: the body ends at byte %d in the middle of a value", size)}
		}
		return &driver.FieldError{Path: "body", Reason: fmt.Sprintf("malformed JSON at byte %d (%s): %s", se.ByteOffset, orBody(path), reason)}
	}
	var me *jsonv2.SemanticError
	if errors.As(err, &me) {
		path := pointerPath(me.JSONPointer)
		switch {
		case errors.Is(me.Err, jsonv2.ErrUnknownName):
			return &driver.FieldError{Path: path, Reason: "unknown field (keys are case-sensitive)"}
		case me.Err != nil:
			var fe *driver.FieldError
			if errors.As(me.Err, &fe) {
				// A type's own UnmarshalJSON named what is wrong.
				return &driver.FieldError{Path: joinPath(path, fe.Path), Reason: fe.Reason}
			}
			return &driver.FieldError{Path: orBody(path), Reason: me.Err.Error()}
		case me.GoType != nil:
			return &driver.FieldError{Path: orBody(path), Reason: fmt.Sprintf("want %s, got %s", kindName(me.GoType.Kind().String()), jsonKindName(me.JSONKind))}
		}
	}
	return &driver.FieldError{Path: "body", Reason: err.Error()}
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

func orBody(path string) string {
	if path == "" {
		return "body"
	}
	return path
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
