package config

import (
	"encoding"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// decoder turns a yaml.Node tree into Go values strictly, tracking the path
// of every value so that an error names it ("providers[0].options.nodes").
//
// yaml.v3's own strict mode (Decoder.KnownFields) reports only a line number
// and a Go type name; Berth's contract is to name the path, so the mapping
// from nodes to fields is done here. Struct fields are matched by their yaml
// tag, or by their json tag when they have no yaml tag (so that the driver's
// Spec and Resources read the same in a config file as in the API).
type decoder struct{}

var (
	durationType  = reflect.TypeFor[time.Duration]()
	jsonUnmarshal = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshal = reflect.TypeFor[encoding.TextUnmarshaler]()
	anyType       = reflect.TypeFor[any]()
)

// pathError is one decoding failure at a path.
type pathError struct {
	path   string
	line   int
	reason string
}

func (e *pathError) Error() string {
	where := e.path
	if where == "" {
		where = "(top level)"
	}
	if e.line > 0 {
		return fmt.Sprintf("%s (line %d): %s", where, e.line, e.reason)
	}
	return where + ": " + e.reason
}

func errAt(n *yaml.Node, path, format string, args ...any) *pathError {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &pathError{path: path, line: line, reason: fmt.Sprintf(format, args...)}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// decode sets v (settable) from n.
func (d decoder) decode(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		return d.decode(n.Content[0], v, path)
	}
	if n.Kind == yaml.AliasNode {
		return d.decode(n.Alias, v, path)
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		v.Set(reflect.Zero(v.Type()))
		return nil
	}
	t := v.Type()
	switch {
	case t == durationType:
		return d.duration(n, v, path)
	case t == anyType:
		var x any
		if err := n.Decode(&x); err != nil {
			return errAt(n, path, "%v", err)
		}
		v.Set(reflect.ValueOf(normalize(x)))
		return nil
	case reflect.PointerTo(t).Implements(jsonUnmarshal):
		return d.viaJSON(n, v, path)
	case reflect.PointerTo(t).Implements(textUnmarshal) && n.Kind == yaml.ScalarNode:
		if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(n.Value)); err != nil {
			return errAt(n, path, "%v", err)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		p := reflect.New(t.Elem())
		if err := d.decode(n, p.Elem(), path); err != nil {
			return err
		}
		v.Set(p)
		return nil
	case reflect.Struct:
		return d.structure(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return errAt(n, path, "want a list, got %s", describe(n))
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, c := range n.Content {
			if err := d.decode(c, s.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return errAt(n, path, "want a mapping, got %s", describe(n))
		}
		if t.Key().Kind() != reflect.String {
			return errAt(n, path, "unsupported map key type %s", t.Key())
		}
		m := reflect.MakeMapWithSize(t, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return errAt(k, path, "keys must be scalars")
			}
			ev := reflect.New(t.Elem()).Elem()
			if err := d.decode(val, ev, join(path, k.Value)); err != nil {
				return err
			}
			m.SetMapIndex(reflect.ValueOf(k.Value).Convert(t.Key()), ev)
		}
		v.Set(m)
		return nil
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return d.scalar(n, v, path)
	}
	return errAt(n, path, "unsupported type %s", t)
}

func (d decoder) structure(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind != yaml.MappingNode {
		return errAt(n, path, "want a mapping, got %s", describe(n))
	}
	fields := fieldsOf(v.Type())
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := k.Value
		f, ok := fields[key]
		if !ok {
			return errAt(k, join(path, key), "unknown key; known keys: %s", strings.Join(knownKeys(v.Type()), ", "))
		}
		if seen[key] {
			return errAt(k, join(path, key), "key given twice")
		}
		seen[key] = true
		if err := d.decode(val, v.FieldByIndex(f), join(path, key)); err != nil {
			return err
		}
	}
	return nil
}

func (d decoder) scalar(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind != yaml.ScalarNode {
		return errAt(n, path, "want %s, got %s", kindName(v.Type()), describe(n))
	}
	switch v.Kind() {
	case reflect.String:
		if n.Tag != "!!str" && n.Tag != "!!int" && n.Tag != "!!float" && n.Tag != "!!bool" {
			return errAt(n, path, "want a string, got %s", describe(n))
		}
		v.SetString(n.Value)
	case reflect.Bool:
		if n.Tag != "!!bool" {
			return errAt(n, path, "want true or false, got %q", n.Value)
		}
		b, _ := strconv.ParseBool(strings.ToLower(n.Value))
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		var x int64
		if n.Tag != "!!int" || n.Decode(&x) != nil || v.OverflowInt(x) {
			return errAt(n, path, "want an integer, got %q", n.Value)
		}
		v.SetInt(x)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		var x uint64
		if n.Tag != "!!int" || n.Decode(&x) != nil || v.OverflowUint(x) {
			return errAt(n, path, "want a non-negative integer, got %q", n.Value)
		}
		v.SetUint(x)
	case reflect.Float32, reflect.Float64:
		var x float64
		if (n.Tag != "!!int" && n.Tag != "!!float") || n.Decode(&x) != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return errAt(n, path, "want a number, got %q", n.Value)
		}
		v.SetFloat(x)
	}
	return nil
}

func (d decoder) duration(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return errAt(n, path, "want a duration such as \"5s\", got %s", describe(n))
	}
	x, err := time.ParseDuration(n.Value)
	if err != nil {
		return errAt(n, path, "want a duration such as \"5s\", got %q", n.Value)
	}
	if x < 0 {
		return errAt(n, path, "must not be negative")
	}
	v.SetInt(int64(x))
	return nil
}

// viaJSON decodes types that define their own JSON form (MilliCPU, Bytes).
func (d decoder) viaJSON(n *yaml.Node, v reflect.Value, path string) error {
	var x any
	if err := n.Decode(&x); err != nil {
		return errAt(n, path, "%v", err)
	}
	b, err := json.Marshal(normalize(x))
	if err != nil {
		return errAt(n, path, "%v", err)
	}
	if err := v.Addr().Interface().(json.Unmarshaler).UnmarshalJSON(b); err != nil {
		return errAt(n, path, "%v", err)
	}
	return nil
}

// normalize turns yaml's map[any]any (never produced by yaml.v3 for string
// keys, but possible for others) into map[string]any, recursively.
func normalize(x any) any {
	switch t := x.(type) {
	case map[string]any:
		for k, v := range t {
			t[k] = normalize(v)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, v := range t {
			m[fmt.Sprint(k)] = normalize(v)
		}
		return m
	case []any:
		for i, v := range t {
			t[i] = normalize(v)
		}
		return t
	}
	return x
}

// fieldsOf maps config keys to field indexes: the yaml tag, else the json
// tag, else the lower-cased field name. Embedded structs without a tag are
// inlined.
func fieldsOf(t reflect.Type) map[string][]int {
	out := map[string][]int{}
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() || (f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("yaml") == "" && f.Tag.Get("json") == "") {
			continue
		}
		name := keyOf(f)
		if name == "-" {
			continue
		}
		if _, dup := out[name]; !dup || len(f.Index) < len(out[name]) {
			out[name] = f.Index
		}
	}
	return out
}

func keyOf(f reflect.StructField) string {
	for _, tag := range []string{"yaml", "json"} {
		if s, ok := f.Tag.Lookup(tag); ok {
			name, _, _ := strings.Cut(s, ",")
			if name != "" {
				return name
			}
		}
	}
	return strings.ToLower(f.Name)
}

func knownKeys(t reflect.Type) []string {
	fs := fieldsOf(t)
	keys := make([]string, 0, len(fs))
	for k := range fs {
		keys = append(keys, k)
	}
	sortStrings(keys)
	return keys
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Struct, reflect.Map:
		return "a mapping"
	case reflect.Slice:
		return "a list"
	}
	return "an integer"
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		case "!!int", "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an unexpected value"
}

func reflectValue(p any) reflect.Value { return reflect.ValueOf(p).Elem() }
