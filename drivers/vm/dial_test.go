package vm

import "testing"

func TestParseURI(t *testing.T) {
	good := map[string]target{
		"qemu:///system":                    {transport: transportUnix, remote: "qemu:///system"},
		"qemu+unix:///session":              {transport: transportUnix, remote: "qemu:///session"},
		"qemu+ssh://admin@kvm1/system":      {transport: transportSSH, user: "admin", host: "kvm1:22", remote: "qemu:///system"},
		"qemu+ssh://[::1]:2222/system":      {transport: transportSSH, host: "[::1]:2222", remote: "qemu:///system"},
		"qemu+tls://kvm2.example/system":    {transport: transportTLS, host: "kvm2.example:16514", remote: "qemu:///system"},
		"qemu+tcp://127.0.0.1:16600/system": {transport: transportTCP, host: "127.0.0.1:16600", remote: "qemu:///system"},
	}
	for uri, want := range good {
		got, err := parseURI(uri)
		if err != nil || got != want {
			t.Errorf("parseURI(%q) = %+v, %v; want %+v", uri, got, err, want)
		}
	}
	for _, uri := range []string{
		"xen:///system", "qemu:///", "qemu://host/system", "qemu+ssh:///system", "qemu+ssh://u:pw@h/system",
		"qemu+tls://u@h/system", "qemu+ssh://h/system?keyfile=/k", "qemu+tcp://h:99999/system", "qemu+ssh://h/system#x",
	} {
		if _, err := parseURI(uri); err == nil {
			t.Errorf("parseURI(%q) accepted", uri)
		}
	}
}
