package vm

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
)

// DefaultSocket is the socket of the system libvirt daemon.
const DefaultSocket = "/var/run/libvirt/libvirt-sock"

// Options configure the driver.
type Options struct {
	Nodes      []NodeConfig      `option:"nodes" help:"the libvirt hosts as JSON: [{name, uri, socket, ssh_key, known_hosts, tls_dir}]; uri is qemu:///system (default), qemu+ssh://user@host/system, qemu+tls://host/system or qemu+tcp://host/system; socket the daemon's unix socket, here or on the ssh host (default /var/run/libvirt/libvirt-sock); tls_dir the directory of cacert.pem, clientcert.pem and clientkey.pem for qemu+tls (default libvirt's, /etc/pki/CA and /etc/pki/libvirt)"`
	StorageDir string            `option:"storage_dir" help:"directory for each instance's overlay, config drive and serial logs; must be readable by the QEMU user"`
	Flavors    map[string]Flavor `option:"flavors" help:"named sizes as JSON: {name: {cpus, memory, disk}}"`
	Images     map[string]Image  `option:"images" help:"registered images as JSON: {name: {disk, format, kernel, initrd, cmdline, nodes: {node: {disk, kernel, initrd}}}}"`
	Network    string            `option:"network" help:"guest network: user (QEMU user-mode networking), none, or the name of a libvirt network"`
	ReadyLine  string            `option:"ready_line" help:"the console line by which a guest says it is ready"`
	// BootTimeout bounds the wait for the ready line.
	BootTimeout time.Duration `option:"boot_timeout" range:"1ms,24h" help:"how long a guest may take to write its ready line"`
	CallTimeout time.Duration `option:"call_timeout" range:"1ms,1h" help:"bound of each libvirt call and qemu-img run"`
	// CPUOvercommit multiplies each host's CPUs in its capacity.
	CPUOvercommit float64 `option:"cpu_overcommit" range:"1,64" help:"host CPUs are counted this many times in capacity"`
	// MemoryHeadroom sizes a guest's maximum memory for Resize.
	MemoryHeadroom float64 `option:"memory_headroom" range:"1,16" help:"a guest's memory may be resized up to this many times what it was created with (above 1 the guest needs a virtio balloon driver)"`
	// CPUHeadroom sizes a guest's maximum vCPUs for Resize.
	CPUHeadroom float64 `option:"cpu_headroom" range:"1,16" help:"a guest's vCPUs may be raised (hot-plugged) up to this many times what it was created with, rounded up (the guest must bring the new CPUs online)"`
	// Machine and Emulator are passed to the domain XML when set.
	Machine  string `option:"machine" help:"QEMU machine type (default: libvirt's)"`
	Emulator string `option:"emulator" help:"path of the QEMU binary (default: libvirt's)"`
	// DomainType is "kvm" or "qemu" (TCG, no hardware virtualization).
	DomainType string `option:"domain_type" help:"libvirt domain type: kvm, or qemu for software emulation"`
}

// NodeConfig is one libvirt host.
type NodeConfig struct {
	Name string `json:"name"`
	// URI is qemu:///system (the default, over the unix socket Socket),
	// qemu+ssh://[user@]host[:port]/system (Socket on that host, through
	// sshd), qemu+tls://host[:port]/system or qemu+tcp://host[:port]/system
	// (no authentication nor encryption: for tests).
	URI string `json:"uri,omitempty"`
	// Socket is the daemon's unix socket, on this host or on the ssh host.
	Socket string `json:"socket,omitempty"`
	// SSHKey is the private key of qemu+ssh (default ~/.ssh/id_ed25519,
	// id_ecdsa or id_rsa); KnownHosts the file the host's key must be in
	// (default ~/.ssh/known_hosts): an unknown host is refused.
	SSHKey     string `json:"ssh_key,omitempty"`
	KnownHosts string `json:"known_hosts,omitempty"`
	// TLSDir holds cacert.pem, clientcert.pem and clientkey.pem for
	// qemu+tls (default /etc/pki/libvirt, with the CA in /etc/pki/CA as
	// libvirt keeps them when TLSDir is not set).
	TLSDir string `json:"tls_dir,omitempty"`
}

// Flavor is a named size.
type Flavor struct {
	CPU    driver.MilliCPU `json:"cpus"`
	Memory driver.Bytes    `json:"memory"`
	Disk   driver.Bytes    `json:"disk,omitempty"`
}

// ImageFiles are the files of an image on one node.
type ImageFiles struct {
	// Disk is a qcow2 or raw disk file; the guest boots from an overlay of
	// it.
	Disk string `json:"disk,omitempty"`
	// Format is the disk's format: qcow2 (default) or raw.
	Format string `json:"format,omitempty"`
	// Kernel and Initrd boot the guest directly, without a boot loader.
	Kernel string `json:"kernel,omitempty"`
	Initrd string `json:"initrd,omitempty"`
}

// Image is a registered image: its files, the same on every node unless
// Nodes gives a node its own.
type Image struct {
	ImageFiles
	// Cmdline is the kernel's command line for a direct kernel boot.
	Cmdline string `json:"cmdline,omitempty"`
	// Nodes overrides the files per node.
	Nodes map[string]ImageFiles `json:"nodes,omitempty"`
}

// files returns the image's files on node.
func (im Image) files(node string) ImageFiles {
	if f, ok := im.Nodes[node]; ok {
		if f.Format == "" {
			f.Format = im.Format
		}
		return f
	}
	return im.ImageFiles
}

// DefaultOptions returns the defaults: the local system daemon, user-mode
// networking, guests ready when they write "ready".
func DefaultOptions() *Options {
	return &Options{
		Nodes:          []NodeConfig{{Name: "local", URI: "qemu:///system", Socket: DefaultSocket}},
		StorageDir:     "/var/lib/berth/vm",
		Network:        "user",
		ReadyLine:      "ready",
		BootTimeout:    5 * time.Minute,
		CallTimeout:    time.Minute,
		CPUOvercommit:  1,
		DomainType:     "kvm",
		MemoryHeadroom: 1,
		CPUHeadroom:    1,
	}
}

// Validate checks what types cannot; every error names its key.
func (o *Options) Validate() error {
	es := driver.CheckRanges(o)
	if len(o.Nodes) == 0 {
		es.Add("nodes", "at least one libvirt host is needed")
	}
	seen := map[string]bool{}
	for i, n := range o.Nodes {
		f := fmt.Sprintf("nodes[%d].", i)
		if fe := driver.CheckName(f+"name", n.Name, driver.MaxNameLength); fe != nil {
			es = append(es, fe)
		} else if seen[n.Name] {
			es.Add(f+"name", "%q appears twice", n.Name)
		}
		seen[n.Name] = true
		t := target{transport: transportUnix}
		if n.URI != "" {
			var err error
			if t, err = parseURI(n.URI); err != nil {
				es.Add(f+"uri", "%q: %v", n.URI, err)
			}
		}
		for _, p := range []struct{ key, path, transport string }{
			{"socket", n.Socket, ""}, {"ssh_key", n.SSHKey, transportSSH}, {"known_hosts", n.KnownHosts, transportSSH}, {"tls_dir", n.TLSDir, transportTLS},
		} {
			switch {
			case p.path == "":
			case !filepath.IsAbs(p.path):
				es.Add(f+p.key, "%q: must be an absolute path", p.path)
			case p.transport != "" && p.transport != t.transport:
				es.Add(f+p.key, "is read only with qemu+%s URIs", p.transport)
			case p.transport == "" && t.transport != transportUnix && t.transport != transportSSH:
				es.Add(f+p.key, "is read only with qemu+unix and qemu+ssh URIs")
			}
		}
	}
	if !filepath.IsAbs(o.StorageDir) {
		es.Add("storage_dir", "%q: must be an absolute path", o.StorageDir)
	}
	for name, fl := range o.Flavors {
		if fe := driver.CheckName("flavors", name, driver.MaxNameLength); fe != nil {
			es = append(es, fe)
		}
		if fl.CPU <= 0 || fl.Memory <= 0 || fl.Disk < 0 {
			es.Add("flavors."+name, "needs cpus and memory above 0 and a disk not below 0")
		}
	}
	for _, name := range sortedKeys(o.Images) {
		im := o.Images[name]
		f := "images." + name
		if name == "" || strings.ContainsAny(name, " \t\n") {
			es.Add("images", "%q: not an image name", name)
		}
		for _, node := range sortedKeys(im.Nodes) {
			if !seen[node] {
				es.Add(f+".nodes."+node, "no such node")
			}
		}
		all := []ImageFiles{im.ImageFiles}
		for _, node := range sortedKeys(im.Nodes) {
			all = append(all, im.files(node))
		}
		for _, files := range all {
			checkFiles(&es, f, files)
		}
	}
	switch o.Network {
	case "user", "none":
	default:
		if fe := driver.CheckName("network", o.Network, 255); fe != nil {
			es.Add("network", "%q: want user, none or a libvirt network's name", o.Network)
		}
	}
	if strings.TrimSpace(o.ReadyLine) == "" || strings.ContainsAny(o.ReadyLine, "\r\n") {
		es.Add("ready_line", "%q: want one non-empty line", o.ReadyLine)
	}
	if o.DomainType != "kvm" && o.DomainType != "qemu" {
		es.Add("domain_type", "%q: want kvm or qemu", o.DomainType)
	}
	return es.Err()
}

func checkFiles(es *driver.FieldErrors, f string, files ImageFiles) {
	if files.Disk == "" && files.Kernel == "" {
		es.Add(f, "needs a disk or a kernel")
	}
	for _, p := range []struct{ key, path string }{{"disk", files.Disk}, {"kernel", files.Kernel}, {"initrd", files.Initrd}} {
		if p.path != "" && !filepath.IsAbs(p.path) {
			es.Add(f+"."+p.key, "%q: must be an absolute path", p.path)
		}
	}
	if files.Initrd != "" && files.Kernel == "" {
		es.Add(f+".initrd", "needs a kernel")
	}
	switch files.Format {
	case "", "qcow2", "raw":
	default:
		es.Add(f+".format", "%q: want qcow2 or raw", files.Format)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
