// Package cgrouptest holds a test of the ssh back-end's supervisor on a
// kernel with cgroup v2 and its cpu and memory controllers, which a
// machine with cgroup v1 or a hybrid layout cannot give: a small guest
// booted with QEMU from the host's kernel. It is a package of its own so
// that its boot, slow under emulation, has its own test time budget.
package cgrouptest
