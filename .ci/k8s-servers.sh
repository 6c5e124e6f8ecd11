#!/usr/bin/env bash
# Builds the servers the kubernetes driver's tests run against, from the Go
# module proxy, into a cache directory, once: a real kube-apiserver (from
# k8s.io/kubernetes, whose staging modules are taken from the proxy at the
# same release) and KWOK (fake nodes that run pods without containers),
# with KWOK's own fast stages. etcd is not built: the tests start Berth's
# embedded member.
#
#   .ci/k8s-servers.sh           prints the directory (after building what is missing)
#
# The directory is ${BERTH_K8S_BIN} when set, else
# ${BERTH_CACHE:-$HOME/.cache/berth}/k8s-v1.37.2. A cold build of both
# takes about 8 minutes on 2 cores with nothing beside it; later runs find
# them there.
set -euo pipefail

K8S_VERSION=v1.37.2
STAGING_VERSION=v0.37.2
KWOK_VERSION=v0.8.0

export PATH="/usr/local/go/bin:$PATH"
cache="${BERTH_K8S_BIN:-${BERTH_CACHE:-$HOME/.cache/berth}/k8s-$K8S_VERSION}"
mkdir -p "$cache"
log() { echo "k8s-servers: $*" >&2; }

# moddir MODULE@VERSION downloads a module through the proxy and prints its
# directory in the module cache. It runs outside any module, so that no
# go.mod is touched.
moddir() {
	(cd / && GOFLAGS= GOWORK=off go mod download -json "$1") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

# build_servers builds kube-apiserver and KWOK in one go build, within
# k8s.io/kubernetes's module with KWOK added to it: the kubernetes libraries
# both use (client-go, apimachinery, apiserver and the rest) are compiled
# once, at the release the apiserver is, where KWOK alone would compile
# them again at its own. The binaries leave out their debugging symbols,
# which shortens the links of two binaries of 90 to 120 MB.
build_servers() {
	local src
	src="$(mktemp -d "${TMPDIR:-/tmp}/berth-k8s-servers.XXXXXX")"
	trap 'rm -rf "$src"' RETURN
	log "downloading k8s.io/kubernetes@$K8S_VERSION"
	cd "$src"
	local dir
	dir="$(moddir "k8s.io/kubernetes@$K8S_VERSION")"
	if [ -z "$dir" ] || [ ! -d "$dir" ]; then
		log "go mod download gave no module directory"
		return 1
	fi
	cp -r "$dir/." "$src/"
	chmod -R u+w "$src"
	rm -f go.work go.work.sum
	# The staging modules come from the proxy at the matching release: drop
	# each "=> ./staging/..." replacement and require the release instead of
	# v0.0.0.
	local staged
	staged="$(sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/.*#\1#p' go.mod)"
	sed -i '/=> \.\/staging\//d' go.mod
	for m in $staged; do
		sed -i "s#^\([[:space:]]*$(printf '%s' "$m" | sed 's/[.]/\\./g')\) v0\.0\.0\$#\1 $STAGING_VERSION#" go.mod
	done
	GOWORK=off GOFLAGS=-mod=mod go get "sigs.k8s.io/kwok@$KWOK_VERSION"
	log "building kube-apiserver and kwok $KWOK_VERSION (about 8 minutes cold on 2 cores)"
	local out="$cache/build.tmp"
	rm -rf "$out"
	mkdir -p "$out"
	GOWORK=off GOFLAGS=-mod=mod go build -trimpath -ldflags='-s -w' -o "$out/" ./cmd/kube-apiserver "sigs.k8s.io/kwok/cmd/kwok"
	mv "$out/kube-apiserver" "$out/kwok" "$cache/"
	rmdir "$out"
	cd - >/dev/null
}

if [ ! -x "$cache/kube-apiserver" ] || [ ! -x "$cache/kwok" ]; then
	build_servers
fi

if [ ! -s "$cache/kwok-stages.yaml" ]; then
	# KWOK's binary loads no stages by itself; kwokctl hands it these.
	kdir="$(moddir "sigs.k8s.io/kwok@$KWOK_VERSION")"
	out="$cache/kwok-stages.yaml.tmp"
	: >"$out"
	for f in stage/node/fast/node-initialize.yaml stage/pod/fast/pod-ready.yaml stage/pod/fast/pod-complete.yaml stage/pod/fast/pod-delete.yaml; do
		echo "---" >>"$out"
		cat "$kdir/kustomize/$f" >>"$out"
	done
	mv "$out" "$cache/kwok-stages.yaml"
fi

echo "$cache"
