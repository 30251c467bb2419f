#!/usr/bin/env bash
# The project's test command (README.md, docs/testing.md, .ci/run): sets up everything
# the tests need on a fresh machine, then checks formatting, lints, and runs every test,
# the real-API-server end-to-end tests included.
#
# Caches (safe to delete): the test API server and etcd under
# ${XDG_CACHE_HOME:-~/.cache}/kubeairunway/testcluster; huggingface_hub under .../kubeairunway/hfhub-venv; helm and kubectl under
# ${XDG_CACHE_HOME:-~/.cache}/kubeairunway/helm; actionlint under .../kubeairunway/actionlint;
# the image's Debian packages under .../kubeairunway/image-apt; playwright-core under
# .../kubeairunway/playwright (and Debian's chromium package); cargo's registry as usual.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "system tools for the test API server build and jemalloc's (make, a C compiler)"
missing=()
for tool in apt-get dpkg-deb flock sha256sum python3 make cc; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
[ -r /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
# The model-cache tests' judge, huggingface_hub, goes into a venv (tests/hfhub-venv.sh).
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "missing: ${missing[*]}; installing Debian packages"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq
  $sudo_ apt-get install -y -qq debian-archive-keyring util-linux python3 python3-pip python3-venv coreutils dpkg \
    make gcc
fi
python3 -m pip --version >/dev/null 2>&1 || python3 -m ensurepip --user >/dev/null 2>&1 || {
  echo "python3 has no pip; install python3-pip" >&2; exit 1; }

step "huggingface_hub (the model-cache tests' judge) in a venv, cached"
bash providers/modelcache/hub/tests/hfhub-venv.sh >/dev/null

step "Chromium (apt) and playwright-core (npm) for the dashboard's browser tests, cached"
while IFS= read -r line; do export "${line?}"; done < <(bash tests/e2e/browser/install.sh)

step "test API server (etcd + the upstream apiserver code), OCI registry and cosign CLI, cached"
bash tests/cluster/build.sh >/dev/null
bash tests/cluster/fetch-registry.sh >/dev/null
bash tests/cluster/fetch-cosign.sh >/dev/null

step "helm (for the chart checks) and kubectl (for the kernel-cache walk-through), cached"
HELM="$(bash scripts/install-helm.sh)"
KUBECTL="$(dirname "$HELM")/kubectl"
export HELM KUBECTL

step "helm lint (against each chart's values.schema.json) and helm template of every chart"
for chart in charts/*/; do
  "$HELM" lint --strict "$chart"
  # A library chart renders nothing by itself; the charts depending on it are rendered.
  grep -q '^type: library' "$chart/Chart.yaml" && continue
  "$HELM" template ci "$chart" --namespace kubeairunway-system >/dev/null
done

step "actionlint of the GitHub workflows, cached"
ACTIONLINT="$(bash scripts/install-actionlint.sh)"
"$ACTIONLINT" -no-color .github/workflows/*.yml

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo build --bins (the image test assembles the platform's image from them)"
cargo build --workspace --bins --locked

step "cargo test"
# Property tests (proptest) run a bounded number of cases here; run more on demand, e.g.
# PROPTEST_CASES=100000 cargo test -p kubeairunway-kernelcache-artifact --lib extract::
export PROPTEST_CASES="${PROPTEST_CASES:-256}"
# The end-to-end tests wait on the API server far more than they compute: six at a time
# (they keep apart by namespace) took the e2e binary from 5.4 to 2.6 minutes on 2 cores.
cargo test --workspace --locked --no-fail-fast -- --test-threads="${TEST_THREADS:-6}"
