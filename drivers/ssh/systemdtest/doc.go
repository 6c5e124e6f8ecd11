// Package systemdtest holds the tests of the ssh back-end on a host whose
// service manager is systemd, where each instance's supervisor runs in a
// transient unit: a Debian root file system with systemd and sshd, made
// once with debootstrap into the user's cache directory and imported into
// Docker, booted as a privileged container with systemd as PID 1. It is a
// package of its own so that the first build of that file system has its
// own test time budget.
package systemdtest
