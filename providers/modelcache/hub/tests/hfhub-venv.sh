#!/usr/bin/env bash
# The judge of the Hugging Face tests: the real `huggingface_hub` Python client, pinned,
# installed from PyPI into a venv under ${XDG_CACHE_HOME:-~/.cache}/kubeairunway/hfhub-venv
# when missing (a second run takes milliseconds). Prints the venv's python on stdout.
# Exit 3: pip or PyPI unreachable (the tests skip outside CI, fail in CI).
set -euo pipefail
version="${KUBEAIRUNWAY_HFHUB_VERSION:-1.29.0}"
venv="${KUBEAIRUNWAY_HFHUB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeairunway/hfhub-venv}"
py="$venv/$version/bin/python"
if [ -x "$py" ] && "$py" -c "import huggingface_hub, sys; sys.exit(huggingface_hub.__version__ != '$version')" 2>/dev/null; then
  echo "$py"; exit 0
fi
command -v python3 >/dev/null || { echo "needs python3" >&2; exit 3; }
mkdir -p "$venv"
exec 8>"$venv/.lock"
flock 8
if [ ! -x "$py" ] || ! "$py" -c "import huggingface_hub" 2>/dev/null; then
  rm -rf "$venv/$version.partial"
  python3 -m venv "$venv/$version.partial" >&2 || { echo "python3 -m venv failed (python3-venv missing?)" >&2; exit 3; }
  "$venv/$version.partial/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-compile "huggingface_hub==$version" >&2 || { echo "pip install huggingface_hub==$version failed" >&2; exit 3; }
  rm -rf "$venv/$version"
  mv "$venv/$version.partial" "$venv/$version"
fi
echo "$py"
