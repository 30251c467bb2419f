#!/usr/bin/env bash
# Unpack the cosign CLI (Debian sid's `cosign` package) into the user cache, for the
# interop test that verifies a signature made by the real cosign with our code. Uses a
# private apt index of sid (as build.sh does); nothing is installed into the system.
# Prints the path of the binary.
set -euo pipefail
cache="${KUBEAIRUNWAY_TESTCLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeairunway/testcluster}"
bin="$cache/bin/cosign"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
mkdir -p "$cache/bin" "$cache/debs-cosign"
exec 8>"$cache/.cosign.lock"; flock 8
[ -x "$bin" ] && { echo "$bin"; exit 0; }

apt_dir="$cache/apt-cosign"
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

cd "$cache/debs-cosign"
if ! ls cosign_*.deb >/dev/null 2>&1; then
  if [ -z "$(find "$apt_dir/lists" -name '*_Packages*' -mtime -7 | head -1)" ]; then
    apt-get "${apt_opts[@]}" -qq update >&2
  fi
  apt-get "${apt_opts[@]}" -qq download cosign >&2 || {
    apt-get "${apt_opts[@]}" -qq update >&2; apt-get "${apt_opts[@]}" -qq download cosign >&2; }
fi
rm -rf unpacked; dpkg -x cosign_*.deb unpacked
cp unpacked/usr/bin/cosign "$bin.partial"; chmod +x "$bin.partial"; mv "$bin.partial" "$bin"; rm -rf unpacked
"$bin" version >&2 || true
echo "$bin"
