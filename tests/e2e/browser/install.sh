#!/usr/bin/env bash
# The dashboard's browser tests' tools: Debian's Chromium (apt) and playwright-core from
# npm (pinned; it drives the existing Chromium and downloads no browser), installed into
# ${XDG_CACHE_HOME:-~/.cache}/kubeairunway/playwright when missing (a second run takes
# milliseconds). Prints `PLAYWRIGHT_CORE=<dir>` and `CHROMIUM=<path>` for the test run.
set -euo pipefail
version="${KUBEAIRUNWAY_PLAYWRIGHT_VERSION:-1.65.1}"
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kubeairunway/playwright"
chromium="$(command -v chromium || true)"
if [ -z "$chromium" ]; then
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq >&2
  $sudo_ apt-get install -y -qq chromium >&2
  chromium="$(command -v chromium)"
fi
command -v node >/dev/null && command -v npm >/dev/null || { echo "needs node and npm" >&2; exit 3; }
core="$dir/$version/node_modules/playwright-core"
if ! grep -q "\"version\": \"$version\"" "$core/package.json" 2>/dev/null; then
  mkdir -p "$dir"
  exec 8>"$dir/.lock"
  flock 8
  rm -rf "$dir/$version.partial"
  mkdir -p "$dir/$version.partial"
  (cd "$dir/$version.partial" && echo '{"private": true}' > package.json &&
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --silent --no-audit --no-fund "playwright-core@$version" >&2)
  rm -rf "$dir/$version"
  mv "$dir/$version.partial" "$dir/$version"
fi
echo "PLAYWRIGHT_CORE=$core"
echo "CHROMIUM=$chromium"
