//! The pod patch that gives a serving pod a staged cache (RFC 6902 JSON patch, as the
//! mutating webhook answers it).
//!
//! A cache is never mounted read-only where the frameworks write: Triton and vLLM add new
//! entries to their cache directories on any miss, and a read-only one would fail the
//! model. Nor may a missing cache fail a pod. So the pod gets:
//!
//! - a read-only *source* volume: the cache's own directory under the agent's root as a
//!   hostPath (`<root>/<namespace>/<name>`, `DirectoryOrCreate`, so a node without the
//!   cache does not fail the pod; never the whole root, which holds every namespace's
//!   caches), or a Kubernetes image volume of the pinned image;
//! - a writable `emptyDir` with a size limit (the cache's size plus as much again for
//!   new entries, at least [`MIN_COPY_BYTES`]), filled by an init container
//!   (`kernelcache-seed`, from our own image, non-root and within the `restricted` Pod
//!   Security profile) with a copy of the cache; a node where the cache is not staged
//!   gives an empty directory and the engine compiles its kernels as usual;
//! - in every serving container (`spec.containers`), that directory where the framework
//!   reads it: vLLM at `$VLLM_CACHE_ROOT/torch_compile_cache` (the container's own
//!   `VLLM_CACHE_ROOT`, else vLLM's default `/root/.cache/vllm`, then set explicitly);
//!   Triton at the cache's mount path with `TRITON_CACHE_DIR` pointing there (the agent
//!   rewrote the group files to that path).
//!
//! A pod that already uses one of these names (volumes, init container) or mounts
//! something where the cache would go is left alone ([`conflicts`]): its own volume is
//! never reused, and the patch can never make a valid pod invalid.

use serde_json::{Value, json};

use kubeairunway_kernelcache_api::names::{self};
use kubeairunway_kernelcache_artifact::image::CacheType;

/// vLLM's default cache root.
pub const DEFAULT_VLLM_CACHE_ROOT: &str = "/root/.cache/vllm";

/// Where the seed container reads the source volume.
pub const SOURCE_MOUNT: &str = "/kernel-cache-src";
/// Where the seed container writes the pod's copy.
pub const COPY_MOUNT: &str = "/kernel-cache";
/// The init container's name.
pub const SEED_CONTAINER: &str = "kernel-cache-seed";
/// The seed binary in our image.
pub const SEED_COMMAND: &str = "/kernelcache-seed";

/// The smallest size limit of the pod's copy of a cache.
pub const MIN_COPY_BYTES: u64 = 1 << 30;
/// The user the seed container runs as (non-root, as Pod Security `restricted` asks).
pub const SEED_USER: i64 = 65532;

/// Where a staged cache comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The cache's directory on the node (`<root>/<namespace>/<name>`), and the staged
    /// digest's directory below it.
    HostPath {
        /// `<--cache-root>/<namespace>/<name>`: this cache only.
        dir: String,
        /// `<digest with ':' as '-'>`.
        digest: String,
    },
    /// A Kubernetes image volume of `image@digest`.
    Image(String),
}

/// One cache to give a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The KernelCache's name (volume names derive from it).
    pub name: String,
    /// Triton or vLLM.
    pub cache_type: CacheType,
    /// Where the content is.
    pub source: Source,
    /// The Triton mount path (default `<DEFAULT_MOUNT_ROOT>/<name>`); unused for vLLM.
    pub path: Option<String>,
    /// The image with `kernelcache-seed` (ours).
    pub seed_image: String,
    /// Bytes of the cache (the image's `cache-size-bytes` label), when known: the copy's
    /// size limit is twice this, at least [`MIN_COPY_BYTES`].
    pub size_bytes: Option<u64>,
}

impl Mount {
    /// The name of the pod's writable copy (also the marker that a pod has the cache).
    pub fn volume_name(&self) -> String {
        let mut name = format!("kernel-cache-{}", self.name);
        name.truncate(59);
        name.trim_end_matches('-').to_string()
    }

    /// The name of the read-only source volume.
    pub fn source_volume_name(&self) -> String {
        format!("{}-src", self.volume_name())
    }

    /// Where pods see a Triton cache (`TRITON_CACHE_DIR`), which is also the path the
    /// agent rewrites group files to.
    pub fn triton_dir(&self) -> String {
        names::triton_dir(&self.name, self.path.as_deref())
    }

    /// The directory the seed copies from (inside its source mount).
    pub fn seed_from(&self) -> String {
        let inner = match self.cache_type {
            CacheType::Vllm => "io.vllm.cache/torch_compile_cache",
            CacheType::Triton => "io.triton.cache",
        };
        match &self.source {
            Source::HostPath { digest, .. } => format!("{SOURCE_MOUNT}/{digest}/{inner}"),
            Source::Image(_) => format!("{SOURCE_MOUNT}/{inner}"),
        }
    }

    /// The size limit of the pod's copy: the cache and as much again for the entries the
    /// engine adds, at least [`MIN_COPY_BYTES`].
    pub fn copy_size_limit(&self) -> u64 {
        self.size_bytes
            .unwrap_or(0)
            .saturating_mul(2)
            .max(MIN_COPY_BYTES)
    }

    /// Where a container of `pod` gets the cache: (mount path, environment variable to
    /// set). `None` for a container the cache is not for.
    fn target(&self, container: &Value) -> (String, Option<(&'static str, String)>) {
        let env = container.get("env").and_then(Value::as_array);
        let env_value = |name: &str| {
            env.and_then(|e| e.iter().find(|v| v["name"] == name))
                .and_then(|v| v["value"].as_str())
                .map(str::to_string)
        };
        match self.cache_type {
            CacheType::Vllm => {
                let root = env_value("VLLM_CACHE_ROOT");
                let set = root
                    .is_none()
                    .then(|| ("VLLM_CACHE_ROOT", DEFAULT_VLLM_CACHE_ROOT.to_string()));
                let root = root.unwrap_or_else(|| DEFAULT_VLLM_CACHE_ROOT.to_string());
                (
                    format!("{}/torch_compile_cache", root.trim_end_matches('/')),
                    set,
                )
            }
            CacheType::Triton => {
                let dir = self.triton_dir();
                (dir.clone(), Some(("TRITON_CACHE_DIR", dir)))
            }
        }
    }
}

/// Why `pod` cannot get `mount` without touching what it has: a volume or init
/// container already named like ours, or a container already mounting something where
/// the cache would go. `None`: no conflict.
pub fn conflicts(pod: &Value, mount: &Mount) -> Option<String> {
    let spec = &pod["spec"];
    let names = [mount.volume_name(), mount.source_volume_name()];
    for v in spec["volumes"].as_array().into_iter().flatten() {
        if let Some(n) = v["name"].as_str().filter(|n| names.iter().any(|m| m == n)) {
            return Some(format!("the pod already has a volume named {n}"));
        }
    }
    for c in spec["initContainers"].as_array().into_iter().flatten() {
        if c["name"] == SEED_CONTAINER {
            return Some(format!(
                "the pod already has an init container named {SEED_CONTAINER}"
            ));
        }
    }
    for c in spec["containers"].as_array().into_iter().flatten() {
        let (path, _) = mount.target(c);
        let clean = |p: &str| p.trim_end_matches('/').to_string();
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            if m["mountPath"].as_str().map(clean) == Some(clean(&path)) {
                return Some(format!(
                    "container {} already mounts {} at {path}",
                    c["name"].as_str().unwrap_or_default(),
                    m["name"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    None
}

/// The JSON patch giving `pod` the cache; empty when the pod has no containers or a
/// name or mount path of ours is taken ([`conflicts`]): the two volumes, the seed init
/// container ([`seed_container`]) and each container's mount and environment
/// ([`container_ops`]).
pub fn patch(pod: &Value, mount: &Mount) -> Vec<Value> {
    let spec = &pod["spec"];
    let copy = mount.volume_name();
    if conflicts(pod, mount).is_some() {
        return Vec::new();
    }
    let Some(containers) = spec
        .get("containers")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
    else {
        return Vec::new();
    };
    let mut ops = Vec::new();
    let source = match &mount.source {
        Source::HostPath { dir, .. } => {
            json!({"name": mount.source_volume_name(), "hostPath": {"path": dir, "type": "DirectoryOrCreate"}})
        }
        Source::Image(reference) => {
            json!({"name": mount.source_volume_name(), "image": {"reference": reference, "pullPolicy": "IfNotPresent"}})
        }
    };
    let volumes = vec![
        source,
        json!({"name": copy, "emptyDir": {"sizeLimit": mount.copy_size_limit().to_string()}}),
    ];
    append(&mut ops, spec, "volumes", "/spec", volumes);
    append(
        &mut ops,
        spec,
        "initContainers",
        "/spec",
        vec![seed_container(mount)],
    );
    for (i, container) in containers.iter().enumerate() {
        container_ops(&mut ops, i, container, mount);
    }
    ops
}

/// Add `values` to the list `field` of `object` (at `path`): appended when the list
/// exists, else the list created.
pub(crate) fn append(
    ops: &mut Vec<Value>,
    object: &Value,
    field: &str,
    path: &str,
    values: Vec<Value>,
) {
    if object.get(field).and_then(Value::as_array).is_some() {
        for v in values {
            ops.push(json!({"op": "add", "path": format!("{path}/{field}/-"), "value": v}));
        }
    } else {
        ops.push(json!({"op": "add", "path": format!("{path}/{field}"), "value": values}));
    }
}

/// The init container that fills the writable copy from the read-only source, within
/// Pod Security `restricted`.
fn seed_container(mount: &Mount) -> Value {
    json!({
        "name": SEED_CONTAINER,
        "image": mount.seed_image,
        "imagePullPolicy": "IfNotPresent",
        "command": [SEED_COMMAND, "--from", mount.seed_from(), "--to", COPY_MOUNT],
        "volumeMounts": [
            {"name": mount.source_volume_name(), "mountPath": SOURCE_MOUNT, "readOnly": true},
            {"name": mount.volume_name(), "mountPath": COPY_MOUNT},
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": true,
            "runAsUser": SEED_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    })
}

/// Container `i` mounts the copy where its framework reads it ([`Mount::target`]), with
/// the environment variable that points there set (replaced when it is already set).
fn container_ops(ops: &mut Vec<Value>, i: usize, container: &Value, mount: &Mount) {
    let path = format!("/spec/containers/{i}");
    let (mount_path, set_env) = mount.target(container);
    let volume_mount = json!({"name": mount.volume_name(), "mountPath": mount_path});
    append(ops, container, "volumeMounts", &path, vec![volume_mount]);
    let Some((name, value)) = set_env else {
        return;
    };
    let var = json!({"name": name, "value": value});
    let at = container
        .get("env")
        .and_then(Value::as_array)
        .and_then(|list| list.iter().position(|v| v["name"] == name));
    match at {
        Some(at) => {
            ops.push(json!({"op": "replace", "path": format!("{path}/env/{at}"), "value": var}));
        }
        None => append(ops, container, "env", &path, vec![var]),
    }
}

/// A preferred node affinity (weight 100) to nodes labelled `label=true`, so pods land
/// where the cache is when they can.
pub fn preferred_affinity_patch(pod: &Value, label: &str) -> Vec<Value> {
    let term = json!({"weight": 100, "preference": {"matchExpressions": [{"key": label, "operator": "In", "values": ["true"]}]}});
    let node_affinity = &pod["spec"]["affinity"]["nodeAffinity"];
    if node_affinity["preferredDuringSchedulingIgnoredDuringExecution"].is_array() {
        vec![
            json!({"op": "add", "path": "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/-", "value": term}),
        ]
    } else if node_affinity.is_object() {
        vec![
            json!({"op": "add", "path": "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution", "value": [term]}),
        ]
    } else if pod["spec"]["affinity"].is_object() {
        vec![
            json!({"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}),
        ]
    } else {
        vec![
            json!({"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}}),
        ]
    }
}

/// A required node affinity to nodes labelled `label=true` (where the agent marked the
/// cache ready), as a patch; merged into an existing required term list when present.
pub fn node_affinity_patch(pod: &Value, label: &str) -> Vec<Value> {
    let requirement = json!({"key": label, "operator": "In", "values": ["true"]});
    let required =
        &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    if let Some(terms) = required["nodeSelectorTerms"]
        .as_array()
        .filter(|t| !t.is_empty())
    {
        // Terms are ORed: the requirement must be added to each.
        return terms
            .iter()
            .enumerate()
            .map(|(i, term)| {
                let base = format!("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/{i}/matchExpressions");
                if term.get("matchExpressions").and_then(Value::as_array).is_some() {
                    json!({"op": "add", "path": format!("{base}/-"), "value": requirement})
                } else {
                    json!({"op": "add", "path": base, "value": [requirement]})
                }
            })
            .collect();
    }
    let node_affinity = json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [requirement]}]}});
    if pod["spec"]["affinity"]["nodeAffinity"].is_object() {
        vec![
            json!({"op": "add", "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", "value": node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]}),
        ]
    } else if pod["spec"]["affinity"].is_object() {
        vec![json!({"op": "add", "path": "/spec/affinity/nodeAffinity", "value": node_affinity})]
    } else {
        vec![
            json!({"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": node_affinity}}),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apply a patch the way the API server does (the subset of RFC 6902 we emit).
    fn apply(doc: &mut Value, ops: &[Value]) {
        for op in ops {
            let path: Vec<String> = op["path"]
                .as_str()
                .unwrap()
                .split('/')
                .skip(1)
                .map(|s| s.replace("~1", "/").replace("~0", "~"))
                .collect();
            let (last, parents) = path.split_last().unwrap();
            let mut target = &mut *doc;
            for p in parents {
                target = match target {
                    Value::Array(a) => &mut a[p.parse::<usize>().unwrap()],
                    other => other.get_mut(p.as_str()).unwrap(),
                };
            }
            let value = op["value"].clone();
            match (op["op"].as_str().unwrap(), target) {
                ("add", Value::Array(a)) if last == "-" => a.push(value),
                ("add" | "replace", Value::Array(a)) => a[last.parse::<usize>().unwrap()] = value,
                ("add" | "replace", Value::Object(o)) => {
                    o.insert(last.clone(), value);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn vllm_pod() -> Value {
        json!({"spec": {"containers": [
            {"name": "main", "image": "vllm/vllm-openai", "env": [{"name": "HF_HOME", "value": "/models"}]},
            {"name": "sidecar", "image": "proxy", "env": [{"name": "VLLM_CACHE_ROOT", "value": "/cache/vllm/"}], "volumeMounts": [{"name": "x", "mountPath": "/x"}]},
        ], "initContainers": [{"name": "init", "image": "busybox"}]}})
    }

    fn host(cache_type: CacheType) -> Mount {
        Mount {
            name: "llama".into(),
            cache_type,
            source: Source::HostPath {
                dir: "/var/lib/kc/ns/llama".into(),
                digest: "sha256-1".into(),
            },
            path: None,
            seed_image: "ghcr.io/x/kernelcache:1".into(),
            size_bytes: Some(3 << 30),
        }
    }

    #[test]
    fn vllm_cache_is_copied_under_the_containers_cache_root() {
        let mut pod = vllm_pod();
        let mount = host(CacheType::Vllm);
        let ops = patch(&pod, &mount);
        apply(&mut pod, &ops);
        assert_eq!(
            pod["spec"]["volumes"],
            json!([
                {"name": "kernel-cache-llama-src", "hostPath": {"path": "/var/lib/kc/ns/llama", "type": "DirectoryOrCreate"}},
                {"name": "kernel-cache-llama", "emptyDir": {"sizeLimit": (6u64 << 30).to_string()}},
            ])
        );
        let seed = &pod["spec"]["initContainers"][1];
        assert_eq!(seed["name"], SEED_CONTAINER);
        assert_eq!(
            seed["command"],
            json!([
                "/kernelcache-seed",
                "--from",
                "/kernel-cache-src/sha256-1/io.vllm.cache/torch_compile_cache",
                "--to",
                "/kernel-cache"
            ])
        );
        assert_eq!(seed["volumeMounts"][0]["readOnly"], true);
        assert_eq!(pod["spec"]["initContainers"][0]["name"], "init");
        let main = &pod["spec"]["containers"][0];
        assert_eq!(
            main["volumeMounts"][0],
            json!({"name": "kernel-cache-llama", "mountPath": "/root/.cache/vllm/torch_compile_cache"})
        );
        assert_eq!(
            main["env"][1],
            json!({"name": "VLLM_CACHE_ROOT", "value": "/root/.cache/vllm"})
        );
        let sidecar = &pod["spec"]["containers"][1];
        assert_eq!(
            sidecar["volumeMounts"][1]["mountPath"],
            "/cache/vllm/torch_compile_cache"
        );
        assert_eq!(
            sidecar["env"].as_array().unwrap().len(),
            1,
            "its own root is kept"
        );
        // Once injected, the pod is left alone.
        assert!(patch(&pod, &mount).is_empty());
        assert_eq!(seed["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            seed["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
    }

    #[test]
    fn a_pod_using_our_names_or_mount_paths_is_left_alone() {
        let mount = host(CacheType::Vllm);
        // A user's volume named like our source: never reused, never duplicated.
        let mut pod = vllm_pod();
        pod["spec"]["volumes"] =
            json!([{"name": "kernel-cache-llama-src", "hostPath": {"path": "/"}}]);
        assert!(
            conflicts(&pod, &mount)
                .unwrap()
                .contains("kernel-cache-llama-src")
        );
        assert!(patch(&pod, &mount).is_empty());
        // A container already mounting something where the cache would go.
        let mut pod = vllm_pod();
        pod["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "mine", "mountPath": "/root/.cache/vllm/torch_compile_cache/"}]);
        assert!(
            conflicts(&pod, &mount)
                .unwrap()
                .contains("already mounts mine")
        );
        assert!(patch(&pod, &mount).is_empty());
        // An init container of that name.
        let mut pod = vllm_pod();
        pod["spec"]["initContainers"] = json!([{"name": SEED_CONTAINER, "image": "x"}]);
        assert!(patch(&pod, &mount).is_empty());
        // Small caches still get a usable copy.
        let small = Mount {
            size_bytes: Some(10),
            ..host(CacheType::Triton)
        };
        assert_eq!(small.copy_size_limit(), MIN_COPY_BYTES);
    }

    #[test]
    fn triton_cache_sets_triton_cache_dir_to_the_copy() {
        let mut pod = json!({"spec": {"volumes": [{"name": "shm", "emptyDir": {}}], "containers": [{"name": "main", "image": "i", "env": [{"name": "TRITON_CACHE_DIR", "value": "/old"}]}]}});
        let mount = Mount {
            name: "vadd".into(),
            cache_type: CacheType::Triton,
            source: Source::Image("reg/vadd@sha256:8ce4".into()),
            path: None,
            seed_image: "s".into(),
            size_bytes: None,
        };
        let ops = patch(&pod, &mount);
        apply(&mut pod, &ops);
        assert_eq!(
            pod["spec"]["volumes"][1],
            json!({"name": "kernel-cache-vadd-src", "image": {"reference": "reg/vadd@sha256:8ce4", "pullPolicy": "IfNotPresent"}})
        );
        assert_eq!(
            pod["spec"]["initContainers"][0]["command"][2],
            "/kernel-cache-src/io.triton.cache"
        );
        let main = &pod["spec"]["containers"][0];
        assert_eq!(
            main["volumeMounts"][0]["mountPath"],
            "/var/cache/kubeairunway/kernels/vadd"
        );
        assert_eq!(
            main["env"][0],
            json!({"name": "TRITON_CACHE_DIR", "value": "/var/cache/kubeairunway/kernels/vadd"})
        );
        assert_eq!(mount.triton_dir(), "/var/cache/kubeairunway/kernels/vadd");
        for env in main["env"].as_array().unwrap() {
            assert!(
                ![
                    "VLLM_KERNEL_CACHE",
                    "TRITON_KERNEL_CACHE_PATH",
                    "TORCH_COMPILE_CACHE_DIR"
                ]
                .contains(&env["name"].as_str().unwrap()),
                "the seed's invented names"
            );
        }
    }

    #[test]
    fn preferred_affinity_joins_what_is_there() {
        let label = names::ready_label("ml", "vadd");
        for mut pod in [
            json!({"spec": {}}),
            json!({"spec": {"affinity": {"podAntiAffinity": {}}}}),
            json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]}}}}),
        ] {
            let ops = preferred_affinity_patch(&pod, &label);
            apply(&mut pod, &ops);
            let terms = pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
                .as_array()
                .unwrap();
            let last = terms.last().unwrap();
            assert_eq!(last["weight"], 100);
            assert_eq!(
                last["preference"]["matchExpressions"][0]["key"],
                label.as_str()
            );
        }
    }

    #[test]
    fn affinity_is_added_to_every_existing_term() {
        let label = names::ready_label("ml", "vadd");
        assert_eq!(label, "kernelcache.kubeairunway.ai/ml.vadd");
        let mut bare = json!({"spec": {}});
        let ops = node_affinity_patch(&bare, &label);
        apply(&mut bare, &ops);
        assert_eq!(
            bare["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
            label.as_str()
        );
        let mut two_terms = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
        ]}}}}});
        let ops = node_affinity_patch(&two_terms, &label);
        apply(&mut two_terms, &ops);
        let terms = &two_terms["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(terms[0]["matchExpressions"].as_array().unwrap().len(), 2);
        assert_eq!(terms[1]["matchExpressions"][0]["key"], label.as_str());
    }

    #[test]
    fn pods_without_containers_are_untouched() {
        let mount = host(CacheType::Triton);
        assert!(patch(&json!({"spec": {}}), &mount).is_empty());
        assert!(patch(&json!({}), &mount).is_empty());
    }
}
