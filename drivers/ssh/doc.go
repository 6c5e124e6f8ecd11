// Package ssh is Berth's "ssh" back-end: hosts people already have (bare
// metal, VMs made elsewhere) reached over SSH, one node each, running
// instances as processes under a supervisor that outlives the connection.
// Importing the package registers the driver under the name "ssh".
//
// # Hosts and keys
//
// The hosts are listed in the option hosts: address, port (22), user
// (root), labels, and optionally capacity (over what is read from the
// host, field by field), max_instances and host_key. The driver logs in
// with key_file, and with the keys of the ssh-agent at $SSH_AUTH_SOCK
// when agent is set. A host's key is checked against its pinned host_key,
// else against known_hosts (default ~/.ssh/known_hosts); the client offers
// the host-key algorithms of the keys known for the host first. An unknown
// or changed key is a refusal naming the host and the key's fingerprint:
// the node is offline with that reason. With trust_on_first_use a host
// known_hosts does not know is accepted and written there; a changed key
// never is.
//
// # Connections and nodes
//
// Each host has one connection, dialled at Open and shared by every call;
// at most max_channels channels (sessions, SFTP) are open on it at once;
// a channel the host refuses to open is tried again a few times.
// When the host is connected its cpus (getconf _NPROCESSORS_ONLN), memory
// (MemTotal of /proc/meminfo) and disk (df of root) are read once. Every
// probe_interval each connection is checked with a keepalive; one that
// does not answer within dial_timeout is dropped, and the host is offline
// until a probe dials it again. Calls never dial: on an offline host they
// fail with ErrRetryable at once, and List returns a *PartialListError
// naming it, so its instances are handled as those of any lost node.
//
// # The supervisor
//
// Berth's own binary (supervisor_binary, default the running one) is copied
// once to <root>/bin/berth-<first 16 hex digits of its SHA-256> over SFTP,
// by way of a temporary file and a rename, unless a file with that SHA-256
// is there already (checked with sha256sum once per connection). It runs
// as the hidden subcommand `berth ssh-supervise VERB ...`.
//
// Each instance has a directory <root>/c/<cluster id>/<instance id>, made
// whole by an SFTP rename from a temporary directory: record.json (mode
// 0600: the cluster id, the instance id, its tags, the command line and
// environment), files/ (the config files: /etc/app.conf is
// files/etc/app.conf, with the spec's mode), user-data (0600). Then
// `ssh-supervise start` starts a supervisor in a session of its own
// (setsid), which starts the process in its own process group, with stdin
// from /dev/null and stdout and stderr appended to stdout.log and
// stderr.log, writes state.json (pid, start time, boot id) and reports
// back; the session ends, the supervisor stays. When the process ends the
// supervisor writes exit.json (exit code, 128+n for signal n). A pid counts
// as the instance's only while its start time and the boot id match. A
// process whose supervisor was killed still reads as running from /proc;
// its end is then seen without an exit code.
//
// # Systemd units
//
// Once per connection, unless the option supervision is process, the
// supervisor (`ssh-supervise systemd`) says whether the host can hold
// instances in transient systemd units: /run/systemd/system exists, pid 1
// is systemd, and systemd-run works for the login user (tried with a unit
// that runs the supervisor's status verb). The node's attribute supervisor
// is then systemd, else process; each record says which way its instance
// runs. On a systemd host `ssh-supervise start` runs the supervisor with
// systemd-run --collect --service-type=notify in the unit
// berth-<cluster id>-<instance id>.service (both escaped as systemd-escape
// does, so the "-" between them is unambiguous), with the limits as the
// unit's properties CPUQuota, MemoryMax and MemorySwapMax (0 with a memory
// limit) instead of a cgroup of the supervisor's; the supervisor reports
// in the file start.report, then READY=1 to systemd. The process, its
// execs and the supervisor share the unit's cgroup: what is left when the
// supervisor ends is systemd's to kill. Resize is systemctl set-property
// --runtime on a running unit. Delete stops the unit before it removes the
// directory, and every listing stops the units of its cluster whose
// directory is gone (leaks); another cluster's units never match.
//
// # Limits
//
// Each instance has a cgroup v2 <cgroup_parent>/<cluster id>/<instance id>
// (cgroup_parent defaults to /sys/fs/cgroup/berth-ssh), made by the
// supervisor before the start with cpu.max and memory.max from the spec,
// and memory.swap.max 0 with a memory limit (no swap: the limit bounds all
// the instance's memory; max without one);
// the process is born in it (CLONE_INTO_CGROUP). When the process ends
// what is left in it is killed and the cgroup removed; Delete removes it
// too. Once per connection the supervisor (`ssh-supervise cgroup`) makes
// the parent, giving the cpu and memory controllers down to it, or says
// why it cannot; the node's attribute limits is then cgroup2 or none
// (systemd on a host whose instances run in units, where the kernel must
// have the cpu and memory controllers). On a
// host with none, a create with cpus or memory is ErrUnsupported unless
// the option limits is count (then they are counted, not enforced), and
// Resize is ErrUnsupported. Resize writes the limits of a running
// instance's cgroup and its record (a zero field is left as it is).
//
// # Attach
//
// A spec with Stdin runs with its input a pipe, one with TTY on a new
// terminal; the supervisor holds the pipe's write end or the terminal's
// master (whose output it appends to stdout.log) and serves them on the
// unix socket attach.sock in the instance directory, which every
// instance's supervisor serves while the process runs. Attach runs
// `ssh-supervise attach` in a session for as long as it lasts: the output
// comes from the log files (from their start with Replay), the caller's
// stdin goes to the socket as frames, its end as a frame of its own that
// closes the instance's input (on a terminal: the end-of-file character);
// the session's end is a detach. ResizeTTY goes through the socket too.
//
// # Exec
//
// Exec runs `ssh-supervise exec` in a session for as long as the command
// runs; the verb relays the session to the supervisor's socket, which
// starts the command beside the instance's process: its environment (and
// the exec's over it), its user or the exec's, its working directory or
// the exec's, its cgroup, a process group (or, with a terminal, a
// session) of its own. Both ways go frames: the request, input, its end
// and terminal sizes in; stdout, stderr and the exit code out. The
// caller's leaving (the session's end) kills the command's process group,
// and so does the instance's end.
//
// # Specs
//
// The kind must be process. The command line is Entrypoint then Command;
// with no Entrypoint, Image names the executable. The environment is PATH
// and HOME, the spec's Env, then BERTH_INSTANCE_ID, BERTH_INSTANCE_NAME,
// BERTH_ROOT, BERTH_CONFIG_DIR and BERTH_USER_DATA_FILE. The working
// directory is WorkingDir, else <instance dir>/work. User and Group name a
// user of the host: the supervisor becomes them (the login user must then
// be root) and makes the config files and user data theirs. An executable
// or user the host lacks fails the create with ErrPermanent and leaves
// nothing behind. Volumes, networks, ports, hostname, cpuset, flavor,
// GPUs and restart policies are refused with ErrUnsupported.
//
// # Ids, names and clusters
//
// An instance id is <node>.<16 hex digits>, so a call finds the host
// without asking the others. Names are unique across the hosts as far as
// the driver has seen them (its creates and its listings). List reads only
// this cluster's directory on each host, never another cluster's, and
// returns the tags Create was given; leaks are what the engine sees there
// and does not know.
//
// # Capabilities
//
// Stop (TERM to the group, KILL after grace), Start, Restart, Kill (any
// signal ParseSignal reads, to the group), Suspend and Resume (STOP and
// CONT to the group), Usage (the group's cpu over 200 ms and resident
// memory, from the host's /proc) and Logs (stdout and stderr
// apart, tail, follow; follow ends when the process ends or the caller's
// context does, which closes the command's input) go through the
// supervisor, as do Resize, Attach, ResizeTTY and Exec. There is no Watch: the
// provider polls List. Create and Delete run in the background
// (driver.Calls); their Advance only looks.
package ssh
