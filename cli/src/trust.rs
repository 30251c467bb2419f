//! What the cache commands trust: the registry credentials Docker or Podman keep, and the
//! KernelCachePolicy an image or artifact is verified under (the cluster's, or a file's).
//! `cache build|verify` and `cache model pull` share them.

use std::path::Path;

use anyhow::Context as _;
use kube::api::Api;
use kubeairunway_kernelcache_api::{KernelCachePolicy, KernelCachePolicySpec};
use kubeairunway_kernelcache_signing::build;
use oci_client::secrets::RegistryAuth;

use crate::cluster;

/// The registry of an image reference (`host[:port]`).
pub(crate) fn registry_of(image: &str) -> anyhow::Result<String> {
    let reference: oci_client::Reference = image
        .parse()
        .with_context(|| format!("invalid image reference {image:?}"))?;
    Ok(reference.resolve_registry().to_string())
}

/// The credentials Docker or Podman keep for the registry of `image`.
pub(crate) fn auth_for(image: &str) -> anyhow::Result<RegistryAuth> {
    let registry = registry_of(image)?;
    build::docker_auth(&registry)
        .map_err(|e| anyhow::anyhow!("reading the credentials for {registry}: {e}"))
}

/// The KernelCachePolicy `name` of the cluster (through `kubeconfig`), or the one in
/// `file`; `None` when the cluster has none of that name. Returns it with where it came
/// from.
pub(crate) async fn policy_of(
    name: &str,
    file: Option<&Path>,
    kubeconfig: Option<&Path>,
    state_dir: &Path,
) -> anyhow::Result<(Option<KernelCachePolicySpec>, String)> {
    if let Some(path) = file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let policy: KernelCachePolicy = serde_saphyr::from_str(&text)
            .with_context(|| format!("{} is not a KernelCachePolicy", path.display()))?;
        return Ok((Some(policy.spec), path.display().to_string()));
    }
    let target = cluster::connect(kubeconfig, state_dir).await?;
    let api: Api<KernelCachePolicy> = Api::all(target.client);
    let origin = format!("KernelCachePolicy/{name}");
    match api.get_opt(name).await {
        Ok(found) => Ok((found.map(|p| p.spec), origin)),
        Err(kube::Error::Api(s)) if s.code == 404 => anyhow::bail!(
            "this cluster has no KernelCachePolicy CRD (kernelcachepolicies.cache.kubeairunway.ai): the kernel-cache provider is not installed; install charts/kernelcache-provider (or run `kubeairunway up`), or pass --policy-file"
        ),
        Err(e) => Err(e).with_context(|| format!("reading {origin}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_of_references() {
        assert_eq!(
            registry_of("127.0.0.1:5000/caches/x:v1").unwrap(),
            "127.0.0.1:5000"
        );
        assert_eq!(registry_of("ghcr.io/org/x@sha256:0000000000000000000000000000000000000000000000000000000000000000").unwrap(), "ghcr.io");
        assert!(registry_of("Not A Reference").is_err());
    }
}
