#!/usr/bin/env bash
# Assemble the runtime root of the platform's image from Debian packages, without
# installing anything into the system and without running any package script:
#   image/rootfs.sh ROOT [DEBIAN_ARCH]
# The packages (image/runtime-packages.txt, Debian $suite) are fetched through a private
# apt index (as tests/cluster/build.sh fetches its packages), unpacked with dpkg-deb into
# a merged-/usr layout, and completed as their maintainer scripts and distroless would:
# the CA bundle, passwd/group with root and nonroot (65532), /tmp, and dpkg status
# entries for image scanners. The Dockerfile builds the released image's root with this
# script; the image test (tests/e2e/tests/e2e/image.rs) builds the same root on machines without a container
# engine. The binaries go to ROOT/ afterwards (image/binaries.txt).
#
# Cache (safe to delete): ${XDG_CACHE_HOME:-~/.cache}/kubeairunway/image-apt
set -euo pipefail

root="${1:?usage: image/rootfs.sh ROOT [DEBIAN_ARCH]}"
arch="${2:-$(dpkg --print-architecture)}"
suite="trixie"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KUBEAIRUNWAY_IMAGE_APT:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeairunway/image-apt}"
say() { printf '[image-rootfs] %s\n' "$*" >&2; }

for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { say "needs $tool"; exit 1; }
done
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || { say "needs the debian-archive-keyring package"; exit 1; }

mapfile -t packages < <(grep -v '^\s*\(#\|$\)' "$here/runtime-packages.txt")

# --- private apt index of $suite for $arch -------------------------------------------
apt_dir="$cache/$suite-$arch"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/none.d" "$apt_dir/debs"
cat > "$apt_dir/debian.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: $suite $suite-updates
Components: main
Signed-By: $keyring

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: $suite-security
Components: main
Signed-By: $keyring
SRC
apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/debian.sources" -o "Dir::Etc::sourceparts=$apt_dir/none.d"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
  -o "Dir::State::status=$apt_dir/none.d/status"
  -o "Dir::Etc::preferences=$apt_dir/none.d/none" -o "Dir::Etc::preferencesparts=$apt_dir/none.d"
  -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
  -o "Acquire::Languages=none" -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
  -o "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false"
  -o "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false")
[ "$(id -u)" = 0 ] && apt_opts+=(-o "APT::Sandbox::User=root")
touch "$apt_dir/none.d/status"
# A day-old index is refreshed: security updates land in the image.
if [ -z "$(find "$apt_dir/lists" -name '*_Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
  say "refreshing the private Debian $suite index ($arch)"
  apt-get "${apt_opts[@]}" -qq update >&2
fi
rm -f "$apt_dir/debs"/*.deb
(cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" -qq download "${packages[@]}" >&2)

# --- unpack into a merged-/usr root --------------------------------------------------
rm -rf "$root"
mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib" "$root/usr/lib64" "$root/var/lib/dpkg/status.d"
for d in bin sbin lib lib64; do ln -s "usr/$d" "$root/$d"; done
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
for deb in "$apt_dir/debs"/*.deb; do
  name="$(dpkg-deb -f "$deb" Package)"
  rm -rf "$stage/x"; mkdir "$stage/x"
  dpkg-deb -x "$deb" "$stage/x"
  # Packages of the older layout ship /lib, /bin...: they belong under /usr.
  for d in bin sbin lib lib64; do
    if [ -d "$stage/x/$d" ] && [ ! -L "$stage/x/$d" ]; then
      cp -a "$stage/x/$d/." "$root/usr/$d/"
      rm -rf "${stage:?}/x/$d"
    fi
  done
  cp -a "$stage/x/." "$root/"
  # What image scanners read (distroless keeps one status file per package).
  dpkg-deb -f "$deb" Package Version Architecture Source Maintainer > "$root/var/lib/dpkg/status.d/$name"
  say "unpacked $name $(dpkg-deb -f "$deb" Version)"
done

# --- what the maintainer scripts would have done -------------------------------------
# ca-certificates' update-ca-certificates: one bundle of the Mozilla certificates.
mkdir -p "$root/etc/ssl/certs"
find "$root/usr/share/ca-certificates/mozilla" -name '*.crt' | LC_ALL=C sort | xargs cat \
  > "$root/etc/ssl/certs/ca-certificates.crt"
grep -q 'BEGIN CERTIFICATE' "$root/etc/ssl/certs/ca-certificates.crt" || { say "empty CA bundle"; exit 1; }
cat > "$root/etc/passwd" <<'PW'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PW
cat > "$root/etc/group" <<'GR'
root:x:0:
nogroup:x:65534:
nonroot:x:65532:
GR
mkdir -p "$root/tmp" "$root/root" "$root/home/nonroot"
chmod 1777 "$root/tmp"
chmod 700 "$root/root"
chown 65532:65532 "$root/home/nonroot" 2>/dev/null || true
# Documentation is not needed at run time; the packages' copyright files stay.
find "$root/usr/share/doc" -type f ! -name copyright -delete 2>/dev/null || true
rm -rf "$root/usr/share/man" "$root/usr/share/lintian" "$root/usr/share/info"
say "runtime root of ${#packages[@]} packages ($suite, $arch) in $root"
