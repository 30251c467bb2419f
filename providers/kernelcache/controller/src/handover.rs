//! Registry credentials handed over to the node agents: for each KernelCache whose pull
//! Secrets give credentials for its registry, one Secret
//! `<credentials namespace>/kernelcache-pull-<hash>` ([`handover_name`]) holding only that
//! registry's entry. The agents read Secrets in that namespace only; the controller reads
//! users' pull Secrets only in the namespaces the chart grants it. A cache deleted, or
//! whose image needs no credentials any more, loses its Secret.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use oci_client::secrets::RegistryAuth;
use serde_json::json;
use tracing::{info, warn};

use kubeairunway_kernelcache_artifact::credentials::{handover_config, handover_name, registry_of};

/// The label on every handed-over Secret.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "kernelcache-controller");
/// The label of a handed-over hub token of a ModelCache (the model-cache controller's;
/// the registry-credentials sweep leaves these alone).
pub const MODEL_TOKEN_LABEL: (&str, &str) = ("cache.kubeairunway.ai/handover", "model-token");
/// The annotation naming the KernelCache (`namespace/name`) a Secret is for.
pub const FOR_ANNOTATION: &str = "cache.kubeairunway.ai/for";

/// A KernelCache: (namespace, name).
type CacheKey = (String, String);

/// The handed-over Secrets of one controller.
pub struct Handover {
    api: Api<Secret>,
    namespace: String,
    /// What was last written per cache (`None`: nothing handed over).
    written: Mutex<HashMap<CacheKey, Option<Vec<u8>>>>,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Handover {
    /// Hand over in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            written: Mutex::default(),
        }
    }

    /// Make the handed-over Secret of `namespace/name` hold `auth` for `image`'s registry
    /// (none for anonymous access). Writes only what changed.
    pub async fn sync(
        &self,
        namespace: &str,
        name: &str,
        image: &str,
        auth: &RegistryAuth,
    ) -> Result<(), String> {
        let key = (namespace.to_string(), name.to_string());
        let config = handover_config(&registry_of(image), auth);
        if self
            .written
            .lock()
            .ok()
            .and_then(|w| w.get(&key).cloned())
            .is_some_and(|w| w == config)
        {
            return Ok(());
        }
        let secret = handover_name(namespace, name);
        match &config {
            Some(bytes) => {
                use base64::Engine as _;
                let body = json!({
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": secret,
                        "namespace": self.namespace,
                        "labels": {MANAGED_BY.0: MANAGED_BY.1},
                        "annotations": {FOR_ANNOTATION: format!("{namespace}/{name}")},
                    },
                    "type": "kubernetes.io/dockerconfigjson",
                    "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(bytes)},
                });
                self.api
                    .patch(
                        &secret,
                        &PatchParams::apply(crate::settings::FIELD_MANAGER).force(),
                        &Patch::Apply(&body),
                    )
                    .await
                    .map_err(|e| {
                        format!(
                            "handing over the registry credentials ({}/{secret}): {}",
                            self.namespace,
                            kubeairunway_kernelcache_api::report::kube_error(&e)
                        )
                    })?;
            }
            None => self.delete(&secret).await?,
        }
        if let Ok(mut w) = self.written.lock() {
            w.insert(key, config);
        }
        Ok(())
    }

    async fn delete(&self, secret: &str) -> Result<(), String> {
        match self.api.delete(secret, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(format!(
                "deleting the handed-over credentials {}/{secret}: {}",
                self.namespace,
                kubeairunway_kernelcache_api::report::kube_error(&e)
            )),
        }
    }

    /// Delete the handed-over Secrets of caches for which `exists` is false: those
    /// written by this process, and (`sweep`) every one found in the namespace.
    pub async fn prune(&self, exists: impl Fn(&str, &str) -> bool, sweep: bool) {
        let mut gone: BTreeSet<String> = BTreeSet::new();
        if let Ok(mut w) = self.written.lock() {
            w.retain(|(ns, name), _| {
                let keep = exists(ns, name);
                if !keep {
                    gone.insert(handover_name(ns, name));
                }
                keep
            });
        }
        if sweep {
            let selector = format!("{}={},!{}", MANAGED_BY.0, MANAGED_BY.1, MODEL_TOKEN_LABEL.0);
            match self
                .api
                .list(&ListParams::default().labels(&selector))
                .await
            {
                Ok(list) => {
                    for s in list {
                        let owner = s.annotations().get(FOR_ANNOTATION).cloned();
                        let orphan = owner
                            .as_deref()
                            .and_then(|o| o.split_once('/'))
                            .is_none_or(|(ns, name)| !exists(ns, name));
                        if orphan {
                            gone.insert(s.name_any());
                        }
                    }
                }
                Err(e) => {
                    warn!(error = %kubeairunway_kernelcache_api::report::kube_error(&e), "listing handed-over credentials");
                }
            }
        }
        for secret in &gone {
            match self.delete(secret).await {
                Ok(()) => info!(secret, "handed-over credentials of a deleted cache removed"),
                Err(e) => warn!(error = %e, "removing handed-over credentials"),
            }
        }
    }
}
