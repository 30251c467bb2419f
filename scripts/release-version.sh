#!/usr/bin/env bash
# The version a release tag publishes, checked against the repository: given a tag
# vX.Y.Z[-pre], prints X.Y.Z[-pre] (the image tag, the charts' version and appVersion,
# without the "v"), and fails unless the workspace (Cargo.toml) and every chart
# (charts/*/Chart.yaml: version, appVersion and the kubeairunway-lib dependency) carry
# exactly that version. The release workflow runs it first; so do the chart tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tag="${1:?usage: scripts/release-version.sh vX.Y.Z}"
[[ "$tag" =~ ^v([0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?)$ ]] || {
  echo "release-version: $tag is not a version tag vX.Y.Z[-pre]" >&2; exit 1; }
version="${BASH_REMATCH[1]}"

fail=0
workspace=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ "$workspace" = "$version" ] || { echo "release-version: Cargo.toml has $workspace, the tag $version" >&2; fail=1; }
for chart in charts/*/Chart.yaml; do
  for key in version appVersion; do
    have=$(sed -n "s/^$key: \"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$chart")
    [ "$have" = "$version" ] || { echo "release-version: $chart $key is $have, the tag $version" >&2; fail=1; }
  done
  dep=$(sed -n '/name: kubeairunway-lib/{n;s/^ *version: \(.*\)$/\1/p}' "$chart")
  if [ -n "$dep" ] && [ "$dep" != "$version" ]; then
    echo "release-version: $chart depends on kubeairunway-lib $dep, the tag $version" >&2; fail=1
  fi
done
[ "$fail" = 0 ] || exit 1
echo "$version"
