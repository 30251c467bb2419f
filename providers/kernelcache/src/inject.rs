//! The pod patch that mounts a staged cache into a serving pod (RFC 6902 JSON patch, as
//! the mutating webhook answers it).
//!
//! - vLLM: the image's `io.vllm.cache` is a `VLLM_CACHE_ROOT`; its `torch_compile_cache`
//!   is mounted read-only at `$VLLM_CACHE_ROOT/torch_compile_cache` (the container's own
//!   `VLLM_CACHE_ROOT`, else vLLM's default `/root/.cache/vllm`, which is then set
//!   explicitly), so the rest of the cache root stays writable.
//! - Triton: `io.triton.cache` is mounted read-only at the cache's mount path and
//!   `TRITON_CACHE_DIR` points there (the agent rewrote the group files to that path).
//!
//! Only the serving containers get it: every container of `spec.containers` (not init
//! containers). A pod that already has the volume is left alone.

use serde_json::{Value, json};

use crate::image::CacheType;

/// vLLM's default cache root.
pub const DEFAULT_VLLM_CACHE_ROOT: &str = "/root/.cache/vllm";
/// Where Triton caches are mounted unless the KernelCache says otherwise.
pub const DEFAULT_MOUNT_ROOT: &str = "/var/cache/kubeairunway/kernels";

/// Where a staged cache comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The agent's directory on the node (`<root>/<namespace>/<name>/<digest>`).
    HostPath(String),
    /// A Kubernetes image volume of `image@digest`.
    Image(String),
}

/// One cache to mount.
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
}

impl Mount {
    /// The volume's name in the pod.
    pub fn volume_name(&self) -> String {
        let mut name = format!("kernel-cache-{}", self.name);
        name.truncate(63);
        name.trim_end_matches('-').to_string()
    }

    /// Where pods see a Triton cache (`TRITON_CACHE_DIR`), which is also the path the
    /// agent rewrites group files to.
    pub fn triton_dir(&self) -> String {
        self.path
            .clone()
            .unwrap_or_else(|| format!("{DEFAULT_MOUNT_ROOT}/{}", self.name))
    }
}

/// The JSON patch adding `mount` to `pod`; empty when the pod already has it or has no
/// containers.
pub fn patch(pod: &Value, mount: &Mount) -> Vec<Value> {
    let spec = &pod["spec"];
    let volume_name = mount.volume_name();
    let volumes = spec.get("volumes").and_then(Value::as_array);
    if volumes.is_some_and(|v| v.iter().any(|vol| vol["name"] == volume_name.as_str())) {
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
    let volume = match &mount.source {
        Source::HostPath(path) => {
            json!({"name": volume_name, "hostPath": {"path": path, "type": "Directory"}})
        }
        Source::Image(reference) => {
            json!({"name": volume_name, "image": {"reference": reference, "pullPolicy": "IfNotPresent"}})
        }
    };
    if volumes.is_some() {
        ops.push(json!({"op": "add", "path": "/spec/volumes/-", "value": volume}));
    } else {
        ops.push(json!({"op": "add", "path": "/spec/volumes", "value": [volume]}));
    }
    for (i, container) in containers.iter().enumerate() {
        let env = container.get("env").and_then(Value::as_array);
        let env_value = |name: &str| {
            env.and_then(|e| e.iter().find(|v| v["name"] == name))
                .and_then(|v| v["value"].as_str())
                .map(str::to_string)
        };
        let (mount_path, sub_path, set_env) = match mount.cache_type {
            CacheType::Vllm => {
                let root = env_value("VLLM_CACHE_ROOT");
                let set = root
                    .is_none()
                    .then(|| ("VLLM_CACHE_ROOT", DEFAULT_VLLM_CACHE_ROOT.to_string()));
                let root = root.unwrap_or_else(|| DEFAULT_VLLM_CACHE_ROOT.to_string());
                (
                    format!("{}/torch_compile_cache", root.trim_end_matches('/')),
                    "io.vllm.cache/torch_compile_cache",
                    set,
                )
            }
            CacheType::Triton => {
                let dir = mount.triton_dir();
                (
                    dir.clone(),
                    "io.triton.cache",
                    Some(("TRITON_CACHE_DIR", dir)),
                )
            }
        };
        let volume_mount = json!({"name": volume_name, "mountPath": mount_path, "subPath": sub_path, "readOnly": true});
        if container
            .get("volumeMounts")
            .and_then(Value::as_array)
            .is_some()
        {
            ops.push(json!({"op": "add", "path": format!("/spec/containers/{i}/volumeMounts/-"), "value": volume_mount}));
        } else {
            ops.push(json!({"op": "add", "path": format!("/spec/containers/{i}/volumeMounts"), "value": [volume_mount]}));
        }
        if let Some((name, value)) = set_env {
            let var = json!({"name": name, "value": value});
            match env {
                Some(list) => match list.iter().position(|v| v["name"] == name) {
                    Some(at) => ops.push(json!({"op": "replace", "path": format!("/spec/containers/{i}/env/{at}"), "value": var})),
                    None => ops.push(json!({"op": "add", "path": format!("/spec/containers/{i}/env/-"), "value": var})),
                },
                None => ops.push(json!({"op": "add", "path": format!("/spec/containers/{i}/env"), "value": [var]})),
            }
        }
    }
    ops
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

/// The node label the agent sets (to `"true"`) when a cache is ready on a node:
/// `kernelcache.kubeairunway.ai/<namespace>.<name>`, the name part cut to the 63
/// characters a label name may have.
pub fn ready_label(namespace: &str, name: &str) -> String {
    let mut key = format!("{namespace}.{name}");
    key.truncate(63);
    format!(
        "kernelcache.kubeairunway.ai/{}",
        key.trim_end_matches(['.', '-'])
    )
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

    #[test]
    fn vllm_cache_goes_under_the_containers_cache_root() {
        let mut pod = vllm_pod();
        let mount = Mount {
            name: "llama".into(),
            cache_type: CacheType::Vllm,
            source: Source::HostPath("/var/lib/kc/ns/llama/sha256-1".into()),
            path: None,
        };
        let ops = patch(&pod, &mount);
        apply(&mut pod, &ops);
        assert_eq!(
            pod["spec"]["volumes"][0],
            json!({"name": "kernel-cache-llama", "hostPath": {"path": "/var/lib/kc/ns/llama/sha256-1", "type": "Directory"}})
        );
        let main = &pod["spec"]["containers"][0];
        assert_eq!(
            main["volumeMounts"][0],
            json!({"name": "kernel-cache-llama", "mountPath": "/root/.cache/vllm/torch_compile_cache", "subPath": "io.vllm.cache/torch_compile_cache", "readOnly": true})
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
            "its own VLLM_CACHE_ROOT is kept"
        );
        assert!(
            pod["spec"]["initContainers"][0]
                .get("volumeMounts")
                .is_none()
        );
        // Never the seed's invented variables.
        let text = pod.to_string();
        for invented in [
            "VLLM_KERNEL_CACHE",
            "TRITON_KERNEL_CACHE_PATH",
            "TORCH_COMPILE_CACHE_DIR",
        ] {
            assert!(!text.contains(invented));
        }
        // Applying again changes nothing.
        assert!(patch(&pod, &mount).is_empty());
    }

    #[test]
    fn triton_cache_sets_triton_cache_dir_to_the_mount() {
        let mut pod = json!({"spec": {"volumes": [{"name": "shm", "emptyDir": {}}], "containers": [{"name": "main", "image": "i"}]}});
        let mount = Mount {
            name: "vadd".into(),
            cache_type: CacheType::Triton,
            source: Source::Image("reg/vadd@sha256:8ce4".into()),
            path: None,
        };
        let ops = patch(&pod, &mount);
        apply(&mut pod, &ops);
        assert_eq!(
            pod["spec"]["volumes"][1],
            json!({"name": "kernel-cache-vadd", "image": {"reference": "reg/vadd@sha256:8ce4", "pullPolicy": "IfNotPresent"}})
        );
        let main = &pod["spec"]["containers"][0];
        assert_eq!(
            main["volumeMounts"][0]["mountPath"],
            "/var/cache/kubeairunway/kernels/vadd"
        );
        assert_eq!(main["volumeMounts"][0]["subPath"], "io.triton.cache");
        assert_eq!(
            main["env"][0],
            json!({"name": "TRITON_CACHE_DIR", "value": "/var/cache/kubeairunway/kernels/vadd"})
        );
        assert_eq!(mount.triton_dir(), "/var/cache/kubeairunway/kernels/vadd");
    }

    #[test]
    fn affinity_is_added_to_every_existing_term() {
        let label = ready_label("ml", "vadd");
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
        let mount = Mount {
            name: "x".into(),
            cache_type: CacheType::Triton,
            source: Source::HostPath("/p".into()),
            path: None,
        };
        assert!(patch(&json!({"spec": {}}), &mount).is_empty());
        assert!(patch(&json!({}), &mount).is_empty());
    }
}
