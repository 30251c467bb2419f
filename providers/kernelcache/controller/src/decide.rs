//! The controller's pure decisions: when a pinned digest is verified (again), what a
//! failed verification leaves in place, what the nodes' reports add up to for one cache,
//! and what a ModelDeployment's `KernelCacheReady` condition says.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kubeairunway_kernelcache_api::{
    CacheState, KernelCache, KernelCacheNode, KernelCachePolicy, Verification, VerificationMode,
};
use kubeairunway_kernelcache_artifact::image::CacheImage;
use kubeairunway_kernelcache_artifact::oci::PullError;
use kubeairunway_kernelcache_signing::verify::{self, VerifyError};

/// Setting this annotation of a KernelCache to a new value makes the controller verify
/// its pinned digest again at once (e.g. after a signature was added or a key revoked).
pub const REVERIFY_ANNOTATION: &str = "cache.kubeairunway.ai/reverify";

/// The first retry of a failed verification waits this long, doubling per failure up to
/// the resync interval.
pub const FIRST_RETRY: Duration = Duration::from_secs(15);

/// A failed verification of one digest under one policy, and when to try again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retry {
    /// The digest that failed.
    pub digest: String,
    /// The policy it failed under.
    pub policy_version: String,
    /// Failures so far.
    pub attempts: u32,
    /// When to try again.
    pub at: Instant,
}

/// When to verify a pinned digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyWhen {
    /// The verdict in the status stands: same digest, same policy, passed.
    Reuse,
    /// A failure waits for its retry.
    Later(Duration),
    /// Verify now.
    Now,
}

/// Whether a verdict lets the cache be used: verified, or verification disabled by policy.
pub fn passed(v: &Verification) -> bool {
    v.verified
        || (v.mode == VerificationMode::Disabled
            && v.message.as_deref() == Some(verify::DISABLED_MESSAGE))
}

/// When to verify `digest` under the policy `policy_version`, given the verdict in the
/// status (`previous`, always about the pinned digest: re-pinning clears it), the
/// reverify annotation's value, and the pending retry. A passed verdict stands until
/// the policy changes or a reverify is asked; a failed one is retried with backoff.
pub fn verify_when(
    previous: Option<&Verification>,
    digest: &str,
    policy_version: &str,
    request: Option<&str>,
    retry: Option<&Retry>,
    now: Instant,
) -> VerifyWhen {
    let Some(previous) = previous else {
        return VerifyWhen::Now;
    };
    if previous.reverify_request.as_deref() != request {
        return VerifyWhen::Now;
    }
    if previous.policy_version.as_deref() == Some(policy_version) && passed(previous) {
        return VerifyWhen::Reuse;
    }
    match retry {
        Some(r) if r.digest == digest && r.policy_version == policy_version && r.at > now => {
            VerifyWhen::Later(r.at - now)
        }
        _ => VerifyWhen::Now,
    }
}

/// The wait before retry number `attempts` (1 after the first failure).
pub fn retry_after(attempts: u32, resync: Duration) -> Duration {
    FIRST_RETRY
        .saturating_mul(1 << attempts.saturating_sub(1).min(16))
        .min(resync.max(FIRST_RETRY))
}

/// The verdict after a verification failed with `error`: a registry that could not be
/// reached is no verdict, so a digest that passed before stays passed (an outage, or a
/// controller restarted during one, never takes a cache away from the nodes); anything
/// else is refused with its reason.
pub fn after_failure(
    previous: Option<&Verification>,
    mode: VerificationMode,
    error: &VerifyError,
) -> Verification {
    match previous {
        Some(p) if error.is_transient() && passed(p) => p.clone(),
        _ => verify::refused(mode, error),
    }
}

/// The verdict when the policy named `policy` does not exist: nothing is usable.
pub fn no_policy(policy: &str) -> Verification {
    Verification {
        mode: VerificationMode::Key,
        message: Some(format!("no KernelCachePolicy '{policy}'")),
        ..Verification::default()
    }
}

/// What a verdict records of the policy it was reached under: `<uid>/<generation>`, so
/// that any change of the policy (or a policy deleted and created again) verifies anew.
pub fn policy_version(policy: &KernelCachePolicy) -> String {
    format!(
        "{}/{}",
        policy.metadata.uid.as_deref().unwrap_or_default(),
        policy.metadata.generation.unwrap_or_default()
    )
}

/// The verdict from a signature check (`signature`) and the image's labels (`image`):
/// the cache type is known only for a cache image; a failed check keeps a passed verdict
/// through an outage ([`after_failure`]), with the cache type it had (`kept_type`); an
/// unreachable registry while reading labels is an outage too; an image that is not a
/// cache is refused even when signed.
pub fn judge(
    previous: Option<&Verification>,
    mode: VerificationMode,
    kept_type: Option<&String>,
    signature: Result<Verification, VerifyError>,
    image: Result<CacheImage, PullError>,
) -> (Verification, Option<String>) {
    match (signature, image) {
        (Ok(v), Ok(image)) => (v, Some(image.cache_type.as_str().to_string())),
        (Err(e), image) => {
            let kept = after_failure(previous, mode, &e);
            let cache_type = if passed(&kept) {
                kept_type.cloned()
            } else {
                // The reason shown: not a cache image before an unverified one.
                image
                    .ok()
                    .map(|image| image.cache_type.as_str().to_string())
            };
            (kept, cache_type)
        }
        (Ok(_), Err(e)) if e.is_transient() => {
            let e = VerifyError::Unavailable(e.to_string());
            let kept = after_failure(previous, mode, &e);
            let cache_type = passed(&kept).then(|| kept_type.cloned()).flatten();
            (kept, cache_type)
        }
        (Ok(v), Err(not_a_cache)) => (
            Verification {
                verified: false,
                message: Some(format!("not usable: {not_a_cache}")),
                ..v
            },
            None,
        ),
    }
}

/// The retry pending after a verification of `digest` under `policy_version`: none when
/// it passed (`passed`), else one more attempt than `pending` counted for the same digest
/// and policy, due after [`retry_after`].
pub fn next_retry(
    passed: bool,
    pending: Option<&Retry>,
    digest: &str,
    policy_version: &str,
    resync: Duration,
    now: Instant,
) -> Option<Retry> {
    if passed {
        return None;
    }
    let attempts = pending
        .filter(|r| r.digest == digest && r.policy_version == policy_version)
        .map_or(0, |r| r.attempts)
        + 1;
    Some(Retry {
        digest: digest.to_string(),
        policy_version: policy_version.to_string(),
        attempts,
        at: now + retry_after(attempts, resync),
    })
}

/// The event announcing a new verdict on `pinned`: (warning, reason, note).
pub fn verification_event(
    pinned: &str,
    verification: &Verification,
    is_cache: bool,
) -> (bool, &'static str, String) {
    match (verification.verified, verification.mode) {
        (true, _) => (
            false,
            reasons::VERIFIED,
            format!(
                "{pinned} verified; signer {}",
                verification.signer.clone().unwrap_or_default()
            ),
        ),
        (false, VerificationMode::Disabled) if is_cache => (
            true,
            reasons::VERIFICATION_DISABLED,
            format!(
                "{pinned} used without signature verification: {}",
                verify::DISABLED_MESSAGE
            ),
        ),
        (false, _) => (
            true,
            reasons::VERIFICATION_FAILED,
            format!(
                "{pinned} refused: {}",
                verification.message.clone().unwrap_or_default()
            ),
        ),
    }
}

/// The `Verified` condition of a pinned image: whether nodes may use it, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// Whether nodes may use the image.
    pub usable: bool,
    /// The condition's reason ([`reasons`]).
    pub reason: &'static str,
    /// The condition's message.
    pub message: String,
}

/// The verdict on a pinned image after `verification`: refused without a policy and when
/// the image is not a cache image; usable when a signature satisfied the policy, or
/// unverified under mode `disabled`; refused otherwise. The controller's `Verified`
/// condition and `kubeairunway cache verify` both say this.
pub fn verdict(policy_found: bool, is_cache: bool, verification: &Verification) -> Verdict {
    let message = || verification.message.clone().unwrap_or_default();
    let disabled = verification.mode == VerificationMode::Disabled && !verification.verified;
    let (usable, reason, message) = if !policy_found {
        (false, reasons::NO_POLICY, message())
    } else if !is_cache {
        (false, reasons::NOT_A_CACHE, message())
    } else if verification.verified {
        (
            true,
            reasons::VERIFIED,
            format!(
                "signed by {}",
                verification.signer.clone().unwrap_or_default()
            ),
        )
    } else if disabled {
        (
            true,
            reasons::VERIFICATION_DISABLED,
            verify::DISABLED_MESSAGE.to_string(),
        )
    } else {
        (false, reasons::VERIFICATION_FAILED, message())
    };
    Verdict {
        usable,
        reason,
        message,
    }
}

/// Condition reasons of the controller.
pub mod reasons {
    /// The tag resolved and the digest is pinned.
    pub const PINNED: &str = "Pinned";
    /// The tag could not be resolved (registry down, no such image, no access).
    pub const RESOLVE_FAILED: &str = "ResolveFailed";
    /// The image is from a registry the cluster operator does not allow.
    pub const REGISTRY_NOT_ALLOWED: &str = "RegistryNotAllowed";
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

/// `Ready` of a KernelCache: (status, reason, message) from whether its pin is usable and
/// what the nodes report.
pub fn ready_condition(usable: bool, nodes: &Aggregate) -> (bool, &'static str, String) {
    match (usable, nodes.ready) {
        (false, _) => (
            false,
            reasons::NOT_VERIFIED,
            "not usable: see the Verified condition".to_string(),
        ),
        (true, 0) => (false, reasons::NOT_STAGED, nodes.message.clone()),
        (true, _) => (true, reasons::STAGED, nodes.message.clone()),
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
    use kubeairunway_kernelcache_api::{
        KernelCacheNodeSpec, KernelCacheNodeStatus, KernelCacheSpec, KernelCacheStatus, NodeCache,
        Verification, VerificationMode,
    };

    #[test]
    fn verdicts_follow_policy_image_and_signature() {
        let signed = Verification {
            mode: VerificationMode::Key,
            verified: true,
            signer: Some("sha256:0123456789abcdef".into()),
            ..Verification::default()
        };
        let refused = Verification {
            mode: VerificationMode::Key,
            message: Some("no signature found for r/x@sha256:00".into()),
            ..Verification::default()
        };
        let disabled = Verification {
            mode: VerificationMode::Disabled,
            message: Some(verify::DISABLED_MESSAGE.into()),
            ..Verification::default()
        };
        let v = super::verdict(true, true, &signed);
        assert_eq!(
            (v.usable, v.reason, v.message.as_str()),
            (true, reasons::VERIFIED, "signed by sha256:0123456789abcdef")
        );
        let v = super::verdict(true, true, &refused);
        assert_eq!(
            (v.usable, v.reason, v.message.as_str()),
            (
                false,
                reasons::VERIFICATION_FAILED,
                "no signature found for r/x@sha256:00"
            )
        );
        let v = super::verdict(true, true, &disabled);
        assert_eq!((v.usable, v.reason), (true, reasons::VERIFICATION_DISABLED));
        // Not a cache image: refused even when signed or unverified by policy.
        assert_eq!(
            super::verdict(true, false, &signed).reason,
            reasons::NOT_A_CACHE
        );
        assert!(!super::verdict(true, false, &disabled).usable);
        // No policy: nothing is usable.
        let v = super::verdict(false, true, &signed);
        assert_eq!((v.usable, v.reason), (false, reasons::NO_POLICY));
    }

    fn node(name: &str, entries: &[(&str, &str, CacheState, Option<&str>)]) -> KernelCacheNode {
        let mut n = KernelCacheNode::new(
            name,
            KernelCacheNodeSpec {
                node_name: name.into(),
                in_use: None,
                credentials_key: None,
                model_downloads: None,
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
            node(
                "gpu-f",
                &[(
                    "vadd",
                    "sha256:new",
                    CacheState::Evicted,
                    Some("evicted from this node to make room for ml/other@sha256:new"),
                )],
            ),
            node("cpu-1", &[]),
        ];
        let a = aggregate("ml", "vadd", "sha256:new", &nodes);
        assert_eq!(a.ready, 2, "an evicted cache is not ready there");
        assert_eq!(a.nodes["Ready"], ["gpu-a", "gpu-b"]);
        assert_eq!(a.nodes["Failed"], ["gpu-c"]);
        assert_eq!(a.nodes["Evicted"], ["gpu-f"]);
        assert_eq!(a.nodes.len(), 3);
        assert_eq!(
            a.message,
            "1 Evicted, 1 Failed, 2 Ready; failed: gpu-c: digest mismatch"
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

    fn verdict(verified: bool, policy: &str, request: Option<&str>) -> Verification {
        Verification {
            mode: VerificationMode::Key,
            verified,
            policy_version: Some(policy.into()),
            reverify_request: request.map(str::to_string),
            message: (!verified).then(|| "no signature found".into()),
            ..Verification::default()
        }
    }

    #[test]
    fn passed_verdicts_stand_failed_ones_are_retried_with_backoff() {
        let now = Instant::now();
        let ok = verdict(true, "u/1", None);
        let failed = verdict(false, "u/1", None);
        assert_eq!(
            verify_when(None, "d", "u/1", None, None, now),
            VerifyWhen::Now
        );
        assert_eq!(
            verify_when(Some(&ok), "d", "u/1", None, None, now),
            VerifyWhen::Reuse
        );
        // Another policy, or a reverify asked: again.
        assert_eq!(
            verify_when(Some(&ok), "d", "u/2", None, None, now),
            VerifyWhen::Now
        );
        assert_eq!(
            verify_when(Some(&ok), "d", "u/1", Some("1"), None, now),
            VerifyWhen::Now
        );
        let asked = verdict(true, "u/1", Some("1"));
        assert_eq!(
            verify_when(Some(&asked), "d", "u/1", Some("1"), None, now),
            VerifyWhen::Reuse
        );
        // A failure waits for its retry, and is retried once due (or after a restart,
        // when no retry is known).
        let retry = Retry {
            digest: "d".into(),
            policy_version: "u/1".into(),
            attempts: 1,
            at: now + Duration::from_secs(15),
        };
        assert_eq!(
            verify_when(Some(&failed), "d", "u/1", None, Some(&retry), now),
            VerifyWhen::Later(Duration::from_secs(15))
        );
        assert_eq!(
            verify_when(
                Some(&failed),
                "d",
                "u/1",
                None,
                Some(&retry),
                now + Duration::from_secs(16)
            ),
            VerifyWhen::Now
        );
        assert_eq!(
            verify_when(Some(&failed), "d", "u/1", None, None, now),
            VerifyWhen::Now
        );
        assert_eq!(
            verify_when(Some(&failed), "other", "u/1", None, Some(&retry), now),
            VerifyWhen::Now
        );
        let resync = Duration::from_secs(300);
        assert_eq!(retry_after(1, resync), Duration::from_secs(15));
        assert_eq!(retry_after(3, resync), Duration::from_secs(60));
        assert_eq!(retry_after(10, resync), resync);
    }

    #[test]
    fn an_unreachable_registry_never_takes_a_passed_verdict_away() {
        let ok = verdict(true, "u/1", None);
        let outage = VerifyError::Unavailable("fetching manifest: 503 Service Unavailable".into());
        assert_eq!(after_failure(Some(&ok), VerificationMode::Key, &outage), ok);
        let refused = after_failure(None, VerificationMode::Key, &outage);
        assert!(!refused.verified);
        assert_eq!(
            refused.message.as_deref(),
            Some("registry unavailable: fetching manifest: 503 Service Unavailable")
        );
        // A real verdict replaces the earlier one.
        let no_sig = VerifyError::NoSignature("r/c@sha256:ab".into());
        assert!(!after_failure(Some(&ok), VerificationMode::Key, &no_sig).verified);
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

    #[test]
    fn ready_needs_a_usable_pin_and_a_ready_node() {
        let agg = |ready| Aggregate {
            nodes: BTreeMap::new(),
            ready,
            message: format!("{ready} Ready"),
        };
        assert_eq!(ready_condition(false, &agg(3)).1, reasons::NOT_VERIFIED);
        assert_eq!(
            ready_condition(true, &agg(0)),
            (false, reasons::NOT_STAGED, "0 Ready".to_string())
        );
        assert_eq!(
            ready_condition(true, &agg(2)),
            (true, reasons::STAGED, "2 Ready".to_string())
        );
    }
    fn triton() -> CacheImage {
        CacheImage {
            cache_type: kubeairunway_kernelcache_artifact::image::CacheType::Triton,
            entry_count: Some(1),
            size_bytes: Some(10),
            targets: Vec::new(),
        }
    }

    fn registry_down() -> PullError {
        PullError::Registry(kubeairunway_kernelcache_artifact::registry::RegistryError {
            transient: true,
            not_found: false,
            message: "503".into(),
        })
    }

    #[test]
    fn judged_verdicts_need_a_signature_and_a_cache_image() {
        let ok = verdict(true, "u/1", None);
        let kept = Some(&"triton".to_string());
        // Signed cache image.
        let (v, t) = judge(
            None,
            VerificationMode::Key,
            None,
            Ok(ok.clone()),
            Ok(triton()),
        );
        assert_eq!((v.verified, t.as_deref()), (true, Some("triton")));
        // Signed, but not a cache image: refused with the reason.
        let (v, t) = judge(
            None,
            VerificationMode::Key,
            None,
            Ok(ok.clone()),
            Err(PullError::Image(
                kubeairunway_kernelcache_artifact::image::ImageError::NotACache,
            )),
        );
        assert!(!v.verified && t.is_none());
        assert!(
            v.message
                .unwrap()
                .starts_with("not usable: not a kernel cache image")
        );
        // Unsigned cache image: refused, the type still shown.
        let (v, t) = judge(
            None,
            VerificationMode::Key,
            None,
            Err(VerifyError::NoSignature("r@sha256:00".into())),
            Ok(triton()),
        );
        assert!(!v.verified);
        assert_eq!(t.as_deref(), Some("triton"));
        // An outage while checking keeps a passed verdict and its type, either way.
        let (v, t) = judge(
            Some(&ok),
            VerificationMode::Key,
            kept,
            Err(VerifyError::Unavailable("timeout".into())),
            Err(registry_down()),
        );
        assert_eq!((v, t.as_deref()), (ok.clone(), Some("triton")));
        let (v, t) = judge(
            Some(&ok),
            VerificationMode::Key,
            kept,
            Ok(ok.clone()),
            Err(registry_down()),
        );
        assert_eq!((v, t.as_deref()), (ok, Some("triton")));
        // ... but is no verdict for a digest that never passed.
        let (v, t) = judge(
            None,
            VerificationMode::Key,
            None,
            Ok(verdict(true, "u/1", None)),
            Err(registry_down()),
        );
        assert!(!v.verified && t.is_none());
        assert!(v.message.unwrap().starts_with("registry unavailable"));
    }

    #[test]
    fn retries_count_per_digest_and_policy_and_end_when_passed() {
        let now = Instant::now();
        let resync = Duration::from_secs(300);
        let first = next_retry(false, None, "d", "u/1", resync, now).unwrap();
        assert_eq!((first.attempts, first.at - now), (1, FIRST_RETRY));
        let second = next_retry(false, Some(&first), "d", "u/1", resync, now).unwrap();
        assert_eq!((second.attempts, second.at - now), (2, FIRST_RETRY * 2));
        // Another digest or policy starts counting again.
        let other = next_retry(false, Some(&second), "e", "u/1", resync, now).unwrap();
        assert_eq!(other.attempts, 1);
        let other = next_retry(false, Some(&second), "d", "u/2", resync, now).unwrap();
        assert_eq!(other.attempts, 1);
        assert_eq!(
            next_retry(true, Some(&second), "d", "u/1", resync, now),
            None
        );
    }

    #[test]
    fn verdict_events_warn_unless_verified() {
        let ok = Verification {
            signer: Some("sha256:0123".into()),
            ..verdict(true, "u/1", None)
        };
        assert_eq!(
            verification_event("r@sha256:00", &ok, true),
            (
                false,
                reasons::VERIFIED,
                "r@sha256:00 verified; signer sha256:0123".to_string()
            )
        );
        let failed = verdict(false, "u/1", None);
        assert_eq!(
            verification_event("r@sha256:00", &failed, true),
            (
                true,
                reasons::VERIFICATION_FAILED,
                "r@sha256:00 refused: no signature found".to_string()
            )
        );
        let disabled = Verification {
            mode: VerificationMode::Disabled,
            message: Some(verify::DISABLED_MESSAGE.into()),
            ..Verification::default()
        };
        assert_eq!(
            verification_event("r@sha256:00", &disabled, true).1,
            reasons::VERIFICATION_DISABLED
        );
        // Disabled, but not a cache: refused.
        assert_eq!(
            verification_event("r@sha256:00", &disabled, false).1,
            reasons::VERIFICATION_FAILED
        );
        assert_eq!(
            no_policy("default").message.as_deref(),
            Some("no KernelCachePolicy 'default'")
        );
    }
}
