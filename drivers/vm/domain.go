package vm

import (
	"encoding/xml"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/berth-dev/berth/driver"
)

// metaNS is the namespace of Berth's element in a domain's <metadata>.
const metaNS = "https://berth.dev/xmlns/vm/1"

// meta is what a domain's metadata records: enough to answer Get and List
// and to remove every file the create made, with nothing kept elsewhere.
type meta struct {
	XMLName xml.Name `xml:"instance"`
	NS      string   `xml:"xmlns,attr,omitempty"`
	// Node is the Berth node that made the domain: when two nodes reach
	// one daemon (two transports to one host), each lists only its own.
	Node    string `xml:"node,omitempty"`
	Name    string `xml:"name"`
	Image   string `xml:"image"`
	Created string `xml:"created"`
	CPU     int64  `xml:"cpus"`   // milli-CPUs
	Memory  int64  `xml:"memory"` // bytes
	Disk    int64  `xml:"disk,omitempty"`
	// Dir is the storage directory on the node: every file the create
	// made is there, named after the domain's UUID.
	Dir    string `xml:"dir"`
	Tags   []kv   `xml:"tag"`
	Labels []kv   `xml:"label"`
	// Ports are the guest's ports forwarded from the host.
	Ports []portXML `xml:"port"`
}

type portXML struct {
	Proto  string `xml:"proto,attr"`
	HostIP string `xml:"host_ip,attr,omitempty"`
	Host   int    `xml:"host,attr"`
	Guest  int    `xml:"guest,attr"`
}

type kv struct {
	Key   string `xml:"key,attr"`
	Value string `xml:"value,attr"`
}

func toKV(m map[string]string) []kv {
	out := make([]kv, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, kv{k, m[k]})
	}
	return out
}

func fromKV(l []kv) map[string]string {
	if len(l) == 0 {
		return nil
	}
	m := make(map[string]string, len(l))
	for _, e := range l {
		m[e.Key] = e.Value
	}
	return m
}

func (m *meta) resources() driver.Resources {
	return driver.Resources{CPU: driver.MilliCPU(m.CPU), Memory: driver.Bytes(m.Memory), Disk: driver.Bytes(m.Disk)}
}

// readMeta returns the Berth metadata of dom; a domain without it gives
// an error (libvirt's ErrNoDomainMetadata).
func readMeta(lv *libvirt.Libvirt, dom libvirt.Domain) (*meta, error) {
	s, err := lv.DomainGetMetadata(dom, int32(libvirt.DomainMetadataElement), libvirt.OptString{metaNS}, 0)
	if err != nil {
		return nil, err
	}
	var m meta
	if err := xml.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("metadata of domain %s: %w", dom.Name, err)
	}
	return &m, nil
}

// nodeMeta returns the Berth metadata of dom when n made it; a domain of
// another node, or without Berth's metadata, is ErrNoDomain: not an
// instance of n.
func nodeMeta(lv *libvirt.Libvirt, n *node, dom libvirt.Domain) (*meta, error) {
	m, err := readMeta(lv, dom)
	var le libvirt.Error
	if errors.As(err, &le) && libvirt.ErrorNumber(le.Code) == libvirt.ErrNoDomainMetadata {
		return nil, libvirt.Error{Code: uint32(libvirt.ErrNoDomain), Message: "not a Berth domain"}
	}
	if err != nil {
		return nil, err
	}
	if !n.owns(m) {
		return nil, libvirt.Error{Code: uint32(libvirt.ErrNoDomain), Message: fmt.Sprintf("a domain of node %s", m.Node)}
	}
	return m, nil
}

// owns reports whether m is of a domain n made. Metadata without a node
// (written before domains recorded theirs) is every node's.
func (n *node) owns(m *meta) bool { return m.Node == "" || m.Node == n.cfg.Name }

// Files of an instance's directory.
const (
	rootDisk    = "root.qcow2"
	configDrive = "config.img"
	consoleLog  = "console.log"
	stdoutLog   = "stdout.log"
	stderrLog   = "stderr.log"
)

// instanceFiles are every file a guest may have.
var instanceFiles = []string{rootDisk, configDrive, consoleLog, stdoutLog, stderrLog}

// plan is everything a create needs, worked out before it starts.
type plan struct {
	uuid    libvirt.UUID
	domName string
	node    *node
	files   ImageFiles
	image   Image
	vcpus   uint
	meta    meta
	spec    *driver.Spec
}

func (p *plan) path(file string) string { return instanceFile(p.meta.Dir, p.uuid, file) }

// instanceFile is the path of a file of guest uuid in the storage
// directory dir: <dir>/<uuid>.<file>.
func instanceFile(dir string, uuid libvirt.UUID, file string) string {
	return filepath.Join(dir, uuidString(uuid)+"."+file)
}

// hasRoot reports whether the guest has a root disk: an overlay of the
// image's disk, or an empty disk when a kernel image is given a size.
func (p *plan) hasRoot() bool { return p.files.Disk != "" || p.meta.Disk > 0 }

// domainXML is the domain of p: direct kernel boot or a boot disk, the
// overlay, the config drive, three serial ports written to files and the
// network of the options.
func (d *Driver) domainXML(p *plan) (string, error) {
	m := p.meta
	m.NS = metaNS
	mx, err := xml.Marshal(m)
	if err != nil {
		return "", err
	}
	dom := &libvirtxml.Domain{
		Type:          d.opts.DomainType,
		Name:          p.domName,
		UUID:          uuidString(p.uuid),
		Metadata:      &libvirtxml.DomainMetadata{XML: string(mx)},
		Memory:        &libvirtxml.DomainMemory{Value: uint(float64(m.Memory) * d.opts.MemoryHeadroom / 1024), Unit: "KiB"},
		CurrentMemory: &libvirtxml.DomainCurrentMemory{Value: uint(m.Memory / 1024), Unit: "KiB"},
		VCPU:          &libvirtxml.DomainVCPU{Value: d.maxVCPUs(p.vcpus), Current: p.vcpus},
		OS: &libvirtxml.DomainOS{
			Type: &libvirtxml.DomainOSType{Type: "hvm", Arch: "x86_64", Machine: d.opts.Machine},
		},
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices:    &libvirtxml.DomainDeviceList{Emulator: d.opts.Emulator},
	}
	if p.files.Kernel != "" {
		dom.OS.Kernel = p.files.Kernel
		dom.OS.Initrd = p.files.Initrd
		dom.OS.Cmdline = p.image.Cmdline
	} else {
		dom.OS.BootDevices = []libvirtxml.DomainBootDevice{{Dev: "hd"}}
	}
	dev := dom.Devices
	next := 'a'
	disk := func(file, format string, readOnly bool) {
		dd := libvirtxml.DomainDisk{
			Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: file}},
			Target: &libvirtxml.DomainDiskTarget{Dev: "vd" + string(next), Bus: "virtio"},
		}
		if readOnly {
			dd.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
		}
		dev.Disks = append(dev.Disks, dd)
		next++
	}
	if p.hasRoot() {
		disk(p.path(rootDisk), "qcow2", false)
	}
	disk(p.path(configDrive), "raw", true)
	for i, f := range []string{consoleLog, stdoutLog, stderrLog} {
		port := uint(i)
		dev.Serials = append(dev.Serials, libvirtxml.DomainSerial{
			Source: &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: p.path(f), Append: "on"}},
			Target: &libvirtxml.DomainSerialTarget{Port: &port},
		})
	}
	switch d.opts.Network {
	case "none":
	case "user":
		if len(m.Ports) > 0 {
			// libvirt's user-mode interface forwards no ports (only its
			// passt back-end does), so QEMU's own is set up directly,
			// in a PCI slot far above those libvirt gives out.
			netdev := "user,id=berthnet0"
			for _, pt := range m.Ports {
				netdev += fmt.Sprintf(",hostfwd=%s:%s:%d-:%d", pt.Proto, pt.HostIP, pt.Host, pt.Guest)
			}
			dom.QEMUCommandline = &libvirtxml.DomainQEMUCommandline{Args: []libvirtxml.DomainQEMUCommandlineArg{
				{Value: "-netdev"}, {Value: netdev}, {Value: "-device"}, {Value: "virtio-net-pci,netdev=berthnet0,bus=pci.0,addr=0x1e"},
			}}
			break
		}
		dev.Interfaces = append(dev.Interfaces, libvirtxml.DomainInterface{
			Source: &libvirtxml.DomainInterfaceSource{User: &libvirtxml.DomainInterfaceSourceUser{}},
			Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
		})
	default:
		dev.Interfaces = append(dev.Interfaces, libvirtxml.DomainInterface{
			Source: &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: d.opts.Network}},
			Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
		})
	}
	// A guest resized within its headroom gives memory back through its
	// balloon.
	dev.MemBalloon = &libvirtxml.DomainMemBalloon{Model: "none"}
	if d.opts.MemoryHeadroom > 1 {
		dev.MemBalloon = &libvirtxml.DomainMemBalloon{Model: "virtio"}
	}
	return dom.Marshal()
}

// maxVCPUs is the most vCPUs a guest created with vcpus may have: the
// domain is defined with them, all but vcpus unplugged.
func (d *Driver) maxVCPUs(vcpus uint) uint {
	return uint(math.Ceil(float64(vcpus) * d.opts.CPUHeadroom))
}

// vcpusOf is how many vCPUs a guest given cpu has.
func vcpusOf(cpu driver.MilliCPU) uint { return uint((cpu + 999) / 1000) }

func uuidString(u libvirt.UUID) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

func parseUUID(s string) (libvirt.UUID, bool) {
	var u libvirt.UUID
	h := strings.ReplaceAll(s, "-", "")
	if len(h) != 32 || len(s) != 36 {
		return u, false
	}
	for i := range 16 {
		var b byte
		if _, err := fmt.Sscanf(h[2*i:2*i+2], "%02x", &b); err != nil {
			return u, false
		}
		u[i] = b
	}
	return u, true
}

// instanceOf builds the instance of a Berth domain.
func instanceOf(n *node, dom libvirt.Domain, m *meta, state int32, reason int32) *driver.Instance {
	inst := &driver.Instance{
		ID:        n.cfg.Name + "/" + uuidString(dom.UUID),
		Name:      m.Name,
		Node:      n.cfg.Name,
		Kind:      driver.KindVM,
		Image:     m.Image,
		Resources: m.resources(),
		Labels:    fromKV(m.Labels),
		Tags:      fromKV(m.Tags),
	}
	for _, pt := range m.Ports {
		inst.Ports = append(inst.Ports, driver.PortMapping{ContainerPort: pt.Guest, HostPort: pt.Host, Protocol: pt.Proto, HostIP: pt.HostIP})
	}
	inst.Created, _ = time.Parse(time.RFC3339Nano, m.Created)
	inst.State, inst.RawState = mapState(libvirt.DomainState(state), reason)
	return inst
}

// mapState maps a domain's state and reason.
func mapState(st libvirt.DomainState, reason int32) (driver.State, string) {
	switch st {
	case libvirt.DomainRunning:
		return driver.StateRunning, "running"
	case libvirt.DomainPaused, libvirt.DomainPmsuspended:
		return driver.StateSuspended, "paused"
	case libvirt.DomainShutdown:
		return driver.StateRunning, "shutting down"
	case libvirt.DomainShutoff:
		switch libvirt.DomainShutoffReason(reason) {
		case libvirt.DomainShutoffShutdown:
			return driver.StateExited, "shut off: shutdown"
		case libvirt.DomainShutoffCrashed, libvirt.DomainShutoffFailed:
			return driver.StateFailed, "shut off: crashed or failed"
		case libvirt.DomainShutoffUnknown:
			return driver.StateCreating, "defined"
		}
		return driver.StateStopped, "shut off"
	case libvirt.DomainCrashed:
		return driver.StateFailed, "crashed"
	}
	return driver.StateUnknown, fmt.Sprintf("state %d", st)
}
