// Package local is Berth's "local" back-end: instances are OS processes on
// this host, which is shown as one node. Importing the package registers the
// driver under the name "local".
//
// # The node
//
// The node is named by the node_name option (default: the host name). Its
// capacity is runtime.NumCPU() cpus, MemTotal from /proc/meminfo and the
// size of the file system holding data_dir. Reserved is the sum of the
// resources asked for by instances that are creating, running, suspended or
// being deleted; InUse is the host's measured use (busy CPU time from
// /proc/stat since the previous State, MemTotal - MemAvailable).
//
// # Specs
//
// The kind must be "process". Container, vm and baremetal give
// ErrUnsupported, and so does an empty kind, which means container in the
// contract; Berth's CLI sends kind process for a run without an image.
// The command line is Entrypoint followed by Command; when Entrypoint is
// empty, Image (if set) names the executable and Command holds its
// arguments. A name without a slash is looked up in the process's PATH.
// An executable that is missing makes the create operation fail with
// ErrPermanent, naming it.
//
// A process runs as the spec's user and group. One naming no user runs as
// the server, or, when the server runs as root, as the default_user option
// (an unprivileged user), else as root when allow_root is set; root itself
// (named, or implied) is refused at submit without allow_root.
//
// The environment is PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:
// /sbin:/bin) and HOME (Berth's own), then the spec's Env over them, then
// Berth's variables over both:
//
//	BERTH_INSTANCE_ID     the instance id
//	BERTH_INSTANCE_NAME   the name, when the spec has one
//	BERTH_ROOT            the instance directory (see below)
//	BERTH_CONFIG_DIR      <instance dir>/files, when there are config files
//	BERTH_USER_DATA_FILE  <instance dir>/user-data, when there is user data
//	BERTH_PORT_<port>     the host port chosen for container port <port>
//	                      (BERTH_PORT_<port>_UDP for udp)
//	PORT                  the host port of the first port
//
// A config file with path /etc/app.conf is written to
// $BERTH_CONFIG_DIR/etc/app.conf, never to the host's /etc. The working
// directory is WorkingDir, which must exist, or else <instance dir>/work.
// Stdin is /dev/null.
//
// Processes use the host's network, so a port's host port is the port the
// process must listen on: a fixed HostPort must be free (else
// ErrInsufficientCapacity); HostPort 0 picks a free port. Both are checked by
// binding them for a moment, so another program may still take the port
// before the process does. Instance.Ports reports the mapping.
//
// Volumes, networks, a network mode other than host, hostname, domainname,
// cpuset, flavor, sctp ports and restart policies other than "no" give
// ErrUnsupported: a plain process cannot honour them. SSH keys and security
// groups are ignored. Resources larger than the node give
// ErrInsufficientCapacity.
//
// # Records and restarts
//
// Every instance has a directory <data_dir>/instances/<id>/ holding
// record.json, stdout.log and stderr.log (and files/, user-data, work/).
// The record holds the spec, the tags (always with berth.managed=true), the
// pid, the process's start time from /proc/<pid>/stat with the boot id, the
// phase and the exit code. It is written, by atomic rename after fsync,
// before the process starts and after every change, so a driver opened later
// on the same data_dir (a restarted Berth) lists every instance again. A pid
// counts as the instance's process only while its start time and the boot
// id match, so a recycled pid is never mistaken for it, nor signalled. A
// process started by a Berth that stopped before recording the pid is found
// again through its BERTH_INSTANCE_ID variable in /proc/<pid>/environ.
//
// A name is claimed by the file <data_dir>/names/<name> holding the id.
// Instance directories and claims appear and disappear only by rename and
// link out of <data_dir>/tmp, in an order that keeps two rules whenever
// Berth is killed: every instance directory holds its record, and every
// claim names an instance whose record exists. The record comes before the
// claim on create, and the claim is dropped before the directory on delete;
// a rename claims the new name, writes the record, then drops the old
// claim, and a claim whose record names another name is stale once no
// change of that instance is under way. A
// Berth killed in between leaves at most an instance without its claim,
// which List returns with its tags (a create interrupted before the start
// shows as failed), so Berth adopts or deletes it. Open removes the
// leftovers of a killed Berth from <data_dir>/tmp.
//
// Each process leads its own process group (Setpgid), so it outlives Berth,
// and Stop, Kill, Suspend, Resume and Delete signal the whole group. The
// instance's state follows the group leader. Members left behind when the
// leader ends are stopped by Stop and Delete too (SIGTERM, then SIGKILL after
// the grace period); they are recognised by BERTH_INSTANCE_ID in their
// environment, so a group that merely reuses the number is never touched.
//
// # Exit codes
//
// The driver runs no goroutine of its own. Whenever it looks at an instance
// (Get, List, Watch, Stop ...) and finds its process a zombie, it reaps it
// with a non-blocking wait4 if this Berth process is its parent, which gives
// the exact exit code (128+n for death by signal n) and records it. This
// works for any driver in the same OS process, also one opened after Close.
// A process that ended while another Berth process (or none) was its parent
// shows as exited with no exit code and a message saying it is unknown. An
// end asked for by Stop or Delete counts as stopped; any other as exited.
//
// # Operations and capabilities
//
// Create writes the record at once and returns an operation of two short
// steps (files and ports, then the start). Delete sends SIGTERM to the
// group, then SIGKILL after the stop_grace option, and removes the instance
// directory; an unknown id finishes with ErrNotFound.
//
// Start runs a stopped or exited instance again with its record (logs are
// appended). Stop is SIGTERM, then SIGKILL after grace. Kill takes "TERM",
// "SIGKILL", "9" and so on; on an instance that is not running it gives
// ErrPermanent. Suspend and Resume are SIGSTOP and SIGCONT; Resume on an
// instance that is not suspended gives ErrNotSuspended. Logs keeps stdout and
// stderr apart, with tail and follow; follow ends when the instance stops
// running or ctx ends. Usage reads the group's CPU time and resident memory
// from /proc. Watch polls every poll_interval and reports the differences.
//
// Exec runs a command beside the instance's process, as docker exec does
// in a container: with the instance's environment (the exec's entries over
// it), user and group (or the exec's user, which the server must be able
// to become), working directory and cgroup. It leads a process group of
// its own, or with a terminal a session whose controlling terminal is a
// pseudo-terminal the driver opens; it is killed with its group when the
// caller goes away or the instance stops running (looked at every
// poll_interval). A command that is not there ends with exit code 127.
//
// Top lists the instance's processes from /proc: its process group and
// every process carrying its BERTH_INSTANCE_ID (what Exec ran), as UID,
// PID, PPID, STAT, TIME and CMD; ps options are refused by name. StatPath,
// CopyFrom and CopyTo (docker cp) work under the instance's working
// directory (the spec's WorkingDir, else <instance dir>/work), "/" naming
// it: a ".." path, a symbolic link that leads out and an archive entry
// that would land outside are refused (os.Root), files are read and
// written for the instance's user by their owner, group and mode, and
// what is copied in belongs to that user.
//
// Resize sets cpu and memory limits in a cgroup per instance: under
// <cgroup_root>/berth/<id> with cgroup v2 when cgroup_root is a v2 mount
// with the cpu and memory controllers, else under <cgroup_root>/cpu/berth/<id>
// and <cgroup_root>/memory/berth/<id> with cgroup v1. A spec with cpus or
// memory gets its limits when it starts. When neither is usable (or
// cgroup_root is empty) Resize returns ErrUnsupported with the reason, and
// the resources of a spec are only counted, not enforced. Processes that
// leave their process group are not moved into the cgroup by a Resize.
//
// # Data directory
//
// data_dir defaults to <Berth data dir>/local. When Berth keeps no data dir,
// the driver makes a new temporary directory, which it does not remove (the
// processes' logs are there) and which a later driver does not find: set
// data_dir for instances to survive a restart of Berth.
package local
