#!/usr/bin/env bash
# Unpack Debian's docker-registry (the CNCF distribution registry) into the user cache,
# for tests that need a real OCI registry on loopback. Nothing is installed into the
# system. Prints the path of the binary.
set -euo pipefail
cache="${KUBEAIRUNWAY_TESTCLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeairunway/testcluster}"
bin="$cache/bin/docker-registry"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
mkdir -p "$cache/bin" "$cache/debs-registry"
exec 8>"$cache/.registry.lock"; flock 8
[ -x "$bin" ] && { echo "$bin"; exit 0; }
cd "$cache/debs-registry"
if ! ls docker-registry_*.deb >/dev/null 2>&1; then
  apt-get download -qq docker-registry >/dev/null 2>&1 || { apt-get update -qq >&2; apt-get download -qq docker-registry >&2; }
fi
rm -rf unpacked; dpkg -x docker-registry_*.deb unpacked
cp unpacked/usr/bin/docker-registry "$bin.partial"; mv "$bin.partial" "$bin"; rm -rf unpacked
"$bin" --version >&2
echo "$bin"
