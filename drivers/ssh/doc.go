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
// at most max_channels channels (sessions, SFTP) are open on it at once.
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
// With cpus or memory in the spec the supervisor makes a cgroup v2
// /sys/fs/cgroup/berth-ssh/<id> with cpu.max and memory.max before the
// start, and the process is born in it; on a host without cgroup v2 and
// its cpu and memory controllers the resources are only counted.
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
// GPUs, stdin, tty and restart policies are refused with ErrUnsupported.
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
// supervisor. There is no Resize, Attach or Watch: the provider's
// fallbacks apply. Create and Delete run in the background (driver.Calls);
// their Advance only looks.
package ssh
