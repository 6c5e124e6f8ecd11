package driver

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Option documents one driver option. Every option can be set in the config
// file under the provider's options and as the flag --<driver>-<name>.
type Option struct {
	Name    string `json:"name"`
	Type    string `json:"type"` // string, bool, int, float, duration, list, map, size, cpus or json
	Default string `json:"default,omitempty"`
	// Range is the values a number may take, both ends included, as
	// "min,max" in the option's own notation ("1ms,1h", "1,1024"): the
	// field's `range` tag, which every numeric option declares. Decode
	// refuses a value outside it, naming the option.
	Range string `json:"range,omitempty"`
	Help  string `json:"help,omitempty"`
}

// FlagName returns the command-line flag (without dashes in front) that sets
// option o of driver: the option's name with underscores turned into dashes,
// after the driver's name, e.g. "local-stop-grace" for stop_grace.
func FlagName(driver string, o Option) string {
	return driver + "-" + strings.ReplaceAll(o.Name, "_", "-")
}

var (
	durationType    = reflect.TypeFor[time.Duration]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	cpuType         = reflect.TypeFor[MilliCPU]()
	bytesType       = reflect.TypeFor[Bytes]()
)

type optionField struct {
	name  string
	index []int
	typ   reflect.Type
	help  string
	rng   string // the range tag, "min,max"
}

func optionFields(t reflect.Type) []optionField {
	var out []optionField
	for _, f := range reflect.VisibleFields(t) {
		name, ok := f.Tag.Lookup("option")
		if !ok || !f.IsExported() {
			continue
		}
		out = append(out, optionField{name: name, index: f.Index, typ: f.Type, help: f.Tag.Get("help"), rng: f.Tag.Get("range")})
	}
	slices.SortFunc(out, func(a, b optionField) int { return strings.Compare(a.name, b.name) })
	return out
}

func typeName(t reflect.Type) string {
	switch {
	case t == durationType:
		return "duration"
	case t == cpuType:
		return "cpus"
	case t == bytesType:
		return "size"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "int"
	case reflect.Float32, reflect.Float64:
		return "float"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.String {
			return "list"
		}
	case reflect.Map:
		if t.Key().Kind() == reflect.String && t.Elem().Kind() == reflect.String {
			return "map"
		}
	}
	return "json"
}

func optionsOf(v any) []Option {
	rv := reflect.ValueOf(v).Elem()
	var out []Option
	for _, f := range optionFields(rv.Type()) {
		out = append(out, Option{Name: f.name, Type: typeName(f.typ), Default: formatDefault(rv.FieldByIndex(f.index)), Range: f.rng, Help: f.help})
	}
	return out
}

func formatDefault(v reflect.Value) string {
	if v.IsZero() {
		return ""
	}
	switch typeName(v.Type()) {
	case "string", "duration", "cpus", "size", "bool", "int", "float":
		return fmt.Sprint(v.Interface())
	case "list":
		return strings.Join(v.Interface().([]string), ",")
	}
	b, _ := json.Marshal(v.Interface())
	return string(b)
}

// decodeOptions sets the options in raw on dst, a pointer to an options
// struct. A string value is parsed as flag text for the field's type; any
// other value must already have the field's JSON type.
func decodeOptions(dst any, raw map[string]any) error {
	rv := reflect.ValueOf(dst).Elem()
	fields := optionFields(rv.Type())
	byName := make(map[string]optionField, len(fields))
	names := make([]string, len(fields))
	for i, f := range fields {
		byName[f.name] = f
		names[i] = f.name
	}
	var es FieldErrors
	for _, key := range sortedKeys(raw) {
		f, ok := byName[key]
		if !ok {
			reason := "unknown option"
			if len(names) > 0 {
				reason += "; known: " + strings.Join(names, ", ")
			}
			es.Add(key, "%s", reason)
			continue
		}
		if err := setOption(rv.FieldByIndex(f.index), raw[key]); err != nil {
			es.Add(key, "%s", err)
		}
	}
	return es.Err()
}

// CheckRanges returns an error for each numeric option of the options
// struct opts points to whose value is outside its declared range (the
// field's `range` tag), naming the option. Definition.Decode checks them
// before the options' Validate; a Validate that constructors call
// directly starts with them.
func CheckRanges(opts any) FieldErrors {
	rv := reflect.ValueOf(opts).Elem()
	var es FieldErrors
	for _, f := range optionFields(rv.Type()) {
		if err := f.checkRange(rv.FieldByIndex(f.index)); err != nil {
			es.Add(f.name, "%s", err)
		}
	}
	return es
}

// numeric reports whether options of type t are numbers, which declare a
// range.
func numeric(t reflect.Type) bool {
	switch typeName(t) {
	case "int", "float", "duration", "cpus", "size":
		return true
	}
	return false
}

// bounds parses f's range tag in the notation of f's type. It panics on a
// tag that does not parse: a declaration the driver's tests find.
func (f optionField) bounds() (lo, hi reflect.Value, ok bool) {
	if f.rng == "" {
		return reflect.Value{}, reflect.Value{}, false
	}
	a, b, found := strings.Cut(f.rng, ",")
	lp, hp := reflect.New(f.typ), reflect.New(f.typ)
	if !found || parseText(lp, strings.TrimSpace(a)) != nil || parseText(hp, strings.TrimSpace(b)) != nil {
		panic(fmt.Sprintf("driver: option %s: range tag %q: want \"min,max\" of %s", f.name, f.rng, typeName(f.typ)))
	}
	return lp.Elem(), hp.Elem(), true
}

// checkRange returns an error when v, of f's field, is outside f's range.
func (f optionField) checkRange(v reflect.Value) error {
	lo, hi, ok := f.bounds()
	if !ok {
		return nil
	}
	var out bool
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		out = v.Int() < lo.Int() || v.Int() > hi.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		out = v.Uint() < lo.Uint() || v.Uint() > hi.Uint()
	case reflect.Float32, reflect.Float64:
		out = !(v.Float() >= lo.Float() && v.Float() <= hi.Float())
	default:
		panic(fmt.Sprintf("driver: option %s: a range on %s", f.name, f.typ))
	}
	if out {
		return fmt.Errorf("%v is out of range [%v, %v]", v.Interface(), lo.Interface(), hi.Interface())
	}
	return nil
}

// CheckOptionRanges reports the numeric options of the options struct v
// points to that declare no range, or whose range does not parse or does
// not hold the default: what a driver's test asserts is empty.
func CheckOptionRanges(v any) (problems []string) {
	rv := reflect.ValueOf(v).Elem()
	for _, f := range optionFields(rv.Type()) {
		if !numeric(f.typ) {
			if f.rng != "" {
				problems = append(problems, fmt.Sprintf("%s: a range on a %s", f.name, typeName(f.typ)))
			}
			continue
		}
		if f.rng == "" {
			problems = append(problems, f.name+": no range tag")
			continue
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					problems = append(problems, fmt.Sprint(r))
				}
			}()
			if err := f.checkRange(rv.FieldByIndex(f.index)); err != nil {
				problems = append(problems, fmt.Sprintf("%s: the default %v", f.name, err))
			}
		}()
	}
	return problems
}

func setOption(field reflect.Value, val any) error {
	t := field.Type()
	ptr := reflect.New(t)
	if s, ok := val.(string); ok {
		if err := parseText(ptr, s); err != nil {
			return err
		}
		field.Set(ptr.Elem())
		return nil
	}
	if t == durationType {
		return fmt.Errorf("want a duration such as \"5s\", got %s", describe(val))
	}
	b, err := json.Marshal(val)
	if err != nil {
		return fmt.Errorf("cannot encode value: %v", err)
	}
	if err := DecodeJSON(b, ptr.Interface(), ""); err != nil {
		return fmt.Errorf("want %s, got %s: %v", typeName(t), describe(val), jsonReason(err))
	}
	field.Set(ptr.Elem())
	return nil
}

// parseText parses flag text s into *ptr.
func parseText(ptr reflect.Value, s string) error {
	t := ptr.Elem().Type()
	want := typeName(t)
	bad := func() error { return fmt.Errorf("want %s, got %q", want, s) }
	switch {
	case t == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("want a duration such as \"5s\", got %q", s)
		}
		ptr.Elem().SetInt(int64(d))
		return nil
	case ptr.Type().Implements(unmarshalerType):
		q, _ := json.Marshal(s)
		if err := json.Unmarshal(q, ptr.Interface()); err != nil {
			return fmt.Errorf("%v", err)
		}
		return nil
	case ptr.Type().Implements(textUnmarshaler):
		return ptr.Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s))
	}
	switch want {
	case "string":
		ptr.Elem().SetString(s)
	case "bool":
		b, err := strconv.ParseBool(s)
		if err != nil {
			return bad()
		}
		ptr.Elem().SetBool(b)
	case "int", "float":
		if err := json.Unmarshal([]byte(strings.TrimSpace(s)), ptr.Interface()); err != nil {
			return bad()
		}
	case "list":
		var items []string
		for item := range strings.SplitSeq(s, ",") {
			if item = strings.TrimSpace(item); item != "" {
				items = append(items, item)
			}
		}
		ptr.Elem().Set(reflect.ValueOf(items).Convert(t))
	case "map":
		m := reflect.MakeMap(t)
		for item := range strings.SplitSeq(s, ",") {
			if item = strings.TrimSpace(item); item == "" {
				continue
			}
			k, v, ok := strings.Cut(item, "=")
			if !ok || k == "" {
				return fmt.Errorf("want key=value pairs separated by commas, got %q", s)
			}
			m.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), reflect.ValueOf(v).Convert(t.Elem()))
		}
		ptr.Elem().Set(m)
	default:
		if err := DecodeJSON([]byte(s), ptr.Interface(), ""); err != nil {
			return fmt.Errorf("want JSON for %s: %v", t, jsonReason(err))
		}
	}
	return nil
}

// jsonReason says what DecodeJSON found wrong, with the path inside the
// value when there is one.
func jsonReason(err error) string {
	var fe *FieldError
	if errors.As(err, &fe) && fe.Path != "" {
		return fe.Path + ": " + fe.Reason
	}
	if fe != nil {
		return fe.Reason
	}
	return err.Error()
}

func describe(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case float64, float32, int, int64, int32, uint64, uint, uint32:
		return fmt.Sprintf("the number %v", v)
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
