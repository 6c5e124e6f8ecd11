package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"github.com/berth-dev/berth/driver"
)

// decodeBody reads r's body (at most limit bytes) into v strictly: unknown
// fields, wrong types, trailing data and an empty body are driver.FieldErrors
// naming the field; an oversized body is an *http.MaxBytesError.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return err
	}
	return decodeJSON(body, v)
}

// decodeJSON decodes data into v strictly. The fast path is one
// encoding/json pass; only when it fails is the body walked against v's type
// to name the field that is wrong.
func decodeJSON(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return &driver.FieldError{Path: "body", Reason: "required: a JSON object"}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if dec.More() {
			return &driver.FieldError{Path: "body", Reason: "trailing data after the JSON object"}
		}
		if _, err := dec.Token(); err != io.EOF {
			return &driver.FieldError{Path: "body", Reason: "trailing data after the JSON object"}
		}
		return nil
	}
	var syn *json.SyntaxError
	if errors.As(err, &syn) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &driver.FieldError{Path: "body", Reason: "malformed JSON: " + err.Error()}
	}
	var generic any
	if json.Unmarshal(data, &generic) == nil {
		if fe := locate(generic, reflect.TypeOf(v).Elem(), ""); fe != nil {
			return fe
		}
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return &driver.FieldError{Path: te.Field, Reason: fmt.Sprintf("want %s, got %s", te.Type, te.Value)}
	}
	return &driver.FieldError{Path: "body", Reason: err.Error()}
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// locate walks a generically decoded JSON value against type t and returns
// the first field that does not fit, or nil.
func locate(v any, t reflect.Type, path string) *driver.FieldError {
	at := func(reason string, args ...any) *driver.FieldError {
		p := path
		if p == "" {
			p = "body"
		}
		return &driver.FieldError{Path: p, Reason: fmt.Sprintf(reason, args...)}
	}
	if v == nil {
		return nil
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		b, _ := json.Marshal(v)
		if err := reflect.New(t).Interface().(json.Unmarshaler).UnmarshalJSON(b); err != nil {
			return at("%v", err)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		return locate(v, t.Elem(), path)
	case reflect.Interface:
		return nil
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return at("want an object, got %s", jsonKind(v))
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			f, ok := fields[k]
			if !ok {
				// encoding/json matches keys case-insensitively.
				for name, ff := range fields {
					if strings.EqualFold(name, k) {
						f, ok = ff, true
						break
					}
				}
			}
			if !ok {
				return &driver.FieldError{Path: joinPath(path, k), Reason: "unknown field"}
			}
			if fe := locate(m[k], f, joinPath(path, k)); fe != nil {
				return fe
			}
		}
		return nil
	case reflect.Slice, reflect.Array:
		s, ok := v.([]any)
		if !ok {
			return at("want a list, got %s", jsonKind(v))
		}
		for i, e := range s {
			if fe := locate(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); fe != nil {
				return fe
			}
		}
		return nil
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return at("want an object, got %s", jsonKind(v))
		}
		for k, e := range m {
			if fe := locate(e, t.Elem(), joinPath(path, k)); fe != nil {
				return fe
			}
		}
		return nil
	case reflect.String:
		if _, ok := v.(string); !ok {
			return at("want a string, got %s", jsonKind(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return at("want true or false, got %s", jsonKind(v))
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		f, ok := v.(float64)
		if !ok {
			return at("want an integer, got %s", jsonKind(v))
		}
		n := reflect.New(t)
		if err := json.Unmarshal(fmt.Appendf(nil, "%v", f), n.Interface()); err != nil || f != float64(int64(f)) {
			return at("want an integer in range, got %v", f)
		}
	case reflect.Float32, reflect.Float64:
		if _, ok := v.(float64); !ok {
			return at("want a number, got %s", jsonKind(v))
		}
	}
	return nil
}

// jsonFields maps JSON keys to field types, inlining embedded structs as
// encoding/json does.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	depth := map[string]int{}
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if d, ok := depth[name]; ok && d <= len(f.Index) {
			continue
		}
		out[name], depth[name] = f.Type, len(f.Index)
	}
	return out
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func jsonKind(v any) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case float64:
		return fmt.Sprintf("the number %v", t)
	case string:
		return fmt.Sprintf("the string %q", t)
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
