package driver_test

import (
	"encoding/json"
	"testing"

	"github.com/berth-dev/berth/driver"
)

func TestMilliCPUJSON(t *testing.T) {
	for _, c := range []struct {
		in   string
		want driver.MilliCPU
		out  string
	}{
		{`0.2`, 200, `0.2`},
		{`"0.2"`, 200, `0.2`},
		{`"200m"`, 200, `0.2`},
		{`4`, 4000, `4`},
		{`"1.5"`, 1500, `1.5`},
		{`0.0004`, 0, `0`},
		{`0.0006`, 1, `0.001`},
		{`-1`, -1000, `-1`},
	} {
		var got driver.MilliCPU
		if err := json.Unmarshal([]byte(c.in), &got); err != nil {
			t.Errorf("Unmarshal %s: %v", c.in, err)
			continue
		}
		if got != c.want {
			t.Errorf("Unmarshal %s = %d, want %d", c.in, got, c.want)
		}
		b, err := json.Marshal(got)
		if err != nil || string(b) != c.out {
			t.Errorf("Marshal %d = %s %v, want %s", got, b, err, c.out)
		}
		var back driver.MilliCPU
		if err := json.Unmarshal(b, &back); err != nil || back != got {
			t.Errorf("round trip of %d: %d %v", got, back, err)
		}
	}
	for _, bad := range []string{`"abc"`, `"1.5x"`, `"m"`, `"12.5m"`, `"NaN"`, `"1e300"`, `true`} {
		var got driver.MilliCPU
		if err := json.Unmarshal([]byte(bad), &got); err == nil {
			t.Errorf("Unmarshal %s = %d, want an error", bad, got)
		}
	}
	if s := driver.MilliCPU(2500).String(); s != "2.5" {
		t.Errorf("String = %q", s)
	}
	if c := driver.MilliCPU(1500).CPUs(); c != 1.5 {
		t.Errorf("CPUs = %v", c)
	}
}

func TestBytesJSON(t *testing.T) {
	for _, c := range []struct {
		in   string
		want driver.Bytes
		out  string
	}{
		{`512`, 512 * driver.MiB, `512`},
		{`0.5`, 512 * driver.KiB, `"524288B"`},
		{`"512Mi"`, 512 * driver.MiB, `512`},
		{`"2GiB"`, 2 * driver.GiB, `2048`},
		{`"1G"`, 1_000_000_000, `"1000000000B"`},
		{`"300MB"`, 300_000_000, `"300000000B"`},
		{`"4096B"`, 4096, `"4096B"`},
		{`"4096"`, 4096 * driver.MiB, `4096`}, // a bare number is MiB, as unquoted
		{`"1.5Ki"`, 1536, `"1536B"`},
		{`"1Ti"`, driver.TiB, `1048576`},
		{`" 3 Mi "`, 3 * driver.MiB, `3`},
	} {
		var got driver.Bytes
		if err := json.Unmarshal([]byte(c.in), &got); err != nil {
			t.Errorf("Unmarshal %s: %v", c.in, err)
			continue
		}
		if got != c.want {
			t.Errorf("Unmarshal %s = %d, want %d", c.in, got, c.want)
		}
		b, err := json.Marshal(got)
		if err != nil || string(b) != c.out {
			t.Errorf("Marshal %d = %s %v, want %s", got, b, err, c.out)
		}
		var back driver.Bytes
		if err := json.Unmarshal(b, &back); err != nil || back != got {
			t.Errorf("round trip of %d: %d %v", got, back, err)
		}
	}
	for _, bad := range []string{`"lots"`, `"12XB"`, `"Mi"`, `1e300`, `"1e300Ti"`, `true`} {
		var got driver.Bytes
		if err := json.Unmarshal([]byte(bad), &got); err == nil {
			t.Errorf("Unmarshal %s = %d, want an error", bad, got)
		}
	}
	for b, want := range map[driver.Bytes]string{0: "0B", 1023: "1023B", driver.KiB: "1Ki", 3 * driver.MiB: "3Mi", 5 * driver.GiB: "5Gi", 2 * driver.TiB: "2Ti"} {
		if got := b.String(); got != want {
			t.Errorf("Bytes(%d).String() = %q, want %q", int64(b), got, want)
		}
	}
}

func TestResourcesArithmetic(t *testing.T) {
	a := driver.Resources{CPU: 500, Memory: driver.GiB, GPUs: 1, Other: map[string]int64{"fpga": 1}}
	b := driver.Resources{CPU: 250, Disk: driver.GiB, Other: map[string]int64{"fpga": 1, "tpu": 2}}
	sum := a.Add(b)
	if sum.CPU != 750 || sum.Memory != driver.GiB || sum.Disk != driver.GiB || sum.GPUs != 1 || sum.Other["fpga"] != 2 || sum.Other["tpu"] != 2 {
		t.Errorf("Add = %+v", sum)
	}
	if back := sum.Sub(b); back.CPU != a.CPU || back.Other["fpga"] != 1 || back.Other["tpu"] != 0 || back.Disk != 0 {
		t.Errorf("Sub = %+v", back)
	}
	if a.Other["fpga"] != 1 || len(a.Other) != 1 {
		t.Errorf("Add changed its receiver's map: %+v", a.Other)
	}
	if !a.Fits(sum) || sum.Fits(a) {
		t.Errorf("Fits: a in sum %v, sum in a %v", a.Fits(sum), sum.Fits(a))
	}
	if (driver.Resources{Other: map[string]int64{"x": 1}}).Fits(driver.Resources{CPU: 1000}) {
		t.Error("a named resource the node lacks fits")
	}
	if !(driver.Resources{Other: map[string]int64{"x": 0}}).IsZero() || a.IsZero() {
		t.Error("IsZero")
	}
}

// TestOutputJSON: what Berth writes for people and programs (answers, event
// streams, --json) holds every size as an integer number of bytes, whatever
// Bytes' own form, and a client reads it back exactly; requests keep their
// lenient forms.
func TestOutputJSON(t *testing.T) {
	spec := driver.Spec{Image: "x", Resources: driver.Resources{CPU: 500, Memory: 64 * driver.MiB, Disk: 1_000_000_000}, MemoryReservation: 1536}
	b, err := driver.MarshalOutput(spec)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"memory": "67108864", "disk": "1000000000", "memory_reservation": "1536", "cpus": "0.5", "image": `"x"`} {
		if got := string(raw[key]); got != want {
			t.Errorf("MarshalOutput: %s = %s, want %s (in %s)", key, got, want, b)
		}
	}
	var back driver.Spec
	if err := driver.UnmarshalOutput(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Memory != spec.Memory || back.Disk != spec.Disk || back.MemoryReservation != spec.MemoryReservation || back.CPU != spec.CPU {
		t.Errorf("UnmarshalOutput(%s) = %+v, want %+v", b, back.Resources, spec.Resources)
	}
	indented, err := driver.MarshalOutputIndent([]driver.Image{{Name: "a", Size: 1023}})
	if err != nil || string(indented) != "[\n  {\n    \"name\": \"a\",\n    \"size\": 1023\n  }\n]" {
		t.Errorf("MarshalOutputIndent = %q %v", indented, err)
	}

	// A client reads keys it does not know (a newer server's) without
	// complaint, and refuses a size that is not an integer of bytes.
	var u driver.Usage
	if err := driver.UnmarshalOutput([]byte(`{"cpus": 0.25, "memory": 4096, "later": 1}`), &u); err != nil || u.Memory != 4096 || u.CPU != 250 {
		t.Errorf("UnmarshalOutput: %+v %v", u, err)
	}
	for _, bad := range []string{`{"memory": "64Mi"}`, `{"memory": 1.5}`, `{"memory": true}`} {
		if err := driver.UnmarshalOutput([]byte(bad), &u); err == nil {
			t.Errorf("UnmarshalOutput(%s): no error", bad)
		}
	}

	// A request still says MiB with a bare number.
	var req driver.Spec
	if err := driver.DecodeJSON([]byte(`{"image": "x", "memory": 64}`), &req, "body"); err != nil || req.Memory != 64*driver.MiB {
		t.Errorf("DecodeJSON: memory %d %v, want 64 MiB", req.Memory, err)
	}
}
