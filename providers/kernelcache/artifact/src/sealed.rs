//! Credentials sealed per node. Every agent shares one service account, and RBAC cannot
//! narrow a Secret read to one node, so an agent may read every Secret of the credentials
//! namespace; what it reads there opens only on its own node.
//!
//! Each agent makes an X25519 key pair at start (the private half never leaves its
//! memory) and publishes the public half in its `KernelCacheNode.spec.credentialsKey`
//! (which only that node's agent may write: the chart's agent-node policy). The controller
//! keeps one Secret per node ([`node_secret_name`]) holding, for each cache whose
//! nodeSelector selects the node, that cache's handed-over data sealed to the node's key
//! ([`seal`]: a libsodium sealed box, `crypto_box`). An agent opens only its own entries
//! ([`Unsealing`]); a compromised node learns the credentials of the caches it was meant
//! to pull, and no other's.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures::future::BoxFuture;

use crate::secrets::{SecretApi, SecretData};

/// The label on every node Secret.
pub const NODE_SECRET_LABEL: (&str, &str) = ("cache.kubeairunway.ai/sealed-for", "node");
/// The annotation naming the node a node Secret is sealed for.
pub const NODE_ANNOTATION: &str = "cache.kubeairunway.ai/node";

/// The Secret holding what is sealed for `node`, in the credentials namespace:
/// `kernelcache-node-` and 40 hex digits of the SHA-256 of the node's name (any node name
/// fits).
pub fn node_secret_name(node: &str) -> String {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(node.as_bytes());
    format!("kernelcache-node-{}", &crate::registry::hex(&hash)[..40])
}

/// An agent's key pair: made at start, kept in memory only.
pub struct NodeKey(crypto_box::SecretKey);

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("NodeKey").field(&self.public()).finish()
    }
}

impl NodeKey {
    /// A new key pair from the operating system's random source.
    pub fn generate() -> Self {
        Self(crypto_box::SecretKey::generate(
            &mut crypto_box::aead::OsRng,
        ))
    }

    /// The public half, base64 (`KernelCacheNode.spec.credentialsKey`).
    pub fn public(&self) -> String {
        STANDARD.encode(self.0.public_key().as_bytes())
    }

    /// Opens what [`seal`] sealed to this key.
    pub fn open(&self, sealed: &[u8]) -> Result<SecretData, SealError> {
        let plain = self
            .0
            .unseal(sealed)
            .map_err(|_| SealError::NotForThisKey)?;
        serde_json::from_slice(&plain).map_err(|e| SealError::Malformed(e.to_string()))
    }
}

/// Why something could not be sealed or opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    /// A published key that is not 32 bytes of base64.
    #[error("credentialsKey is not a base64 X25519 public key (32 bytes)")]
    BadKey,
    /// Sealed to another key (an earlier one of this node: its agent restarted), or
    /// altered.
    #[error(
        "sealed to another key of this node (its agent restarted and published a new one; the controller seals again for it) or altered"
    )]
    NotForThisKey,
    /// Opened, but not the data of a Secret.
    #[error("sealed data is not a Secret's data: {0}")]
    Malformed(String),
}

/// `data` sealed to the base64 public key `public` (anyone may seal; only the holder of
/// the private half opens).
pub fn seal(public: &str, data: &SecretData) -> Result<Vec<u8>, SealError> {
    let key = public_key(public)?;
    let plain = serde_json::to_vec(data).map_err(|e| SealError::Malformed(e.to_string()))?;
    key.seal(&mut crypto_box::aead::OsRng, &plain)
        .map_err(|_| SealError::BadKey)
}

/// Whether `public` is a key [`seal`] accepts.
pub fn valid_key(public: &str) -> bool {
    public_key(public).is_ok()
}

/// The public key `public` names (32 bytes, base64).
fn public_key(public: &str) -> Result<crypto_box::PublicKey, SealError> {
    let bytes: [u8; crypto_box::KEY_SIZE] = STANDARD
        .decode(public.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or(SealError::BadKey)?;
    Ok(crypto_box::PublicKey::from(bytes))
}

/// The agent's view of the credentials namespace: a read of the handed-over Secret
/// `name` returns the entry `name` of this node's Secret, opened with this node's key.
/// `None` while nothing is sealed for this node under that name.
pub struct Unsealing {
    inner: Arc<dyn SecretApi>,
    node: String,
    key: Arc<NodeKey>,
}

impl std::fmt::Debug for Unsealing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unsealing")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Unsealing {
    /// Reads through `inner` for `node`, opening with `key`.
    pub fn new(inner: Arc<dyn SecretApi>, node: &str, key: Arc<NodeKey>) -> Self {
        Self {
            inner,
            node: node.to_string(),
            key,
        }
    }
}

impl SecretApi for Unsealing {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SecretData>>> {
        Box::pin(async move {
            let secret = node_secret_name(&self.node);
            let Some(data) = self.inner.get(namespace, &secret).await? else {
                return Ok(None);
            };
            let Some(sealed) = data.get(name) else {
                return Ok(None);
            };
            self.key.open(&sealed.0).map(Some).map_err(|e| {
                anyhow::anyhow!("{name} in {namespace}/{secret} (node {}): {e}", self.node)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use k8s_openapi::ByteString;

    use super::*;

    fn data(value: &str) -> SecretData {
        [(".dockerconfigjson".to_string(), ByteString(value.into()))].into()
    }

    /// Opens only with the key it was sealed to; the sealed bytes do not hold the secret.
    #[test]
    fn sealed_data_opens_only_with_its_nodes_key() {
        let a = NodeKey::generate();
        let b = NodeKey::generate();
        assert!(valid_key(&a.public()) && a.public() != b.public());
        let secret = data(r#"{"auths":{"r.example":{"auth":"cm9ib3Q6aHVudGVyMg=="}}}"#);
        let sealed = seal(&a.public(), &secret).unwrap();
        assert!(!String::from_utf8_lossy(&sealed).contains("cm9ib3Q6aHVudGVyMg"));
        assert_eq!(a.open(&sealed).unwrap(), secret);
        assert_eq!(b.open(&sealed), Err(SealError::NotForThisKey));
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(a.open(&altered), Err(SealError::NotForThisKey));
        assert_eq!(seal("not a key", &secret), Err(SealError::BadKey));
        assert_eq!(
            seal(&STANDARD.encode([0u8; 31]), &secret),
            Err(SealError::BadKey)
        );
        assert!(!valid_key(&STANDARD.encode([0u8; 33])));
    }

    struct Fake(Mutex<BTreeMap<(String, String), SecretData>>);

    impl SecretApi for Fake {
        fn get<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, anyhow::Result<Option<SecretData>>> {
            let found = self
                .0
                .lock()
                .unwrap()
                .get(&(namespace.to_string(), name.to_string()))
                .cloned();
            Box::pin(async move { Ok(found) })
        }
    }

    /// An agent reads its own node's entry under the cache's name, and nothing of another
    /// node's Secret; an entry sealed to its earlier key says so.
    #[tokio::test]
    async fn an_agent_reads_only_its_own_nodes_entries() {
        let a = Arc::new(NodeKey::generate());
        let b = Arc::new(NodeKey::generate());
        let secret = data("{}");
        let mut store = BTreeMap::new();
        store.insert(
            ("creds".to_string(), node_secret_name("gpu-b")),
            [(
                "kernelcache-pull-x".to_string(),
                ByteString(seal(&b.public(), &secret).unwrap()),
            )]
            .into(),
        );
        let fake: Arc<dyn SecretApi> = Arc::new(Fake(Mutex::new(store)));
        let on_a = Unsealing::new(Arc::clone(&fake), "gpu-a", Arc::clone(&a));
        assert_eq!(on_a.get("creds", "kernelcache-pull-x").await.unwrap(), None);
        let on_b = Unsealing::new(Arc::clone(&fake), "gpu-b", Arc::clone(&b));
        assert_eq!(
            on_b.get("creds", "kernelcache-pull-x").await.unwrap(),
            Some(secret)
        );
        assert_eq!(on_b.get("creds", "kernelcache-pull-y").await.unwrap(), None);
        // The agent of gpu-b restarted with a new key: the old entry does not open.
        let restarted = Unsealing::new(fake, "gpu-b", Arc::new(NodeKey::generate()));
        let e = restarted
            .get("creds", "kernelcache-pull-x")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("sealed to another key"), "{e}");
        assert_ne!(node_secret_name("gpu-a"), node_secret_name("gpu-b"));
    }
}
