//! The controller's pure decisions about ModelCaches: what the nodes' reports add up to
//! for one cache (entries about an older generation are not counted), and the status
//! that follows, with its `Accepted` and `Ready` conditions.

use std::collections::BTreeMap;

use kube::ResourceExt as _;
use kubeairunway_kernelcache_api::model::{
    self, ModelCache, ModelCacheState, ModelCacheStatus, NotChosen, Source, conditions,
    deployment_reasons, model_uses, parse_source, reasons,
};
use kubeairunway_kernelcache_api::{KernelCacheNode, Verification, VerificationMode};
use kubeairunway_kernelcache_signing::verify::VerifyError;
use kubeairunway_sdk::api::ModelSpec;

/// What the nodes report about one ModelCache's current generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Aggregate {
    /// Node names per state (`Ready`, `Downloading`, `Failed`).
    pub nodes: BTreeMap<String, Vec<String>>,
    /// The commit most ready nodes hold (else the one most nodes resolved).
    pub commit: Option<String>,
    /// The bytes a ready node holds.
    pub size: Option<i64>,
    /// The failed nodes' (node, reason, message), by node name.
    pub failures: Vec<(String, String, String)>,
}

impl Aggregate {
    fn count(&self, state: ModelCacheState) -> i32 {
        self.nodes
            .get(state.as_str())
            .map_or(0, |n| i32::try_from(n.len()).unwrap_or(i32::MAX))
    }
}

/// The reports of `reports` about `namespace/name` at `generation`.
pub fn aggregate(
    namespace: &str,
    name: &str,
    generation: Option<i64>,
    reports: &[&KernelCacheNode],
) -> Aggregate {
    let mut agg = Aggregate::default();
    let mut ready_commits: BTreeMap<&str, usize> = BTreeMap::new();
    let mut commits: BTreeMap<&str, usize> = BTreeMap::new();
    let mut sorted: Vec<&KernelCacheNode> = reports.to_vec();
    sorted.sort_by_key(|n| n.name_any());
    for node in sorted {
        let Some(entry) = node.status.as_ref().and_then(|s| {
            s.model_caches
                .iter()
                .find(|e| e.namespace == namespace && e.name == name)
        }) else {
            continue;
        };
        if generation.is_some() && entry.observed_generation != generation {
            continue;
        }
        let node_name = node.name_any();
        agg.nodes
            .entry(entry.state.as_str().to_string())
            .or_default()
            .push(node_name.clone());
        if let Some(c) = entry.commit.as_deref() {
            *commits.entry(c).or_default() += 1;
            if entry.state == ModelCacheState::Ready {
                *ready_commits.entry(c).or_default() += 1;
                agg.size = agg.size.or(entry.bytes_total);
            }
        }
        if entry.state == ModelCacheState::Failed {
            agg.failures.push((
                node_name,
                entry
                    .reason
                    .clone()
                    .unwrap_or_else(|| reasons::FAILED.into()),
                entry.message.clone().unwrap_or_default(),
            ));
        }
    }
    let most = |m: &BTreeMap<&str, usize>| {
        m.iter()
            .max_by_key(|(_, n)| **n)
            .map(|(c, _)| (*c).to_string())
    };
    agg.commit = most(&ready_commits).or_else(|| most(&commits));
    agg
}

/// Whether the spec can be acted on: (accepted, reason, message). `credentials` is why
/// the hub token could not be handed over, when it could not.
pub fn accepted(cache: &ModelCache, credentials: Option<&str>) -> (bool, &'static str, String) {
    let source = parse_source(&cache.spec.source);
    match (source, credentials) {
        (Ok(Source::Oci(_)), _)
            if cache
                .spec
                .credentials_secret_ref
                .as_ref()
                .is_some_and(|r| r.key.is_some()) =>
        {
            (
                false,
                reasons::INVALID_SPEC,
                "credentialsSecretRef of an oci:// source names a kubernetes.io/dockerconfigjson Secret, without key".into(),
            )
        }
        (Err(e), _) => (false, reasons::INVALID_SPEC, e),
        (Ok(_), Some(why)) => (false, reasons::CREDENTIALS_MISSING, why.to_string()),
        (Ok(Source::Oci(_)), None) => (
            true,
            reasons::ACCEPTED,
            "the nodes pull it by digest".into(),
        ),
        (Ok(Source::Hf(_)), None) => (true, reasons::ACCEPTED, "the nodes download it".into()),
    }
}

/// The controller's verdict on an `oci://` cache's pinned manifest digest.
#[derive(Clone, Debug, PartialEq)]
pub struct OciVerdict {
    /// The digest it is about.
    pub digest: String,
    /// Whether a `KernelCachePolicy` applies (none: digest only).
    pub policy_found: bool,
    /// The verdict, in the KernelCache status's shape.
    pub verification: Verification,
}

/// The verification recorded when no `KernelCachePolicy` named `policy` exists: the nodes
/// pull the digest without a signature check (mode `disabled`, saying so).
pub fn digest_only(policy: &str) -> Verification {
    Verification {
        mode: VerificationMode::Disabled,
        verified: false,
        message: Some(format!(
            "no KernelCachePolicy '{policy}': pulled by its digest only, no signature checked"
        )),
        ..Verification::default()
    }
}

/// The `Verified` condition of an `oci://` cache: (whether the nodes may pull it, reason,
/// message). Without a policy, `DigestOnly`; under one, the KernelCaches' rule
/// ([`crate::decide::verdict`] and [`crate::decide::passed`]: verified, disabled by the
/// policy, or refused).
pub fn verified_condition(v: &OciVerdict) -> (bool, &'static str, String) {
    if !v.policy_found {
        return (
            true,
            reasons::DIGEST_ONLY,
            v.verification.message.clone().unwrap_or_default(),
        );
    }
    let d = crate::decide::verdict(true, true, &v.verification);
    // `disabled` passes only as the policy's own answer (not a digest-only verdict).
    if d.usable && !crate::decide::passed(&v.verification) {
        let message = v.verification.message.clone().unwrap_or_default();
        return (false, reasons::VERIFICATION_FAILED, message);
    }
    (d.usable, d.reason, d.message)
}

/// The verdict after a signature check of an `oci://` digest: a registry that could not
/// be reached keeps a passed `previous` verdict (as for KernelCaches,
/// [`crate::decide::after_failure`]); any other failure refuses.
pub fn judge_oci(
    previous: Option<&Verification>,
    mode: VerificationMode,
    result: Result<Verification, VerifyError>,
) -> Verification {
    match result {
        Ok(v) => v,
        Err(e) => crate::decide::after_failure(previous, mode, &e),
    }
}

/// `status` with the verdict recorded (`verification`, the `Verified` condition, and
/// `verifiedDigest` only when the nodes may pull it); a refusal makes `Ready=False` with
/// `VerificationFailed`, whatever the nodes report.
pub fn record_verdict(status: &mut ModelCacheStatus, v: &OciVerdict, generation: Option<i64>) {
    let (ok, reason, message) = verified_condition(v);
    kubeairunway_sdk::conditions::set(
        &mut status.conditions,
        conditions::VERIFIED,
        ok,
        reason,
        message.clone(),
        generation,
    );
    status.verification = Some(v.verification.clone());
    status.verified_digest = ok.then(|| v.digest.clone());
    if !ok {
        kubeairunway_sdk::conditions::set(
            &mut status.conditions,
            conditions::READY,
            false,
            reasons::VERIFICATION_FAILED,
            message,
            generation,
        );
    }
}

/// The `Ready` condition: (ready, reason, message). Ready when at least one node holds
/// the current generation; else why not (the first failed node's reason when every node
/// that reports it failed).
pub fn ready(
    accepted: (bool, &'static str, &str),
    agg: &Aggregate,
) -> (bool, &'static str, String) {
    let (ok, reason, message) = accepted;
    if !ok && reason == reasons::INVALID_SPEC {
        return (false, reason, message.to_string());
    }
    let ready = agg.count(ModelCacheState::Ready);
    let downloading = agg.count(ModelCacheState::Downloading);
    let failed = agg.count(ModelCacheState::Failed);
    let total = ready + downloading + failed;
    let failures = || {
        agg.failures
            .iter()
            .map(|(node, reason, message)| format!("{node}: {reason}: {message}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    if ready > 0 {
        let m = format!("ready on {ready} of {total} nodes");
        if failed > 0 {
            return (
                true,
                reasons::READY,
                format!("{m} (failed: {})", failures()),
            );
        }
        return (true, reasons::READY, m);
    }
    if downloading > 0 {
        return (
            false,
            reasons::DOWNLOADING,
            format!("downloading on {downloading} of {total} nodes"),
        );
    }
    match agg.failures.first() {
        Some((_, reason, _)) => (false, failure_reason(reason), failures()),
        None => (
            false,
            reasons::NO_NODES,
            "no node reports it: none matches the nodeSelector, or no agent runs there".into(),
        ),
    }
}

/// A node's reason as one of the constants (an unknown one is `Failed`).
fn failure_reason(reason: &str) -> &'static str {
    [
        reasons::NO_SPACE,
        reasons::OVER_BUDGET,
        reasons::GATED,
        reasons::UNAUTHORIZED,
        reasons::NOT_FOUND,
        reasons::CREDENTIALS_MISSING,
        reasons::VERIFICATION_FAILED,
        reasons::INVALID_SPEC,
        reasons::DOWNLOAD_FAILED,
        reasons::UNSUPPORTED_MEDIA_TYPE,
        reasons::INVALID_ARTIFACT,
        reasons::REGISTRY_NOT_ALLOWED,
        reasons::UNSAFE_ARCHIVE,
    ]
    .into_iter()
    .find(|r| *r == reason)
    .unwrap_or(reasons::FAILED)
}

/// The status of `cache` from the reports (`previous`: its conditions keep their
/// transition times).
pub fn status(
    cache: &ModelCache,
    previous: Option<&ModelCacheStatus>,
    reports: &[&KernelCacheNode],
    credentials: Option<&str>,
) -> ModelCacheStatus {
    let generation = cache.metadata.generation;
    let agg = aggregate(
        &cache.namespace().unwrap_or_default(),
        &cache.name_any(),
        generation,
        reports,
    );
    let mut status = ModelCacheStatus {
        conditions: previous.map(|p| p.conditions.clone()).unwrap_or_default(),
        ..ModelCacheStatus::default()
    };
    let (ok, reason, message) = accepted(cache, credentials);
    kubeairunway_sdk::conditions::set(
        &mut status.conditions,
        conditions::ACCEPTED,
        ok,
        reason,
        message.clone(),
        generation,
    );
    let (is_ready, why, detail) = ready((ok, reason, &message), &agg);
    kubeairunway_sdk::conditions::set(
        &mut status.conditions,
        conditions::READY,
        is_ready,
        why,
        detail,
        generation,
    );
    status.ready_nodes = agg.count(ModelCacheState::Ready);
    status.downloading_nodes = agg.count(ModelCacheState::Downloading);
    status.failed_nodes = agg.count(ModelCacheState::Failed);
    status.resolved_commit = agg.commit;
    status.size_bytes = agg.size;
    status.nodes = agg.nodes;
    status.observed_generation = generation;
    status
}

/// What a ModelCache's deletion does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// ModelDeployments (their names, sorted) still use it: the finalizer stays, and
    /// `Deleting=True`/`InUse` names them.
    Held(Vec<String>),
    /// No user left: its volume and claim go, then the finalizer (the agents remove the
    /// files once the object is gone; the controller does not wait for nodes, a node that
    /// is gone would hold it for ever).
    Release,
}

/// Who holds a deleted `cache`: the ModelDeployments of its namespace, among `mds`
/// (namespace, name, model), that use it by [`model_uses`] (being deleted included: their
/// pods may still mount it).
pub fn deletion<'a>(
    cache: &ModelCache,
    mds: impl IntoIterator<Item = (&'a str, &'a str, &'a ModelSpec)>,
) -> Deletion {
    let namespace = cache.namespace().unwrap_or_default();
    let name = cache.name_any();
    let mut users: Vec<String> = mds
        .into_iter()
        .filter(|(ns, _, model)| *ns == namespace && model_uses(model, &name, &cache.spec))
        .map(|(_, md, _)| md.to_string())
        .collect();
    users.sort();
    users.dedup();
    if users.is_empty() {
        Deletion::Release
    } else {
        Deletion::Held(users)
    }
}

/// The message of `Deleting=True`/`InUse` naming the users.
pub fn in_use_message(users: &[String]) -> String {
    format!(
        "in use by ModelDeployments {}: delete them or point them elsewhere",
        users.join(", ")
    )
}

/// `status` with `Deleting=True`/`InUse` naming `users`.
pub fn held(
    mut status: ModelCacheStatus,
    users: &[String],
    generation: Option<i64>,
) -> ModelCacheStatus {
    kubeairunway_sdk::conditions::set(
        &mut status.conditions,
        conditions::DELETING,
        true,
        reasons::IN_USE,
        in_use_message(users),
        generation,
    );
    status
}

/// A ModelDeployment's `ModelCacheReady` (status, reason, message) for a model `model`,
/// among its namespace's `caches`: whether pods started now mount a cache
/// ([`model::choose`], the pod webhook's rule), and why not when it names one or one holds
/// its model. `None`: no cache concerns it, no condition.
pub fn model_deployment_condition<C: std::borrow::Borrow<ModelCache>>(
    model: &ModelSpec,
    caches: &[C],
) -> Option<(bool, &'static str, String)> {
    match model::choose(model, caches) {
        Ok(c) => Some((
            true,
            deployment_reasons::READY,
            format!(
                "ModelCache '{}' holds {} at commit {} on {} node(s): serving pods mount it \
                 read-only, are scheduled only there and load the model offline",
                c.name, c.repo, c.commit, c.ready_nodes
            ),
        )),
        Err(NotChosen::NotFound(name)) => Some((
            false,
            deployment_reasons::NOT_FOUND,
            format!(
                "ModelCache '{name}' does not exist: serving pods download the model themselves"
            ),
        )),
        Err(NotChosen::NotReady(name)) => {
            let why = caches
                .iter()
                .map(std::borrow::Borrow::borrow)
                .find(|c: &&ModelCache| c.name_any() == name)
                .and_then(|c| c.status.as_ref())
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == conditions::READY))
                .map(|c| format!(" ({}: {})", c.reason, c.message))
                .unwrap_or_default();
            Some((
                false,
                deployment_reasons::NOT_READY,
                format!(
                    "ModelCache '{name}' is not Ready{why}: serving pods started now download \
                     the model themselves"
                ),
            ))
        }
        Err(NotChosen::NoCache) => None,
    }
}

/// The download slots of one ModelCache to change on the nodes: a node in `grant` gets
/// the slot of the cache's current generation in its `spec.modelDownloads`, a node in
/// `release` loses the cache's slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slots {
    /// Nodes that get a slot now, by name.
    pub grant: Vec<String>,
    /// Nodes whose slot goes, by name.
    pub release: Vec<String>,
}

/// The download slots of the cache `namespace/name` at `generation`, bounded across nodes
/// by `max_nodes` (`spec.download.maxNodes`; none: no bound, every slot goes).
///
/// - A node **holds** its slot while its report says `Downloading` for the current
///   generation (queued or downloading), or `Ready` with `DownloadQueued`/`Refreshing`
///   (a refresh of a moving revision), and its grant is for that generation.
/// - Every other grant is **released**: the node is `Ready` or `Failed` (a failed node
///   asks again at its retry, behind the nodes already waiting), its entry is gone or of
///   another generation, or the cache lost its bound. A node that is gone takes its
///   grant with it (its KernelCacheNode goes with the Node it is owned by); a report left
///   behind by one (not in `nodes`, the Nodes that exist; none: unknown) neither holds
///   nor asks, and its grant is released.
/// - The free slots go to the **waiting** nodes (`Downloading`/`DownloadQueued` at the
///   current generation, no slot) in the order they started waiting (the entry's
///   `lastTransitionTime`, then the node's name), so no node is passed over for ever.
///
/// Nodes whose files are complete never ask (the agent asks only when bytes are
/// missing), so they never wait for a slot.
pub fn download_slots(
    namespace: &str,
    name: &str,
    generation: Option<i64>,
    max_nodes: Option<u32>,
    reports: &[&KernelCacheNode],
    nodes: Option<&std::collections::BTreeSet<String>>,
) -> Slots {
    let key = model::slot_key(namespace, name);
    let mut slots = Slots::default();
    let mut holders = 0usize;
    let mut waiting: Vec<(Option<k8s_openapi::jiff::Timestamp>, String)> = Vec::new();
    for node in reports {
        let node_name = node.name_any();
        // A report left behind by a Node that is gone holds nothing and asks for nothing.
        let exists = nodes.is_none_or(|n| n.contains(&node_name));
        let granted = node
            .spec
            .model_downloads
            .as_ref()
            .and_then(|g| g.get(&key))
            .copied();
        let entry = node.status.as_ref().and_then(|s| {
            s.model_caches
                .iter()
                .find(|e| e.namespace == namespace && e.name == name)
        });
        // Downloading, or Ready at the commit in use while a refresh of a moving revision
        // waits for a slot or downloads the new commit.
        let current = entry.filter(|_| exists).filter(|e| {
            let refresh = e.state == ModelCacheState::Ready
                && matches!(
                    e.reason.as_deref(),
                    Some(reasons::DOWNLOAD_QUEUED | reasons::REFRESHING)
                );
            generation.is_some()
                && e.observed_generation == generation
                && (e.state == ModelCacheState::Downloading || refresh)
        });
        let holds = max_nodes.is_some() && current.is_some() && granted == generation;
        if holds {
            holders += 1;
        } else if granted.is_some() {
            slots.release.push(node_name.clone());
        }
        if let Some(e) = current.filter(|e| {
            !holds && max_nodes.is_some() && e.reason.as_deref() == Some(reasons::DOWNLOAD_QUEUED)
        }) {
            let since = e.last_transition_time.as_ref().map(|t| t.0);
            waiting.push((since, node_name));
        }
    }
    // Unknown times last: a report without one is the odd one out, not the first.
    waiting.sort_by(|(a, an), (b, bn)| (a.is_none(), a, an).cmp(&(b.is_none(), b, bn)));
    let free = max_nodes.map_or(0, |m| (m as usize).saturating_sub(holders));
    slots.grant = waiting.into_iter().take(free).map(|(_, n)| n).collect();
    slots.grant.sort();
    slots.release.sort();
    slots
}

/// The merge patch of a node's `spec.modelDownloads` that grants (`Some(generation)`) or
/// releases (`None`) the slot of `key`.
pub fn slot_patch(key: &str, generation: Option<i64>) -> serde_json::Value {
    serde_json::json!({"spec": {"modelDownloads": {key: generation}}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_kernelcache_api::model::{ModelCacheSpec, NodeModelCache};
    use kubeairunway_kernelcache_api::{KernelCacheNodeSpec, KernelCacheNodeStatus};

    /// `ModelCacheReady`: which cache pods mount, or why the one named or holding the
    /// model is not used; nothing when no cache concerns the ModelDeployment.
    #[test]
    fn model_cache_ready_says_whether_pods_mount_a_cache_and_why_not() {
        use kubeairunway_sdk::api::ModelCacheRef;
        let model = |id: &str, named: Option<&str>| ModelSpec {
            id: Some(id.into()),
            cache_ref: named.map(|n| ModelCacheRef { name: n.into() }),
            ..ModelSpec::default()
        };
        let ready = |ready_nodes: i32| {
            let mut c = cache("hf://Qwen/Qwen3");
            let mut status = ModelCacheStatus {
                claim_name: Some("modelcache-qwen".into()),
                resolved_commit: Some("abc".into()),
                ready_nodes,
                observed_generation: Some(2),
                ..ModelCacheStatus::default()
            };
            let (reason, message) = if ready_nodes > 0 {
                (reasons::READY, "1 Ready")
            } else {
                (reasons::DOWNLOADING, "1 Downloading")
            };
            kubeairunway_sdk::conditions::set(
                &mut status.conditions,
                conditions::READY,
                ready_nodes > 0,
                reason,
                message.to_string(),
                Some(2),
            );
            c.status = Some(status);
            c
        };
        let (ok, reason, message) =
            model_deployment_condition(&model("Qwen/Qwen3", None), &[ready(1)]).unwrap();
        assert!(ok);
        assert_eq!(reason, deployment_reasons::READY);
        assert!(
            message.contains("'qwen' holds Qwen/Qwen3 at commit abc on 1 node"),
            "{message}"
        );
        let (ok, reason, message) =
            model_deployment_condition(&model("Qwen/Qwen3", None), &[ready(0)]).unwrap();
        assert!(!ok);
        assert_eq!(reason, deployment_reasons::NOT_READY);
        assert!(
            message.contains("(Downloading: 1 Downloading)"),
            "{message}"
        );
        let (ok, reason, _) =
            model_deployment_condition(&model("x/y", Some("gone")), &[ready(1)]).unwrap();
        assert!(!ok);
        assert_eq!(reason, deployment_reasons::NOT_FOUND);
        assert_eq!(
            model_deployment_condition(&model("x/y", None), &[ready(1)]),
            None
        );
    }

    fn cache(source: &str) -> ModelCache {
        let mut c = ModelCache::new(
            "qwen",
            ModelCacheSpec {
                source: source.into(),
                ..ModelCacheSpec::default()
            },
        );
        c.metadata.namespace = Some("ml".into());
        c.metadata.generation = Some(2);
        c
    }

    fn report(node: &str, entries: Vec<NodeModelCache>) -> KernelCacheNode {
        let mut n = KernelCacheNode::new(
            node,
            KernelCacheNodeSpec {
                node_name: node.into(),
                in_use: None,
                credentials_key: None,
                model_downloads: None,
            },
        );
        n.status = Some(KernelCacheNodeStatus {
            model_caches: entries,
            ..KernelCacheNodeStatus::default()
        });
        n
    }

    fn entry(state: ModelCacheState, reason: &str, generation: i64) -> NodeModelCache {
        NodeModelCache {
            namespace: "ml".into(),
            name: "qwen".into(),
            observed_generation: Some(generation),
            commit: Some("c2".into()),
            state,
            reason: Some(reason.into()),
            message: Some(format!("{reason} here")),
            bytes_total: Some(42),
            ..NodeModelCache::default()
        }
    }

    fn condition<'a>(s: &'a ModelCacheStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
        let c = s.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn ready_nodes_of_the_current_generation_make_it_ready() {
        let a = report("a", vec![entry(ModelCacheState::Ready, reasons::READY, 2)]);
        let b = report(
            "b",
            vec![entry(ModelCacheState::Failed, reasons::NO_SPACE, 2)],
        );
        let old = report("c", vec![entry(ModelCacheState::Ready, reasons::READY, 1)]);
        let none = report("d", vec![]);
        let s = status(&cache("hf://o/m"), None, &[&b, &a, &old, &none], None);
        assert_eq!(s.ready_nodes, 1);
        assert_eq!(s.failed_nodes, 1);
        assert_eq!(s.downloading_nodes, 0);
        assert_eq!(s.resolved_commit.as_deref(), Some("c2"));
        assert_eq!(s.size_bytes, Some(42));
        assert_eq!(s.nodes["Ready"], ["a"]);
        assert_eq!(s.observed_generation, Some(2));
        let (st, reason, message) = condition(&s, conditions::READY);
        assert_eq!((st, reason), ("True", reasons::READY));
        assert!(
            message.contains("1 of 2") && message.contains("b: NoSpace"),
            "{message}"
        );
        assert_eq!(condition(&s, conditions::ACCEPTED).1, reasons::ACCEPTED);
    }

    #[test]
    fn without_a_ready_node_the_reason_says_why() {
        let gated = report("a", vec![entry(ModelCacheState::Failed, reasons::GATED, 2)]);
        let s = status(&cache("hf://o/m"), None, &[&gated], None);
        let (st, reason, message) = condition(&s, conditions::READY);
        assert_eq!((st, reason), ("False", reasons::GATED));
        assert!(message.contains("a: GatedRepo"), "{message}");

        let busy = report(
            "a",
            vec![entry(ModelCacheState::Downloading, reasons::DOWNLOADING, 2)],
        );
        let s = status(&cache("hf://o/m"), None, &[&busy, &gated], None);
        assert_eq!(condition(&s, conditions::READY).1, reasons::DOWNLOADING);

        let s = status(&cache("hf://o/m"), None, &[], None);
        assert_eq!(condition(&s, conditions::READY).1, reasons::NO_NODES);

        // The oci:// reasons reach the cache's condition as the nodes say them.
        for oci in [
            reasons::UNSUPPORTED_MEDIA_TYPE,
            reasons::INVALID_ARTIFACT,
            reasons::REGISTRY_NOT_ALLOWED,
            reasons::UNSAFE_ARCHIVE,
        ] {
            let failed = report("a", vec![entry(ModelCacheState::Failed, oci, 2)]);
            let s = status(&cache("hf://o/m"), None, &[&failed], None);
            assert_eq!(condition(&s, conditions::READY).1, oci);
        }

        let odd = report("a", vec![entry(ModelCacheState::Failed, "Whatever", 2)]);
        let s = status(&cache("hf://o/m"), None, &[&odd], None);
        assert_eq!(condition(&s, conditions::READY).1, reasons::FAILED);
    }

    #[test]
    fn oci_sources_are_accepted_and_missing_credentials_are_named() {
        let s = status(&cache("oci://r.example/m@sha256:ab"), None, &[], None);
        let (st, reason, _) = condition(&s, conditions::ACCEPTED);
        assert_eq!((st, reason), ("True", reasons::ACCEPTED));
        assert_eq!(condition(&s, conditions::READY).1, reasons::NO_NODES);
        // Registry credentials: a docker config Secret, without key.
        let mut with_secret = cache("oci://r.example/m@sha256:ab");
        with_secret.spec.credentials_secret_ref =
            Some(kubeairunway_kernelcache_api::model::CredentialsSecretRef::default());
        let s = status(&with_secret, None, &[], None);
        assert_eq!(condition(&s, conditions::ACCEPTED).0, "True");
        let s = status(&with_secret, None, &[], Some("no entry for r.example"));
        let (st, reason, _) = condition(&s, conditions::ACCEPTED);
        assert_eq!((st, reason), ("False", reasons::CREDENTIALS_MISSING));
        let mut with_key = with_secret.clone();
        with_key.spec.credentials_secret_ref =
            Some(kubeairunway_kernelcache_api::model::CredentialsSecretRef {
                name: "regcred".into(),
                key: Some("token".into()),
            });
        let s = status(&with_key, None, &[], None);
        let (st, reason, _) = condition(&s, conditions::ACCEPTED);
        assert_eq!((st, reason), ("False", reasons::INVALID_SPEC));
        let s = status(
            &cache("hf://o/m"),
            None,
            &[],
            Some("Secret ml/hf not found"),
        );
        let (st, reason, message) = condition(&s, conditions::ACCEPTED);
        assert_eq!((st, reason), ("False", reasons::CREDENTIALS_MISSING));
        assert_eq!(message, "Secret ml/hf not found");
        assert_eq!(condition(&s, conditions::READY).1, reasons::NO_NODES);
    }

    fn verdict(policy_found: bool, verification: Verification) -> OciVerdict {
        OciVerdict {
            digest: "sha256:ab".into(),
            policy_found,
            verification,
        }
    }

    /// The verdict on an `oci://` digest: without a policy the nodes pull it by digest
    /// only; under one, only a verified (or policy-disabled) digest is recorded for the
    /// nodes, and a refusal is `Ready=False`/`VerificationFailed` even with ready nodes.
    #[test]
    fn an_oci_digest_reaches_the_nodes_only_when_its_verdict_lets_it() {
        let ready = report("a", vec![entry(ModelCacheState::Ready, reasons::READY, 2)]);
        let c = cache("oci://r.example/m@sha256:ab");
        let passed = Verification {
            mode: VerificationMode::Key,
            verified: true,
            signer: Some("SHA256:k".into()),
            ..Verification::default()
        };
        let refused = judge_oci(
            None,
            VerificationMode::Key,
            Err(VerifyError::NoSignature("r.example/m".into())),
        );
        let disabled = judge_oci(
            None,
            VerificationMode::Disabled,
            Ok(Verification {
                mode: VerificationMode::Disabled,
                message: Some(kubeairunway_kernelcache_signing::verify::DISABLED_MESSAGE.into()),
                ..Verification::default()
            }),
        );
        for (v, pulled, reason) in [
            (
                verdict(false, digest_only("default")),
                true,
                reasons::DIGEST_ONLY,
            ),
            (verdict(true, passed.clone()), true, reasons::VERIFIED),
            (
                verdict(true, disabled),
                true,
                reasons::VERIFICATION_DISABLED,
            ),
            (
                verdict(true, refused.clone()),
                false,
                reasons::VERIFICATION_FAILED,
            ),
            // The digest-only verdict under a policy is no pass.
            (
                verdict(true, digest_only("default")),
                false,
                reasons::VERIFICATION_FAILED,
            ),
        ] {
            let mut s = status(&c, None, &[&ready], None);
            record_verdict(&mut s, &v, Some(2));
            let (st, why, _) = condition(&s, conditions::VERIFIED);
            assert_eq!((st == "True", why), (pulled, reason), "{v:?}");
            assert_eq!(s.verified_digest.is_some(), pulled, "{v:?}");
            assert_eq!(s.verification.as_ref(), Some(&v.verification));
            let (st, why, _) = condition(&s, conditions::READY);
            if pulled {
                assert_eq!((st, why), ("True", reasons::READY));
            } else {
                assert_eq!((st, why), ("False", reasons::VERIFICATION_FAILED));
            }
        }
        // An unreachable registry keeps a passed verdict, and refuses a new one.
        let outage = || Err(VerifyError::Unavailable("down".into()));
        assert_eq!(
            judge_oci(Some(&passed), VerificationMode::Key, outage()),
            passed
        );
        assert!(!judge_oci(Some(&refused), VerificationMode::Key, outage()).verified);
    }

    /// Only the ModelDeployments of the cache's namespace that use it hold it, named in
    /// order; none left releases it.
    #[test]
    fn deletion_is_held_by_the_users_of_its_namespace_only() {
        use kubeairunway_sdk::api::{ModelCacheRef, ModelSource};
        let mut c = cache("hf://acme/tiny");
        c.metadata.namespace = Some("ns".into());
        let by_id = ModelSpec {
            id: Some("acme/tiny".into()),
            source: ModelSource::Huggingface,
            ..ModelSpec::default()
        };
        let other = ModelSpec {
            id: Some("acme/other".into()),
            ..by_id.clone()
        };
        let named = ModelSpec {
            cache_ref: Some(ModelCacheRef { name: c.name_any() }),
            ..other.clone()
        };
        let mds = [
            ("ns", "b", &by_id),
            ("ns", "a", &named),
            ("ns", "c", &other),
            ("elsewhere", "d", &by_id),
        ];
        let d = deletion(&c, mds.iter().map(|(ns, n, m)| (*ns, *n, *m)));
        assert_eq!(d, Deletion::Held(vec!["a".into(), "b".into()]));
        let status = held(
            ModelCacheStatus::default(),
            &["a".into(), "b".into()],
            Some(1),
        );
        let (ok, reason, message) = condition(&status, conditions::DELETING);
        assert_eq!((ok, reason), ("True", reasons::IN_USE));
        assert!(message.contains("ModelDeployments a, b"), "{message}");
        let rest = [("ns", "c", &other), ("elsewhere", "d", &by_id)];
        assert_eq!(
            deletion(&c, rest.iter().map(|(ns, n, m)| (*ns, *n, *m))),
            Deletion::Release
        );
    }

    fn queued(node: &str, at: i64, granted: Option<i64>) -> KernelCacheNode {
        let mut e = entry(ModelCacheState::Downloading, reasons::DOWNLOAD_QUEUED, 2);
        e.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(at).unwrap(),
        ));
        with_grant(report(node, vec![e]), granted)
    }

    fn with_grant(mut n: KernelCacheNode, granted: Option<i64>) -> KernelCacheNode {
        n.spec.model_downloads =
            granted.map(|g| BTreeMap::from([(model::slot_key("ml", "qwen"), g)]));
        n
    }

    fn slots(max: Option<u32>, reports: &[&KernelCacheNode]) -> Slots {
        download_slots("ml", "qwen", Some(2), max, reports, None)
    }

    #[test]
    fn free_slots_go_to_the_nodes_waiting_longest() {
        let (a, b, c) = (
            queued("a", 30, None),
            queued("b", 10, None),
            queued("c", 20, None),
        );
        assert_eq!(
            slots(Some(1), &[&a, &b, &c]),
            Slots {
                grant: vec!["b".into()],
                release: vec![]
            }
        );
        assert_eq!(
            slots(Some(2), &[&a, &b, &c]),
            Slots {
                grant: vec!["b".into(), "c".into()],
                release: vec![]
            }
        );
        // The same time: by name.
        let (later_name, earlier_name) = (queued("y", 10, None), queued("x", 10, None));
        assert_eq!(slots(Some(1), &[&later_name, &earlier_name]).grant, ["x"]);
    }

    #[test]
    fn a_node_downloading_or_not_yet_started_with_its_slot_holds_it() {
        let downloading = with_grant(
            report(
                "a",
                vec![entry(ModelCacheState::Downloading, reasons::DOWNLOADING, 2)],
            ),
            Some(2),
        );
        // Granted, the agent has not noticed yet: still queued, still holding.
        let granted_queued = queued("b", 5, Some(2));
        let waiting = queued("c", 1, None);
        assert_eq!(slots(Some(1), &[&downloading, &waiting]), Slots::default());
        assert_eq!(
            slots(Some(2), &[&downloading, &granted_queued, &waiting]),
            Slots::default()
        );
        assert_eq!(
            slots(Some(3), &[&downloading, &granted_queued, &waiting]).grant,
            ["c"]
        );
    }

    #[test]
    fn slots_are_released_when_a_node_finishes_fails_or_moves_on() {
        let ready = with_grant(
            report("a", vec![entry(ModelCacheState::Ready, reasons::READY, 2)]),
            Some(2),
        );
        let failed = with_grant(
            report(
                "b",
                vec![entry(ModelCacheState::Failed, reasons::DOWNLOAD_FAILED, 2)],
            ),
            Some(2),
        );
        let gone = with_grant(report("c", vec![]), Some(2));
        let older = with_grant(
            report(
                "d",
                vec![entry(ModelCacheState::Downloading, reasons::DOWNLOADING, 1)],
            ),
            Some(1),
        );
        // Granted for the old generation, now at the new one: released, and asks again.
        let stale = queued("e", 50, Some(1));
        let waiting = queued("f", 40, None);
        let s = slots(Some(1), &[&ready, &failed, &gone, &older, &stale, &waiting]);
        assert_eq!(s.release, ["a", "b", "c", "d", "e"]);
        assert_eq!(s.grant, ["f"]);
    }

    #[test]
    fn a_node_with_its_files_complete_never_waits_and_takes_no_slot() {
        // An agent restarted with the files complete reports Downloading (resolving),
        // then Ready, without asking: it is not waiting, and holds nothing.
        let resolving = report(
            "a",
            vec![entry(ModelCacheState::Downloading, reasons::DOWNLOADING, 2)],
        );
        let waiting = queued("b", 10, None);
        assert_eq!(slots(Some(1), &[&resolving, &waiting]).grant, ["b"]);
    }

    #[test]
    fn without_a_bound_nothing_is_granted_and_every_slot_goes() {
        let holding = queued("a", 10, Some(2));
        let waiting = queued("b", 20, None);
        assert_eq!(
            slots(None, &[&holding, &waiting]),
            Slots {
                grant: vec![],
                release: vec!["a".into()]
            }
        );
        assert_eq!(
            slot_patch("ml/qwen", Some(2)),
            serde_json::json!({"spec": {"modelDownloads": {"ml/qwen": 2}}})
        );
        assert_eq!(
            slot_patch("ml/qwen", None),
            serde_json::json!({"spec": {"modelDownloads": {"ml/qwen": null}}})
        );
    }

    #[test]
    fn a_failed_node_asking_again_waits_behind_the_others() {
        // It failed and released its slot; at its retry it waits again, from then.
        let retried = queued("a", 100, None);
        let (b, c) = (queued("b", 50, None), queued("c", 60, None));
        assert_eq!(slots(Some(1), &[&retried, &b, &c]).grant, ["b"]);
        assert_eq!(slots(Some(2), &[&retried, &b, &c]).grant, ["b", "c"]);
    }

    #[test]
    fn a_ready_node_refreshing_a_moving_revision_asks_and_holds_like_a_download() {
        let mut asking = entry(ModelCacheState::Ready, reasons::DOWNLOAD_QUEUED, 2);
        asking.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(5).unwrap(),
        ));
        let waiting = report("a", vec![asking]);
        assert_eq!(slots(Some(1), &[&waiting]).grant, ["a"]);
        let refreshing = with_grant(
            report(
                "b",
                vec![entry(ModelCacheState::Ready, reasons::REFRESHING, 2)],
            ),
            Some(2),
        );
        assert_eq!(slots(Some(1), &[&refreshing, &waiting]), Slots::default());
        // Done: Ready again, the slot goes.
        let done = with_grant(
            report("b", vec![entry(ModelCacheState::Ready, reasons::READY, 2)]),
            Some(2),
        );
        assert_eq!(
            slots(Some(1), &[&done, &waiting]),
            Slots {
                grant: vec!["a".into()],
                release: vec!["b".into()]
            }
        );
    }

    #[test]
    fn a_report_left_behind_by_a_deleted_node_releases_its_slot() {
        let orphan = queued("gone", 1, Some(2));
        let waiting = queued("b", 10, None);
        let nodes = std::collections::BTreeSet::from(["b".to_string()]);
        let s = download_slots(
            "ml",
            "qwen",
            Some(2),
            Some(1),
            &[&orphan, &waiting],
            Some(&nodes),
        );
        assert_eq!(
            s,
            Slots {
                grant: vec!["b".into()],
                release: vec!["gone".into()]
            }
        );
        // Nodes unknown: every report counts.
        assert_eq!(slots(Some(1), &[&orphan, &waiting]), Slots::default());
    }
}
