// Package vm is a Berth driver for virtual machines on libvirt/QEMU hosts.
//
// Each node is one libvirt daemon, reached over its unix socket
// (qemu:///system at /var/run/libvirt/libvirt-sock, or another socket
// path), through sshd (qemu+ssh, the daemon's socket on the host by
// stream-local forwarding, the host's key checked), over TLS (qemu+tls) or
// plain TCP (qemu+tcp, for tests). Two nodes may reach one daemon: a
// domain's metadata names its node, and each node sees only its own. An instance is one libvirt domain whose XML <metadata> holds
// Berth's tags, the instance's name and what it was given; nothing else is
// kept, so Get, Find and List (and leak cleanup) read everything from
// libvirt and a domain without that metadata is never touched.
//
// # Images and disks
//
// An image is a name registered in the options, not something pulled: a
// qcow2 or raw disk file, or a kernel and an initrd booted directly (with
// an optional disk beside them), with paths that may differ per node. A
// guest boots from a qcow2 copy-on-write overlay of the image's disk
// (qemu-img create -b), made in the instance's own directory under
// storage_dir, so the image is never written. The storage directory and the
// images must be readable by the QEMU user of the host, and the driver
// must run on the host itself (it writes the overlays and drives there).
//
// # Config drive
//
// Every guest gets a second disk: a FAT image labelled CIDATA, written in
// Go, in the NoCloud layout that cloud-init reads: meta-data (instance id,
// host name, the SSH keys as public-keys), user-data (Spec.UserData as
// given) and vendor-data (a #cloud-config with write_files for the config
// files). For guests without cloud-init the config files are also there as
// file-0 ... file-4 with a manifest, berth-files, of lines "mode name
// path".
//
// # Console, logs and readiness
//
// The domain has three serial ports, each written to a file in the
// instance's directory: ttyS0 is the console (console.log), ttyS1 the
// workload's standard output (stdout.log) and ttyS2 its standard error
// (stderr.log). A create is done when the guest writes the ready line
// (option ready_line, "ready" by default) alone on a line of its console.
// Logs reads ttyS1 and ttyS2, Console reads ttyS0. Stop presses the ACPI
// power button and forces the power off after the grace period. Resize
// moves a guest's memory within memory_headroom through its balloon and
// plugs vCPUs in or out within cpu_headroom.
//
// # Errors
//
//   - an image that is not registered, or whose files are missing on the
//     node: ErrPermanent, naming the image and the node;
//   - a libvirt daemon that cannot be reached: ErrRetryable (the node is
//     offline in State); a connection lost during a call: ErrTimeout;
//   - a node whose memory or CPUs are all given to domains, or a QEMU that
//     cannot allocate the guest's memory: ErrInsufficientCapacity;
//   - a domain name taken: ErrAlreadyExists; an unknown domain:
//     ErrNotFound;
//   - a guest that stops before it is ready: ErrPermanent, with the last
//     lines of its console.
//
// With user-mode networking (option network: user) the spec's ports are
// forwarded from the host by QEMU. Security groups, ports on other
// networks, volumes, GPUs, users, restart policies, entry points, commands
// and environment variables are refused at CheckSpec: a VM runs its
// image's own init, and user data is how it is told what to do.
package vm
