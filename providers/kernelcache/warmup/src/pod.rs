//! The warmup pod of one node, and what a pod's status says about its attempt: pure.
//!
//! One pod per node and attempt, named deterministically (a create that races the cache
//! is refused as AlreadyExists instead of starting a second pod), pinned to its node by a
//! required node affinity on `metadata.name` (as the DaemonSet controller pins its pods,
//! so the scheduler still accounts for it), owned by the Warmup:
//!
//! - init container `warmup-tools` (this provider's image) copies the static no-op binary
//!   `kernelcache-noop` into a shared `emptyDir`;
//! - one init container per image to preload, running that image with the no-op as its
//!   command: the kubelet pulls the image, the container exits 0 at once. A shell command
//!   (`sh -c "exit 0"`, RBG's choice in `rolebasedgroupwarmup_controller.go@v0.8.0-alpha.5`)
//!   fails on distroless and scratch images; a static binary needs nothing from the image;
//! - the containers of `customAction.podTemplate`, or one no-op container of our image.
//!
//! The no-op containers run as nobody, without privileges or capabilities, on a read-only
//! root filesystem.

use crate::policy::{self, Policy};
use kube::Resource as _;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, EmptyDirVolumeSource, LocalObjectReference, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, PodTemplateSpec, ResourceRequirements,
    SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};

use kubeairunway_sdk::api::Warmup;
use kubeairunway_sdk::api::warmup::reasons;

/// Label on every warmup pod: the UID of its Warmup (the controller's pod cache selects
/// by it).
pub const WARMUP_UID_LABEL: &str = "cache.kubeairunway.ai/warmup-uid";
/// Label on every warmup pod.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "kernelcache-warmup";
/// Annotation: the node a warmup pod warms (names may be longer than a label value).
pub const NODE_ANNOTATION: &str = "cache.kubeairunway.ai/warmup-node";
/// Annotation: the attempt a warmup pod is (0, 1, ...).
pub const ATTEMPT_ANNOTATION: &str = "cache.kubeairunway.ai/warmup-attempt";
/// The name of the no-op binary in this provider's image (at `/`).
pub const NOOP_BINARY: &str = "kernelcache-noop";
/// Where the warmup pod's containers find the no-op binary.
pub const TOOLS_DIR: &str = "/warmup-tools";
const TOOLS_VOLUME: &str = "warmup-tools";

/// What every warmup pod of a Warmup does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Actions {
    /// Images to pull, in order.
    pub images: Vec<String>,
    /// Secrets to pull them with.
    pub pull_secrets: Vec<LocalObjectReference>,
    /// KernelCaches the node must have staged (not done by the pod).
    pub kernel_caches: Vec<String>,
    /// ModelCaches the node must have downloaded (not done by the pod).
    pub model_caches: Vec<String>,
    /// The custom pod.
    pub custom: Option<PodTemplateSpec>,
    /// Tolerations of the pods.
    pub tolerations: Vec<Toleration>,
}

impl Actions {
    /// Whether a node needs a warmup pod (images or a custom pod).
    pub fn needs_pod(&self) -> bool {
        !self.images.is_empty() || self.custom.is_some()
    }
}

/// The Warmup a pod belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
}

/// The UID of the Warmup `pod` was made for, if the warmup controller made it: the
/// warmup-uid label alone is not enough (any pod template can carry it), the pod must also
/// be managed by this controller and owned by a Warmup of that UID. Only such pods are
/// ever deleted as a Warmup's.
pub fn made_for(pod: &k8s_openapi::api::core::v1::Pod) -> Option<&str> {
    let labels = pod.metadata.labels.as_ref()?;
    let uid = labels.get(WARMUP_UID_LABEL)?;
    let managed = labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY);
    let owned = pod.metadata.owner_references.iter().flatten().any(|o| {
        o.kind == Warmup::kind(&()) && o.api_version == Warmup::api_version(&()) && &o.uid == uid
    });
    (managed && owned).then_some(uid.as_str())
}

/// Parse `customAction.podTemplate` strictly: a field Kubernetes would not know is
/// refused with its path, never dropped; and a pod the cluster operator's policy does not
/// let custom actions run ([`policy::violations`]) is refused naming every rule it breaks.
pub fn parse_template(
    value: &serde_json::Value,
    policy: &Policy,
) -> Result<PodTemplateSpec, String> {
    let mut unknown = Vec::new();
    let template: PodTemplateSpec = serde_ignored::deserialize(value.clone(), |path| {
        // serde_ignored writes `?` for each `Option` on the way; a user never sees those.
        let shown = path.to_string();
        let parts: Vec<&str> = shown.split('.').filter(|p| *p != "?").collect();
        unknown.push(parts.join("."));
    })
    .map_err(|e| format!("customAction.podTemplate: {e}"))?;
    if !unknown.is_empty() {
        return Err(format!(
            "customAction.podTemplate has fields a pod template does not: {}",
            unknown.join(", ")
        ));
    }
    if template
        .spec
        .as_ref()
        .is_none_or(|s| s.containers.is_empty())
    {
        return Err(
            "customAction.podTemplate.spec.containers must name at least one container".into(),
        );
    }
    let refused = policy::violations(&template, policy);
    if !refused.is_empty() {
        return Err(format!(
            "customAction.podTemplate asks for more than a custom action may do: {}",
            refused.join("; ")
        ));
    }
    Ok(template)
}

fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize()
        .iter()
        .take(3)
        .fold(String::new(), |mut out, b| {
            use std::fmt::Write;
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// `s` cut to at most `max` bytes, without a trailing `-` or `.` (so that joining with
/// `-` keeps a DNS subdomain).
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].trim_end_matches(['-', '.'])
}

/// The name of the pod of `owner` on `node`, attempt `attempt`: readable, unique per
/// Warmup UID, node and attempt, a DNS subdomain.
pub fn pod_name(owner: &Owner, node: &str, attempt: i32) -> String {
    format!(
        "{}-{}-{}-{attempt}",
        cut(&owner.name, 60),
        cut(node, 120),
        short_hash(&[&owner.uid, node])
    )
}

fn noop_security() -> SecurityContext {
    SecurityContext {
        run_as_user: Some(65534),
        run_as_group: Some(65534),
        run_as_non_root: Some(true),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..SecurityContext::default()
    }
}

fn small_resources() -> ResourceRequirements {
    let q = |s: &str| Quantity(s.to_string());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), q("10m")),
            ("memory".into(), q("16Mi")),
        ])),
        limits: Some(BTreeMap::from([("memory".into(), q("64Mi"))])),
        ..ResourceRequirements::default()
    }
}

fn tools_mount(read_only: bool) -> VolumeMount {
    VolumeMount {
        name: TOOLS_VOLUME.into(),
        mount_path: TOOLS_DIR.into(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}

/// The containers of our own: the installer of the no-op, one preload per image.
fn init_containers(actions: &Actions, tools_image: &str) -> Vec<Container> {
    let install = Container {
        name: "warmup-tools".into(),
        image: Some(tools_image.into()),
        command: Some(vec![
            format!("/{NOOP_BINARY}"),
            "--install".into(),
            TOOLS_DIR.into(),
        ]),
        volume_mounts: Some(vec![tools_mount(false)]),
        security_context: Some(noop_security()),
        resources: Some(small_resources()),
        ..Container::default()
    };
    let noop = format!("{TOOLS_DIR}/{NOOP_BINARY}");
    let preload = actions
        .images
        .iter()
        .enumerate()
        .map(|(i, image)| Container {
            name: format!("preload-{i}"),
            image: Some(image.clone()),
            image_pull_policy: Some("IfNotPresent".into()),
            command: Some(vec![noop.clone()]),
            args: Some(Vec::new()),
            volume_mounts: Some(vec![tools_mount(true)]),
            security_context: Some(noop_security()),
            resources: Some(small_resources()),
            ..Container::default()
        });
    std::iter::once(install).chain(preload).collect()
}

/// The required node affinity that pins a pod to `node` (the DaemonSet controller's
/// `matchFields` on `metadata.name`, pkg/controller/daemon/util/daemonset_util.go).
fn pinned_to(node: &str, affinity: Option<Affinity>) -> Affinity {
    let mut affinity = affinity.unwrap_or_default();
    affinity.node_affinity = Some(NodeAffinity {
        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_fields: Some(vec![NodeSelectorRequirement {
                    key: "metadata.name".into(),
                    operator: "In".into(),
                    values: Some(vec![node.into()]),
                }]),
                ..NodeSelectorTerm::default()
            }],
        }),
        ..NodeAffinity::default()
    });
    affinity
}

/// The warmup pod of `owner` for `node`, attempt `attempt`.
pub fn build(owner: &Owner, node: &str, attempt: i32, actions: &Actions, tools_image: &str) -> Pod {
    let template = actions.custom.clone().unwrap_or_default();
    let mut spec: PodSpec = template.spec.unwrap_or_default();
    let custom_meta = template.metadata.unwrap_or_default();

    let mut inits = init_containers(actions, tools_image);
    inits.extend(spec.init_containers.take().unwrap_or_default());
    spec.init_containers = Some(inits);
    if spec.containers.is_empty() {
        spec.containers = vec![Container {
            name: "done".into(),
            image: Some(tools_image.into()),
            command: Some(vec![format!("/{NOOP_BINARY}")]),
            security_context: Some(noop_security()),
            resources: Some(small_resources()),
            ..Container::default()
        }];
    }
    let mut volumes = vec![Volume {
        name: TOOLS_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity("16Mi".into())),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    }];
    volumes.extend(spec.volumes.take().unwrap_or_default());
    spec.volumes = Some(volumes);
    let mut tolerations = actions.tolerations.clone();
    tolerations.extend(spec.tolerations.take().unwrap_or_default());
    spec.tolerations = (!tolerations.is_empty()).then_some(tolerations);
    let mut secrets = actions.pull_secrets.clone();
    secrets.extend(spec.image_pull_secrets.take().unwrap_or_default());
    secrets.dedup_by(|a, b| a.name == b.name);
    spec.image_pull_secrets = (!secrets.is_empty()).then_some(secrets);
    spec.affinity = Some(pinned_to(node, spec.affinity.take()));
    spec.node_name = None;
    spec.restart_policy = Some(spec.restart_policy.take().unwrap_or_else(|| "Never".into()));
    spec.automount_service_account_token = spec.automount_service_account_token.or(Some(false));
    spec.enable_service_links = spec.enable_service_links.or(Some(false));
    spec.termination_grace_period_seconds = spec.termination_grace_period_seconds.or(Some(10));

    let mut labels = custom_meta.labels.unwrap_or_default();
    labels.insert(WARMUP_UID_LABEL.into(), owner.uid.clone());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    let mut annotations = custom_meta.annotations.unwrap_or_default();
    annotations.insert(NODE_ANNOTATION.into(), node.into());
    annotations.insert(ATTEMPT_ANNOTATION.into(), attempt.to_string());
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(owner, node, attempt)),
            namespace: Some(owner.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "cache.kubeairunway.ai/v1alpha1".into(),
                kind: "Warmup".into(),
                name: owner.name.clone(),
                uid: owner.uid.clone(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// What a warmup pod's status says about its attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not finished.
    Active,
    /// Every container exited 0.
    Succeeded,
    /// The attempt failed: `(reason, message)`.
    Failed(String, String),
}

/// Waiting reasons of the kubelet that end an attempt: it backs off pulling
/// (`ImagePullBackOff` follows a first `ErrImagePull`, which may be transient), or the
/// image or the container cannot be made at all (pkg/kubelet/images/types.go and
/// pkg/kubelet/container/sync_result.go in kubernetes).
const FAILED_WAITING: [&str; 5] = [
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "ImageInspectError",
    "CreateContainerConfigError",
];

/// A warmup pod as the controller reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The pod's name.
    pub pod: String,
    /// The node it warms.
    pub node: String,
    /// Its attempt number.
    pub attempt: i32,
    /// What its status says.
    pub outcome: Outcome,
    /// Whether the pod still holds its node (neither `Succeeded` nor `Failed`): a running
    /// pod, or one whose image pull backs off, which has failed its attempt but stays
    /// until it is deleted.
    pub running: bool,
}

/// Read a warmup pod (`None` when it lacks our annotations).
pub fn read(pod: &Pod) -> Option<Attempt> {
    let annotations = pod.metadata.annotations.as_ref()?;
    Some(Attempt {
        pod: pod.metadata.name.clone()?,
        node: annotations.get(NODE_ANNOTATION)?.clone(),
        attempt: annotations.get(ATTEMPT_ANNOTATION)?.parse().ok()?,
        outcome: outcome(pod),
        running: !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ),
    })
}

/// What `pod`'s status says.
pub fn outcome(pod: &Pod) -> Outcome {
    let Some(status) = pod.status.as_ref() else {
        return Outcome::Active;
    };
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    match status.phase.as_deref() {
        Some("Succeeded") => return Outcome::Succeeded,
        Some("Failed") => {
            let exited = containers.clone().find_map(|c| {
                let t = c.state.as_ref()?.terminated.as_ref()?;
                (t.exit_code != 0).then(|| {
                    let why = t
                        .message
                        .clone()
                        .or_else(|| t.reason.clone())
                        .unwrap_or_default();
                    format!(
                        "container {} exited with code {}: {why}",
                        c.name, t.exit_code
                    )
                })
            });
            let message = exited
                .or_else(|| status.message.clone())
                .unwrap_or_else(|| "the pod failed".into());
            let reason = status
                .reason
                .clone()
                .unwrap_or_else(|| reasons::POD_FAILED.into());
            return Outcome::Failed(reason, message);
        }
        _ => {}
    }
    for c in containers {
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref())
            && let Some(reason) = w.reason.as_deref()
            && FAILED_WAITING.contains(&reason)
        {
            let image = c.image.clone();
            let message = format!(
                "container {} ({image}): {}",
                c.name,
                w.message.clone().unwrap_or_default()
            );
            return Outcome::Failed(reason.to_string(), message);
        }
    }
    Outcome::Active
}

#[cfg(test)]
mod tests {
    #![allow(clippy::needless_pass_by_value)] // JSON literals built in place
    use super::*;
    use serde_json::json;

    fn owner() -> Owner {
        Owner {
            name: "llama".into(),
            namespace: "ml".into(),
            uid: "uid-1".into(),
        }
    }

    fn actions() -> Actions {
        Actions {
            images: vec![
                "vllm/vllm-openai:v0.11.0".into(),
                "gcr.io/distroless/static".into(),
            ],
            pull_secrets: vec![LocalObjectReference {
                name: "regcred".into(),
            }],
            tolerations: vec![
                serde_json::from_value(json!({"key": "nvidia.com/gpu", "operator": "Exists"}))
                    .unwrap(),
            ],
            ..Actions::default()
        }
    }

    #[test]
    fn names_are_unique_per_uid_node_and_attempt_and_stay_dns_subdomains() {
        let a = pod_name(&owner(), "gpu-1", 0);
        assert!(a.starts_with("llama-gpu-1-"), "{a}");
        assert!(a.ends_with("-0"));
        assert_ne!(a, pod_name(&owner(), "gpu-1", 1));
        assert_ne!(a, pod_name(&owner(), "gpu-2", 0));
        let other = Owner {
            uid: "uid-2".into(),
            ..owner()
        };
        assert_ne!(
            a,
            pod_name(&other, "gpu-1", 0),
            "a recreated Warmup never meets its predecessor's pods"
        );
        let long = Owner {
            name: format!("{}.-x", "w".repeat(58)),
            ..owner()
        };
        let n = pod_name(&long, &format!("{}.node", "n".repeat(200)), 3);
        assert!(n.len() <= 253, "{}", n.len());
        let re =
            regex::Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
                .unwrap();
        assert!(re.is_match(&n), "{n}");
    }

    #[test]
    fn image_preload_runs_each_image_with_our_static_noop() {
        let pod = build(
            &owner(),
            "gpu-1",
            2,
            &actions(),
            "ghcr.io/kubeairunway/kernelcache-provider:0.1.0",
        );
        let spec = pod.spec.unwrap();
        let inits = spec.init_containers.unwrap();
        assert_eq!(inits[0].name, "warmup-tools");
        assert_eq!(
            inits[0].command.as_deref().unwrap(),
            ["/kernelcache-noop", "--install", "/warmup-tools"]
        );
        assert_eq!(inits[1].image.as_deref(), Some("vllm/vllm-openai:v0.11.0"));
        assert_eq!(inits[2].image.as_deref(), Some("gcr.io/distroless/static"));
        for preload in &inits[1..] {
            assert_eq!(
                preload.command.as_deref().unwrap(),
                ["/warmup-tools/kernelcache-noop"]
            );
            assert_eq!(
                preload.volume_mounts.as_ref().unwrap()[0].read_only,
                Some(true)
            );
            let sc = preload.security_context.as_ref().unwrap();
            assert_eq!(sc.run_as_non_root, Some(true));
            assert_eq!(sc.allow_privilege_escalation, Some(false));
        }
        assert_eq!(spec.containers.len(), 1);
        assert_eq!(
            spec.containers[0].command.as_deref().unwrap(),
            ["/kernelcache-noop"]
        );
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.image_pull_secrets.unwrap()[0].name, "regcred");
        assert_eq!(spec.tolerations.unwrap().len(), 1);
        let terms = spec
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        let field = &terms[0].match_fields.as_ref().unwrap()[0];
        assert_eq!(
            (field.key.as_str(), field.values.as_deref().unwrap()),
            ("metadata.name", &["gpu-1".to_string()][..])
        );
        let meta = pod.metadata;
        assert_eq!(meta.labels.unwrap()[WARMUP_UID_LABEL], "uid-1");
        let annotations = meta.annotations.unwrap();
        assert_eq!(annotations[NODE_ANNOTATION], "gpu-1");
        assert_eq!(annotations[ATTEMPT_ANNOTATION], "2");
        let owner_ref = &meta.owner_references.unwrap()[0];
        assert_eq!(
            (owner_ref.kind.as_str(), owner_ref.controller),
            ("Warmup", Some(true))
        );
    }

    #[test]
    fn a_custom_pod_keeps_its_own_settings_and_gets_pinned() {
        let template = parse_template(&json!({
            "metadata": {"labels": {"app": "download"}},
            "spec": {
                "restartPolicy": "OnFailure",
                "serviceAccountName": "downloader",
                "automountServiceAccountToken": true,
                "containers": [{"name": "fetch", "image": "fetcher:1", "args": ["--model", "a/b"]}],
                "volumes": [{"name": "models", "hostPath": {"path": "/models"}}],
                "affinity": {"podAntiAffinity": {}},
            },
        }), &Policy {
            host_paths: vec!["/models".into()],
            service_accounts: vec!["downloader".into()],
            ..Policy::default()
        })
        .unwrap();
        let a = Actions {
            custom: Some(template),
            ..actions()
        };
        let pod = build(&owner(), "gpu-1", 0, &a, "tools:1");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.containers[0].name, "fetch");
        assert_eq!(spec.restart_policy.as_deref(), Some("OnFailure"));
        assert_eq!(spec.automount_service_account_token, Some(true));
        assert_eq!(spec.service_account_name.as_deref(), Some("downloader"));
        let volumes: Vec<_> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(volumes, ["warmup-tools", "models"]);
        let affinity = spec.affinity.unwrap();
        assert!(affinity.pod_anti_affinity.is_some());
        assert!(affinity.node_affinity.is_some());
        assert_eq!(pod.metadata.labels.unwrap()["app"], "download");
    }

    #[test]
    fn templates_with_unknown_fields_or_no_container_are_refused() {
        let e = parse_template(
            &json!({"spec": {"contianers": [], "containers": [{"name": "c"}]}}),
            &Policy::default(),
        )
        .unwrap_err();
        assert!(e.contains("spec.contianers"), "{e}");
        let e = parse_template(
            &json!({"spec": {"containers": [{"name": "c", "imgae": "x"}]}}),
            &Policy::default(),
        )
        .unwrap_err();
        assert!(e.contains("imgae"), "{e}");
        let e =
            parse_template(&json!({"spec": {"containers": []}}), &Policy::default()).unwrap_err();
        assert!(e.contains("at least one container"), "{e}");
        let e = parse_template(&json!({"spec": {"containers": "nope"}}), &Policy::default())
            .unwrap_err();
        assert!(e.contains("customAction.podTemplate"), "{e}");
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "annotations": {NODE_ANNOTATION: "n", ATTEMPT_ANNOTATION: "1"}}, "status": status})).unwrap()
    }

    #[test]
    fn outcomes_as_the_kubelet_reports_them() {
        assert_eq!(outcome(&pod(json!({"phase": "Pending"}))), Outcome::Active);
        assert_eq!(
            outcome(&pod(json!({"phase": "Succeeded"}))),
            Outcome::Succeeded
        );
        let failed = pod(json!({"phase": "Failed", "containerStatuses": [
            {"name": "fetch", "image": "f", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 3, "reason": "Error", "message": "no space left"}}}]}));
        assert_eq!(
            outcome(&failed),
            Outcome::Failed(
                "PodFailed".into(),
                "container fetch exited with code 3: no space left".into()
            )
        );
        let evicted = pod(
            json!({"phase": "Failed", "reason": "Evicted", "message": "low on ephemeral storage"}),
        );
        assert_eq!(
            outcome(&evicted),
            Outcome::Failed("Evicted".into(), "low on ephemeral storage".into())
        );
        let waiting = |reason: &str| {
            pod(json!({"phase": "Pending", "initContainerStatuses": [
            {"name": "preload-0", "image": "nope:1", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": reason, "message": "pull access denied"}}}]}))
        };
        assert_eq!(
            outcome(&waiting("ErrImagePull")),
            Outcome::Active,
            "the first pull error may pass"
        );
        assert_eq!(
            outcome(&waiting("ImagePullBackOff")),
            Outcome::Failed(
                "ImagePullBackOff".into(),
                "container preload-0 (nope:1): pull access denied".into()
            )
        );
        assert!(matches!(
            outcome(&waiting("InvalidImageName")),
            Outcome::Failed(..)
        ));
        let read = read(&waiting("PodInitializing")).unwrap();
        assert_eq!(
            (read.node.as_str(), read.attempt, read.outcome),
            ("n", 1, Outcome::Active)
        );
        let foreign: Pod = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!(super::read(&foreign), None);
    }

    /// Only a pod this controller made (managed by it, owned by the Warmup of the uid its
    /// label names) counts as a Warmup's: the label alone is anyone's to set.
    #[test]
    fn a_pod_is_a_warmups_only_when_made_by_this_controller() {
        let ours = build(&owner(), "gpu-1", 0, &actions(), "tools:1");
        assert_eq!(made_for(&ours), Some(owner().uid.as_str()));
        let mut labelled_only = ours.clone();
        labelled_only.metadata.owner_references = None;
        assert_eq!(made_for(&labelled_only), None);
        let mut not_managed = ours.clone();
        not_managed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(MANAGED_BY_LABEL);
        assert_eq!(made_for(&not_managed), None);
        let mut other_uid = ours.clone();
        other_uid
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(WARMUP_UID_LABEL.into(), "another".into());
        assert_eq!(made_for(&other_uid), None);
    }
}
