package driver

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// MilliCPU is an amount of processor time in thousandths of a CPU. Fractions
// of a CPU are exact: 0.2 cpus is MilliCPU(200).
//
// In JSON it is written as a number of CPUs (0.2). It is read from a number
// or from a string holding a number of CPUs ("0.2", Citadel's form) or of
// millicores ("200m").
type MilliCPU int64

// CPUs returns c as a number of CPUs.
func (c MilliCPU) CPUs() float64 { return float64(c) / 1000 }

// CPUs converts a number of CPUs to MilliCPU, rounding to the nearest milli.
func CPUs(n float64) MilliCPU { return MilliCPU(math.Round(n * 1000)) }

func (c MilliCPU) String() string { return strconv.FormatFloat(c.CPUs(), 'f', -1, 64) }

// MarshalJSON writes c as a number of CPUs.
func (c MilliCPU) MarshalJSON() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalJSON reads a number of CPUs, a quoted number, or "<n>m".
func (c *MilliCPU) UnmarshalJSON(b []byte) error {
	s := string(b)
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	v, err := ParseCPU(s)
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// ParseCPU reads "0.5" (cpus) or "500m" (millicores).
func ParseCPU(s string) (MilliCPU, error) {
	s = strings.TrimSpace(s)
	if m, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpus %q: want a number of cpus (0.5) or millicores (500m)", s)
		}
		return MilliCPU(n), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("cpus %q: want a number of cpus (0.5) or millicores (500m)", s)
	}
	if f > math.MaxInt64/1000 || f < math.MinInt64/1000 {
		return 0, fmt.Errorf("cpus %q: out of range", s)
	}
	return CPUs(f), nil
}

// Bytes is an amount of memory or disk in bytes.
//
// What people write is lenient: a plain number means mebibytes (Citadel's
// "memory": 512, a flag --memory 512, the string "512"); a unit says
// otherwise: "512Mi", "2GiB", "1G", "300MB", "4096B". What Berth answers is
// exact: MarshalOutput writes an integer number of bytes. Its own
// MarshalJSON, the form of requests the client sends and of stored records,
// writes a number of MiB when it is a whole number of MiB, otherwise "<n>B".
type Bytes int64

// Common sizes.
const (
	KiB Bytes = 1 << 10
	MiB Bytes = 1 << 20
	GiB Bytes = 1 << 30
	TiB Bytes = 1 << 40
)

func (b Bytes) String() string {
	switch {
	case b != 0 && b%TiB == 0:
		return strconv.FormatInt(int64(b/TiB), 10) + "Ti"
	case b != 0 && b%GiB == 0:
		return strconv.FormatInt(int64(b/GiB), 10) + "Gi"
	case b != 0 && b%MiB == 0:
		return strconv.FormatInt(int64(b/MiB), 10) + "Mi"
	case b != 0 && b%KiB == 0:
		return strconv.FormatInt(int64(b/KiB), 10) + "Ki"
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// Human writes a size for people: in the largest binary unit it reaches,
// with at most one decimal ("23.5Gi", "512Mi", "0B"). String and JSON keep
// the exact value.
func (b Bytes) Human() string {
	units := []struct {
		size Bytes
		name string
	}{{TiB, "Ti"}, {GiB, "Gi"}, {MiB, "Mi"}, {KiB, "Ki"}}
	for _, u := range units {
		if b >= u.size || -b >= u.size {
			return strconv.FormatFloat(math.Round(float64(b)/float64(u.size)*10)/10, 'f', -1, 64) + u.name
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// MarshalJSON writes whole MiB as a number and anything else as "<n>B".
func (b Bytes) MarshalJSON() ([]byte, error) {
	if b%MiB == 0 {
		return []byte(strconv.FormatInt(int64(b/MiB), 10)), nil
	}
	return []byte(`"` + strconv.FormatInt(int64(b), 10) + `B"`), nil
}

// UnmarshalJSON reads a number of MiB or a string with a unit.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	s := string(data)
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		v, err := ParseBytes(s)
		if err != nil {
			return err
		}
		*b = v
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > float64(math.MaxInt64/MiB) {
		return fmt.Errorf("size %s: want a number of MiB or a string such as \"512Mi\"", s)
	}
	*b = Bytes(math.Round(f * float64(MiB)))
	return nil
}

var byteUnits = []struct {
	suffix string
	mult   Bytes
}{
	{"KiB", KiB}, {"MiB", MiB}, {"GiB", GiB}, {"TiB", TiB},
	{"Ki", KiB}, {"Mi", MiB}, {"Gi", GiB}, {"Ti", TiB},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"TB", 1000 * 1000 * 1000 * 1000},
	{"K", 1000}, {"M", 1000 * 1000}, {"G", 1000 * 1000 * 1000}, {"T", 1000 * 1000 * 1000 * 1000},
	{"B", 1},
}

// ParseBytes reads a size with a unit: B, K/KB (1000), Ki/KiB (1024), and so
// on up to T. A bare number is MiB, as in JSON.
func ParseBytes(s string) (Bytes, error) {
	t := strings.TrimSpace(s)
	mult := MiB
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("size %q: want a number with a unit such as 512Mi, 2GiB or 1G", s)
	}
	v := f * float64(mult)
	if math.Abs(v) > math.MaxInt64 {
		return 0, fmt.Errorf("size %q: out of range", s)
	}
	return Bytes(math.Round(v)), nil
}
