//! Registry credentials for a cache from its `imagePullSecrets`, read from Kubernetes
//! Secrets ([`KubeSecrets`], behind the [`SecretApi`] seam). The end-to-end tests read
//! real Secrets of the test API server.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use oci_client::secrets::RegistryAuth;

use crate::credentials::{registry_auth, registry_of};

/// The data of a Secret.
pub type SecretData = BTreeMap<String, ByteString>;

/// Reading Secrets.
pub trait SecretApi: Send + Sync {
    /// The data of Secret `name` in `namespace`, `None` when it does not exist.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SecretData>>>;
}

/// Kubernetes Secrets.
#[derive(Clone)]
pub struct KubeSecrets(pub Client);

impl std::fmt::Debug for KubeSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSecrets").finish_non_exhaustive()
    }
}

impl SecretApi for KubeSecrets {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SecretData>>> {
        Box::pin(async move {
            let api: Api<Secret> = Api::namespaced(self.0.clone(), namespace);
            Ok(api.get_opt(name).await?.map(|s| s.data.unwrap_or_default()))
        })
    }
}

/// The credentials for pulling `pinned` with the pull Secrets `names` of `namespace`. A
/// Secret that does not exist is skipped, as the kubelet does; one that cannot be read or
/// parsed is an error.
pub async fn auth_for(
    secrets: &dyn SecretApi,
    namespace: &str,
    names: &[String],
    pinned: &str,
) -> Result<RegistryAuth, String> {
    if names.is_empty() {
        return Ok(RegistryAuth::Anonymous);
    }
    let mut found = Vec::new();
    for name in names {
        match secrets.get(namespace, name).await {
            Ok(Some(data)) => found.push((name.clone(), data)),
            Ok(None) => tracing::warn!(namespace, secret = %name, "image pull secret not found"),
            Err(e) => return Err(format!("reading image pull secret {name}: {e}")),
        }
    }
    registry_auth(&registry_of(pinned), &found).map_err(|e| e.to_string())
}
