package scheduler

import "testing"

func TestParseExpr(t *testing.T) {
	tests := []struct {
		in             string
		key, value     string
		negate, soft   bool
		match, nomatch string
		wantErr        bool
	}{
		{in: "disk==ssd", key: "disk", value: "ssd", match: "ssd", nomatch: "ssd2"},
		{in: "zone!=eu-1", key: "zone", value: "eu-1", negate: true, match: "eu-1", nomatch: "eu-2"},
		{in: "node==web*", key: "node", value: "web*", match: "web-12", nomatch: "db-1"},
		{in: "node==web?", key: "node", value: "web?", match: "web1", nomatch: "web12"},
		{in: "rack==r[12]", key: "rack", value: "r[12]", match: "r2", nomatch: "r3"},
		{in: "os==/lin.*/", key: "os", value: "/lin.*/", match: "linux", nomatch: "darwin-linux"},
		{in: "disk==~ssd", key: "disk", value: "ssd", soft: true, match: "ssd", nomatch: "hdd"},
		{in: "zone!=~eu-*", key: "zone", value: "eu-*", negate: true, soft: true, match: "eu-9", nomatch: "us-1"},
		{in: " disk == ssd ", key: "disk", value: "ssd", match: "ssd", nomatch: "hdd"},
		{in: "image==a.b/c", key: "image", value: "a.b/c", match: "a.b/c", nomatch: "axb/c"},
		{in: "disk", wantErr: true},
		{in: "==ssd", wantErr: true},
		{in: "os==/lin(/", wantErr: true},
		{in: "rack==r[1", wantErr: true},
		{in: "a b==c", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			e, err := ParseExpr(tt.in)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ParseExpr(%q) = %+v, want an error", tt.in, e)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.Key != tt.key || e.Value != tt.value || e.Negate != tt.negate || e.Soft != tt.soft {
				t.Fatalf("got key %q value %q negate %v soft %v", e.Key, e.Value, e.Negate, e.Soft)
			}
			if !e.MatchValue(tt.match) {
				t.Errorf("%q does not match %q", tt.in, tt.match)
			}
			if e.MatchValue(tt.nomatch) {
				t.Errorf("%q matches %q", tt.in, tt.nomatch)
			}
		})
	}
}
