//! Registry credentials for a cache from its `imagePullSecrets`, read behind a small seam
//! ([`SecretApi`]): Kubernetes Secrets in a cluster, a map in tests.

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

/// Secrets held in memory, by (namespace, name).
#[derive(Clone, Debug, Default)]
pub struct InMemory(pub BTreeMap<(String, String), SecretData>);

impl SecretApi for InMemory {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SecretData>>> {
        let found = self.0.get(&(namespace.into(), name.into())).cloned();
        Box::pin(async move { Ok(found) })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn credentials_come_from_the_first_secret_naming_the_registry() {
        let config = br#"{"auths":{"reg.example:5000":{"username":"u","password":"p"}}}"#;
        let secrets = InMemory(BTreeMap::from([(
            ("ml".to_string(), "pull".to_string()),
            BTreeMap::from([(".dockerconfigjson".to_string(), ByteString(config.to_vec()))]),
        )]));
        let names = ["missing".to_string(), "pull".to_string()];
        let auth = auth_for(&secrets, "ml", &names, "reg.example:5000/c@sha256:ab")
            .await
            .unwrap();
        assert_eq!(auth, RegistryAuth::Basic("u".into(), "p".into()));
        let other = auth_for(&secrets, "ml", &names, "other.example/c@sha256:ab")
            .await
            .unwrap();
        assert_eq!(other, RegistryAuth::Anonymous);
        let bad = InMemory(BTreeMap::from([(
            ("ml".to_string(), "pull".to_string()),
            BTreeMap::new(),
        )]));
        let e = auth_for(&bad, "ml", &names, "reg.example:5000/c@sha256:ab")
            .await
            .unwrap_err();
        assert_eq!(
            e,
            "pull secret pull has no .dockerconfigjson or .dockercfg key"
        );
    }
}
