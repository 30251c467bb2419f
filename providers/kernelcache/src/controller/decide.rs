//! The controller's pure decisions: what the nodes' reports add up to for one cache, and
//! what a ModelDeployment's `KernelCacheReady` condition says.

use std::collections::BTreeMap;

use crate::api::{CacheState, KernelCache, KernelCacheNode};

/// Condition reasons of the controller.
pub mod reasons {
    /// The tag resolved and the digest is pinned.
    pub const PINNED: &str = "Pinned";
    /// The tag could not be resolved (registry down, no such image, no access).
    pub const RESOLVE_FAILED: &str = "ResolveFailed";
    /// The tag now points at another digest than the pinned (verified) one.
    pub const TAG_MOVED: &str = "TagMoved";
    /// The image is not a kernel cache (labels missing or wrong).
    pub const NOT_A_CACHE: &str = "NotACacheImage";
    /// A signature satisfied the policy.
    pub const VERIFIED: &str = "Verified";
    /// No signature satisfied the policy.
    pub const VERIFICATION_FAILED: &str = "VerificationFailed";
    /// The policy disables verification (development only).
    pub const VERIFICATION_DISABLED: &str = "VerificationDisabled";
    /// There is no verification policy.
    pub const NO_POLICY: &str = "NoPolicy";
    /// Ready on at least one node.
    pub const STAGED: &str = "Staged";
    /// Usable, but ready on no node yet.
    pub const NOT_STAGED: &str = "NotStaged";
    /// Not usable (not pinned, not verified, not a cache).
    pub const NOT_VERIFIED: &str = "NotVerified";
    /// The ModelDeployment names a KernelCache that does not exist.
    pub const NOT_FOUND: &str = "KernelCacheNotFound";
    /// `KernelCacheReady` is true.
    pub const READY: &str = "KernelCacheReady";
}

/// What the nodes report about one cache's current digest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Aggregate {
    /// Node names per state (`Ready`, `Staging`, ...), sorted.
    pub nodes: BTreeMap<String, Vec<String>>,
    /// Nodes where the cache is ready.
    pub ready: i32,
    /// A summary: counts per state, failed nodes with their messages.
    pub message: String,
}

/// The longest condition message we write.
const MAX_MESSAGE: usize = 1024;

/// Add up the node reports for `namespace/name` at `digest` (entries for other digests
/// are ignored: they describe an older pin).
pub fn aggregate(
    namespace: &str,
    name: &str,
    digest: &str,
    nodes: &[KernelCacheNode],
) -> Aggregate {
    let mut by_state: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut failures = Vec::new();
    for node in nodes {
        let node_name = node.spec.node_name.clone();
        let Some(status) = &node.status else { continue };
        for entry in &status.caches {
            if entry.namespace != namespace || entry.name != name || entry.digest != digest {
                continue;
            }
            by_state
                .entry(format!("{:?}", entry.state))
                .or_default()
                .push(node_name.clone());
            if entry.state == CacheState::Failed {
                failures.push(format!(
                    "{node_name}: {}",
                    entry.message.as_deref().unwrap_or("failed")
                ));
            }
        }
    }
    for names in by_state.values_mut() {
        names.sort();
        names.dedup();
    }
    let ready = by_state
        .get("Ready")
        .map_or(0, |n| i32::try_from(n.len()).unwrap_or(i32::MAX));
    let mut message = if by_state.is_empty() {
        "no node has reported this digest yet".to_string()
    } else {
        by_state
            .iter()
            .map(|(state, names)| format!("{} {state}", names.len()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    failures.sort();
    if !failures.is_empty() {
        message.push_str("; failed: ");
        message.push_str(&failures.join("; "));
    }
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    Aggregate {
        nodes: by_state,
        ready,
        message,
    }
}

/// `KernelCacheReady` for a ModelDeployment naming `name`: (status, reason, message).
pub fn model_deployment_condition(
    name: &str,
    cache: Option<&KernelCache>,
) -> (bool, &'static str, String) {
    let Some(cache) = cache else {
        return (
            false,
            reasons::NOT_FOUND,
            format!("KernelCache '{name}' does not exist; kernels are compiled at run time"),
        );
    };
    let status = cache.status.clone().unwrap_or_default();
    let Some(image) = status.usable_image() else {
        let why = status
            .verification
            .as_ref()
            .and_then(|v| v.message.clone())
            .unwrap_or_else(|| "not pinned and verified yet".to_string());
        return (
            false,
            reasons::NOT_VERIFIED,
            format!("KernelCache '{name}' is not usable: {why}"),
        );
    };
    match status.ready_nodes.unwrap_or(0) {
        0 => (
            false,
            reasons::NOT_STAGED,
            format!("KernelCache '{name}' ({image}) is ready on no node yet"),
        ),
        n => (
            true,
            reasons::READY,
            format!("KernelCache '{name}' ({image}) is ready on {n} node(s)"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        KernelCacheNodeSpec, KernelCacheNodeStatus, KernelCacheSpec, KernelCacheStatus, NodeCache,
        Verification, VerificationMode,
    };

    fn node(name: &str, entries: &[(&str, &str, CacheState, Option<&str>)]) -> KernelCacheNode {
        let mut n = KernelCacheNode::new(
            name,
            KernelCacheNodeSpec {
                node_name: name.into(),
            },
        );
        n.status = Some(KernelCacheNodeStatus {
            caches: entries
                .iter()
                .map(|(cache, digest, state, message)| NodeCache {
                    namespace: "ml".into(),
                    name: (*cache).into(),
                    digest: (*digest).into(),
                    state: *state,
                    message: message.map(str::to_string),
                    ..NodeCache::default()
                })
                .collect(),
            ..KernelCacheNodeStatus::default()
        });
        n
    }

    #[test]
    fn aggregates_the_current_digest_per_state_with_names() {
        let nodes = [
            node("gpu-b", &[("vadd", "sha256:new", CacheState::Ready, None)]),
            node("gpu-a", &[("vadd", "sha256:new", CacheState::Ready, None)]),
            node(
                "gpu-c",
                &[(
                    "vadd",
                    "sha256:new",
                    CacheState::Failed,
                    Some("digest mismatch"),
                )],
            ),
            node("gpu-d", &[("vadd", "sha256:old", CacheState::Ready, None)]),
            node("gpu-e", &[("other", "sha256:new", CacheState::Ready, None)]),
            node("cpu-1", &[]),
        ];
        let a = aggregate("ml", "vadd", "sha256:new", &nodes);
        assert_eq!(a.ready, 2);
        assert_eq!(a.nodes["Ready"], ["gpu-a", "gpu-b"]);
        assert_eq!(a.nodes["Failed"], ["gpu-c"]);
        assert_eq!(a.nodes.len(), 2);
        assert_eq!(
            a.message,
            "1 Failed, 2 Ready; failed: gpu-c: digest mismatch"
        );
        let none = aggregate("ml", "vadd", "sha256:none", &nodes);
        assert_eq!(none.ready, 0);
        assert_eq!(none.message, "no node has reported this digest yet");
    }

    #[test]
    fn long_failure_lists_are_cut() {
        let long = "x".repeat(900);
        let nodes = [
            node("a", &[("vadd", "d", CacheState::Failed, Some(&long))]),
            node("b", &[("vadd", "d", CacheState::Failed, Some(&long))]),
        ];
        let a = aggregate("ml", "vadd", "d", &nodes);
        assert!(a.message.len() <= MAX_MESSAGE + 3);
        assert!(a.message.ends_with("..."));
    }

    fn cache(verified: bool, ready: i32) -> KernelCache {
        let mut c = KernelCache::new("vadd", KernelCacheSpec::default());
        c.status = Some(KernelCacheStatus {
            resolved_digest: Some("sha256:ab".into()),
            pinned_image: Some("r/c@sha256:ab".into()),
            verification: Some(Verification {
                mode: VerificationMode::Key,
                verified,
                message: (!verified).then(|| "no signature found for r/c@sha256:ab".into()),
                ..Verification::default()
            }),
            ready_nodes: Some(ready),
            ..KernelCacheStatus::default()
        });
        c
    }

    #[test]
    fn model_deployment_conditions() {
        let (ok, reason, _) = model_deployment_condition("vadd", None);
        assert_eq!((ok, reason), (false, reasons::NOT_FOUND));
        let (ok, reason, message) = model_deployment_condition("vadd", Some(&cache(false, 3)));
        assert_eq!((ok, reason), (false, reasons::NOT_VERIFIED));
        assert!(message.contains("no signature found"), "{message}");
        let (ok, reason, _) = model_deployment_condition("vadd", Some(&cache(true, 0)));
        assert_eq!((ok, reason), (false, reasons::NOT_STAGED));
        let (ok, reason, message) = model_deployment_condition("vadd", Some(&cache(true, 2)));
        assert_eq!((ok, reason), (true, reasons::READY));
        assert!(message.contains("2 node(s)"), "{message}");
    }
}
