//! Model caches in serving pods: a pod of a ModelDeployment whose model a Ready
//! `ModelCache` of its namespace holds gets that cache's claim (a local PersistentVolume
//! on the nodes where the download is complete, made by the controller) mounted
//! read-only, and the environment that makes Hugging Face libraries read it offline.
//!
//! - **Which cache** ([`choose`]): the one `spec.model.cacheRef` names, else a Ready
//!   ModelCache of `hf://<spec.model.id>` at revision `main` (the revision the engines
//!   load; the first by name when several match). A named cache that does not exist or is
//!   not Ready, or none matching: the pod is left as it is and the engine downloads the
//!   model itself.
//! - **Ready**: `Ready=True` for the current generation, at least one ready node, and the
//!   claim named in the status. The claim's volume requires the ready label, so the
//!   scheduler puts the pod only on a node where the download is complete.
//! - **Each serving container** (`spec.containers`): the claim at
//!   `<HF_HUB_CACHE>/models--{org}--{name}`, read-only, where `HF_HUB_CACHE` is the
//!   container's own value when it sets one, else [`MODEL_MOUNT_ROOT`] (then set);
//!   `HF_HUB_OFFLINE=1` unless the container sets it (a user's value is never replaced).
//! - **llama.cpp** ([`llama_env`]): a container naming its model with `--hf-repo` gets
//!   the claim where llama.cpp's Hugging Face cache is (its `LLAMA_CACHE`, else
//!   `HF_HUB_CACHE`), `LLAMA_ARG_OFFLINE=1`, and `LLAMA_ARG_HF_FILE` when the cache's
//!   `include` names exactly one GGUF file; one naming no model gets `LLAMA_ARG_MODEL`,
//!   that file's path in the snapshot.
//! - **Never an invalid pod** ([`patch`]): a pod with a volume named [`VOLUME`] already,
//!   a container mounting something at that path, or setting `HF_HUB_CACHE` from a
//!   reference (its path unknown) is left alone, and why is logged.
//! - **Pod Security**: a `persistentVolumeClaim` volume and a read-only mount are allowed
//!   at every level, `restricted` included; nothing else of the pod changes.

use std::sync::Arc;

use kubeairunway_kernelcache_api::model::{self, Chosen, ModelCache, NotChosen};
use kubeairunway_kernelcache_api::names::{MODEL_MOUNT_ROOT, hub_folder};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::api::EngineType;
use kubeairunway_sdk::labels::MODEL_DEPLOYMENT;
use serde_json::{Value, json};

use crate::inject::append;

/// The annotation naming the mounted model cache: `<namespace>/<name>@<commit>`.
pub const MODEL_INJECTED_ANNOTATION: &str = "cache.kubeairunway.ai/model-cache";
/// The pod's volume of the cache's claim.
pub const VOLUME: &str = "kubeairunway-model-cache";
/// Where Hugging Face libraries look for the hub cache.
pub const HF_HUB_CACHE: &str = "HF_HUB_CACHE";
/// Set to `1`: Hugging Face libraries make no request to the hub.
pub const HF_HUB_OFFLINE: &str = "HF_HUB_OFFLINE";
/// llama.cpp's cache: since ggml-org/llama.cpp#21009 the first place its `--hf-repo`
/// looks, in the Hugging Face layout (`common/hf-cache.cpp`, `get_cache_directory`:
/// `LLAMA_CACHE`, then `HF_HUB_CACHE`, `HF_HOME/hub`, ...).
pub const LLAMA_CACHE: &str = "LLAMA_CACHE";
/// llama.cpp's `--offline` ("forces use of cache, prevents network access").
pub const LLAMA_ARG_OFFLINE: &str = "LLAMA_ARG_OFFLINE";
/// llama.cpp's `--hf-file` (the file of `--hf-repo`; "overrides the quant").
pub const LLAMA_ARG_HF_FILE: &str = "LLAMA_ARG_HF_FILE";
/// llama.cpp's `-m`/`--model` (the model's path).
pub const LLAMA_ARG_MODEL: &str = "LLAMA_ARG_MODEL";

/// What happened to one pod's model cache (a metrics label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelOutcome {
    /// The cache was mounted.
    Injected,
    /// Not a serving pod of ours.
    NoLabel,
    /// Its ModelDeployment is not (yet) known.
    NoModelDeployment,
    /// No cache named, and no Ready cache holds the model.
    NoCache,
    /// The named cache does not exist.
    CacheNotFound,
    /// The named cache is not Ready (or its claim not made yet).
    CacheNotReady,
    /// The pod has a model cache already.
    AlreadyInjected,
    /// The pod uses our volume name or mount path: left as it is.
    Conflict,
    /// Not a Pod CREATE, or a request that could not be read.
    Skipped,
}

impl ModelOutcome {
    /// The log value.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelOutcome::Injected => "injected",
            ModelOutcome::NoLabel => "no-label",
            ModelOutcome::NoModelDeployment => "no-model-deployment",
            ModelOutcome::NoCache => "no-cache",
            ModelOutcome::CacheNotFound => "cache-not-found",
            ModelOutcome::CacheNotReady => "cache-not-ready",
            ModelOutcome::AlreadyInjected => "already-injected",
            ModelOutcome::Conflict => "conflict",
            ModelOutcome::Skipped => "skipped",
        }
    }
}

/// The cache a ModelDeployment's pods mount, among `caches` (those of its namespace):
/// [`model::choose`], its refusals as outcomes.
pub fn choose(md: &ModelDeployment, caches: &[Arc<ModelCache>]) -> Result<Chosen, ModelOutcome> {
    model::choose(&md.spec.model, caches).map_err(|why| match why {
        NotChosen::NotFound(_) => ModelOutcome::CacheNotFound,
        NotChosen::NotReady(_) if md.spec.model.cache_ref.is_some() => ModelOutcome::CacheNotReady,
        NotChosen::NotReady(_) | NotChosen::NoCache => ModelOutcome::NoCache,
    })
}

/// The patch mounting the model cache the pod's ModelDeployment uses, or why there is
/// none; `model_deployment` finds a ModelDeployment of the pod's namespace by name,
/// `caches` gives the namespace's ModelCaches (look-ups in watch caches).
pub fn decide(
    pod: &Value,
    namespace: &str,
    model_deployment: impl FnOnce(&str) -> Option<Arc<ModelDeployment>>,
    caches: impl FnOnce() -> Vec<Arc<ModelCache>>,
) -> Result<Vec<Value>, ModelOutcome> {
    let md_name = pod["metadata"]["labels"][MODEL_DEPLOYMENT]
        .as_str()
        .ok_or(ModelOutcome::NoLabel)?;
    if pod["metadata"]["annotations"][MODEL_INJECTED_ANNOTATION].is_string() {
        return Err(ModelOutcome::AlreadyInjected);
    }
    let md = model_deployment(md_name).ok_or(ModelOutcome::NoModelDeployment)?;
    let chosen = choose(&md, &caches())?;
    patch(pod, namespace, &chosen, md.resolved_engine()).map_err(|why| {
        tracing::info!(namespace, cache = %chosen.name, reason = %why, "model cache not mounted");
        ModelOutcome::Conflict
    })
}

/// Where container `c` reads the hub cache: its own literal `HF_HUB_CACHE`, else
/// [`MODEL_MOUNT_ROOT`] (and whether to set it); an error when it sets it from a
/// reference.
fn hub_dir(c: &Value) -> Result<(String, bool), String> {
    literal_dir(c, HF_HUB_CACHE)
        .transpose()
        .unwrap_or_else(|| Ok((MODEL_MOUNT_ROOT.to_string(), true)))
}

/// The absolute path container `c` sets `name` to (`false`: nothing to set), none when
/// it does not set it, an error when it sets it to no absolute path (a reference).
fn literal_dir(c: &Value, name: &str) -> Result<Option<(String, bool)>, String> {
    let mut env = c["env"].as_array().into_iter().flatten();
    match env.find(|v| v["name"] == name) {
        Some(v) => v["value"]
            .as_str()
            .filter(|p| p.starts_with('/'))
            .map(|p| Some((p.trim_end_matches('/').to_string(), false)))
            .ok_or_else(|| {
                format!(
                    "container {} sets {name} to no absolute path",
                    c["name"].as_str().unwrap_or_default()
                )
            }),
        None => Ok(None),
    }
}

/// How a llama.cpp container names its model (its command, args and environment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlamaModel {
    /// A Hugging Face repository (`-hf`/`-hfr`/`--hf-repo`, `LLAMA_ARG_HF_REPO`), and
    /// whether it names the file too (`-hff`/`--hf-file`, `LLAMA_ARG_HF_FILE`).
    HfRepo {
        /// The file is named.
        file: bool,
    },
    /// Something else: a path (`-m`/`--model`, `LLAMA_ARG_MODEL`), a URL (`-mu`,
    /// `--model-url`, `LLAMA_ARG_MODEL_URL`), a Docker repository (`-dr`), or a runner's
    /// model URL as an argument (`huggingface://...`, KAITO's llama.cpp runner).
    Other,
    /// Nothing: `llama-server` would take `LLAMA_ARG_MODEL`.
    Unnamed,
}

/// How container `c` names its llama.cpp model ([`LlamaModel`]).
pub fn llama_model(c: &Value) -> LlamaModel {
    let tokens: Vec<&str> = ["command", "args"]
        .iter()
        .flat_map(|k| c[*k].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    let flag = |names: &[&str]| {
        tokens.iter().any(|t| {
            names
                .iter()
                .any(|n| *t == *n || t.strip_prefix(n).is_some_and(|r| r.starts_with('=')))
        })
    };
    let env = |name: &str| {
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["name"] == name)
    };
    if flag(&["-hf", "-hfr", "--hf-repo"]) || env("LLAMA_ARG_HF_REPO") {
        return LlamaModel::HfRepo {
            file: flag(&["-hff", "--hf-file"]) || env(LLAMA_ARG_HF_FILE),
        };
    }
    let url = tokens
        .iter()
        .any(|t| !t.starts_with('-') && t.contains("://"));
    if url
        || flag(&[
            "-m",
            "--model",
            "-mu",
            "--model-url",
            "-dr",
            "--docker-repo",
        ])
        || env(LLAMA_ARG_MODEL)
        || env("LLAMA_ARG_MODEL_URL")
        || env("LLAMA_ARG_DOCKER_REPO")
    {
        return LlamaModel::Other;
    }
    LlamaModel::Unnamed
}

/// The JSON patch: the claim's volume, each container's read-only mount and environment
/// ([`container_ops`]), the annotation naming the cache. An error (the pod is left
/// alone) when a name or path of ours is taken or a container has no containers.
pub fn patch(
    pod: &Value,
    namespace: &str,
    chosen: &Chosen,
    engine: Option<EngineType>,
) -> Result<Vec<Value>, String> {
    let spec = &pod["spec"];
    if spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| v["name"] == VOLUME)
    {
        return Err(format!("the pod already has a volume named {VOLUME}"));
    }
    let containers = spec["containers"]
        .as_array()
        .filter(|c| !c.is_empty())
        .ok_or("the pod has no containers")?;
    let mut ops = Vec::new();
    let volume = json!({"name": VOLUME, "persistentVolumeClaim": {"claimName": chosen.claim, "readOnly": true}});
    append(&mut ops, spec, "volumes", "/spec", vec![volume]);
    for (i, c) in containers.iter().enumerate() {
        container_ops(&mut ops, i, c, chosen, engine)?;
    }
    let value = format!("{namespace}/{}@{}", chosen.name, chosen.commit);
    if pod["metadata"]["annotations"].is_object() {
        let key = MODEL_INJECTED_ANNOTATION
            .replace('~', "~0")
            .replace('/', "~1");
        ops.push(
            json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": value}),
        );
    } else {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {MODEL_INJECTED_ANNOTATION: value}}));
    }
    Ok(ops)
}

/// Container `i` mounts the claim read-only at `<its hub cache>/<folder>` and gets
/// `HF_HUB_CACHE` and `HF_HUB_OFFLINE=1` where it does not set them; an error when it
/// mounts something there already. A llama.cpp container ([`llama_env`]) reads the
/// cache where llama.cpp looks.
fn container_ops(
    ops: &mut Vec<Value>,
    i: usize,
    c: &Value,
    chosen: &Chosen,
    engine: Option<EngineType>,
) -> Result<(), String> {
    let llama = (engine == Some(EngineType::Llamacpp)).then(|| llama_model(c));
    // llama.cpp's `--hf-repo` looks in `LLAMA_CACHE` first, when the container sets it.
    let llama_cache = match llama {
        Some(LlamaModel::HfRepo { .. }) => literal_dir(c, LLAMA_CACHE)?,
        _ => None,
    };
    if let Some((dir, _)) = &llama_cache {
        // No mount point can be made inside a read-only volume.
        let read_only = c["volumeMounts"].as_array().into_iter().flatten().any(|m| {
            m["mountPath"].as_str().map(|p| p.trim_end_matches('/')) == Some(dir.as_str())
                && m["readOnly"] == true
        });
        if read_only {
            return Err(format!(
                "container {} has {LLAMA_CACHE} on a read-only volume ({dir})",
                c["name"].as_str().unwrap_or_default()
            ));
        }
    }
    let (dir, set_dir) = match llama_cache {
        Some(found) => found,
        None => hub_dir(c)?,
    };
    let mount_path = format!("{dir}/{}", hub_folder(&chosen.repo));
    let name = c["name"].as_str().unwrap_or_default();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        if m["mountPath"].as_str().map(|p| p.trim_end_matches('/')) == Some(mount_path.as_str()) {
            return Err(format!(
                "container {name} already mounts {} at {mount_path}",
                m["name"].as_str().unwrap_or_default()
            ));
        }
    }
    let path = format!("/spec/containers/{i}");
    let mount = json!({"name": VOLUME, "mountPath": mount_path, "readOnly": true});
    append(ops, c, "volumeMounts", &path, vec![mount]);
    let has = |n: &str| {
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["name"] == n)
    };
    let mut env = Vec::new();
    if set_dir {
        env.push(json!({"name": HF_HUB_CACHE, "value": dir}));
    }
    if !has(HF_HUB_OFFLINE) {
        env.push(json!({"name": HF_HUB_OFFLINE, "value": "1"}));
    }
    if let Some(model) = llama {
        env.extend(
            llama_env(model, &mount_path, chosen)
                .into_iter()
                .filter(|(n, _)| !has(n))
                .map(|(n, v)| json!({"name": n, "value": v})),
        );
    }
    if !env.is_empty() {
        append(ops, c, "env", &path, env);
    }
    Ok(())
}

/// What a llama.cpp container is given to load the cached GGUF, by how it names its
/// model (the container's own values are never replaced):
///
/// - `--hf-repo` (the Deployment provider's `llama-server --hf-repo <id>`): llama.cpp's
///   own Hugging Face cache, where the claim is mounted (`LLAMA_CACHE` when the container
///   sets it, else `HF_HUB_CACHE`), with `LLAMA_ARG_OFFLINE=1`, so that it loads the
///   cached files and never downloads, and `LLAMA_ARG_HF_FILE` naming the cache's one
///   GGUF file when its `include` names exactly one (without it llama.cpp picks among
///   the cached GGUF files by its own rule: the `:quant` tag, else `Q4_K_M`, else the
///   first). `-m` is not used here: with `--hf-repo`, llama.cpp takes `-m` for the
///   repository's file name, not a path.
/// - nothing (`llama-server` alone): `LLAMA_ARG_MODEL`, the path of the one GGUF file in
///   the mounted snapshot (`<mount>/snapshots/<commit>/<file>`), when `include` names
///   exactly one; else nothing (the file is not known from the spec).
/// - anything else (`-m` a path of its own, a URL, a runner's `huggingface://` argument):
///   nothing: the container chose its model file itself.
pub fn llama_env(model: LlamaModel, mount_path: &str, chosen: &Chosen) -> Vec<(String, String)> {
    match model {
        LlamaModel::HfRepo { file } => {
            let mut env = vec![(LLAMA_ARG_OFFLINE.to_string(), "1".to_string())];
            if let (false, Some(gguf)) = (file, &chosen.gguf) {
                env.push((LLAMA_ARG_HF_FILE.to_string(), gguf.clone()));
            }
            env
        }
        LlamaModel::Unnamed => chosen
            .gguf
            .iter()
            .map(|gguf| {
                (
                    LLAMA_ARG_MODEL.to_string(),
                    format!("{mount_path}/snapshots/{}/{gguf}", chosen.commit),
                )
            })
            .collect(),
        LlamaModel::Other => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use kubeairunway_kernelcache_api::model::{ModelCacheSpec, ModelCacheStatus};
    use kubeairunway_sdk::api::{ModelCacheRef, ModelSource};

    fn cache(name: &str, source: &str, ready_nodes: i32) -> Arc<ModelCache> {
        let mut c = ModelCache::new(
            name,
            ModelCacheSpec {
                source: source.into(),
                ..ModelCacheSpec::default()
            },
        );
        c.metadata.generation = Some(1);
        c.status = Some(ModelCacheStatus {
            ready_nodes,
            resolved_commit: Some("abc".into()),
            claim_name: Some(format!("modelcache-{name}")),
            observed_generation: Some(1),
            conditions: vec![Condition {
                type_: model::conditions::READY.into(),
                status: if ready_nodes > 0 { "True" } else { "False" }.into(),
                reason: "Ready".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: Some(1),
            }],
            ..ModelCacheStatus::default()
        });
        Arc::new(c)
    }

    fn md(id: &str, named: Option<&str>) -> ModelDeployment {
        let mut md = ModelDeployment::new(
            "llama",
            serde_json::from_value(json!({"model": {"id": id}})).unwrap(),
        );
        md.spec.model.cache_ref = named.map(|n| ModelCacheRef { name: n.into() });
        md
    }

    fn pod(containers: &Value) -> Value {
        json!({"metadata": {"labels": {MODEL_DEPLOYMENT: "llama"}}, "spec": {"containers": containers.clone()}})
    }

    fn apply(pod: &Value, ops: Vec<Value>) -> Value {
        let mut p = pod.clone();
        json_patch::patch(
            &mut p,
            &serde_json::from_value::<json_patch::Patch>(Value::Array(ops)).unwrap(),
        )
        .unwrap();
        p
    }

    /// The rule is `model::choose`'s (tested there); the webhook maps its refusals to
    /// outcomes: a cache holding the model but not Ready is no cache for a pod that names
    /// none, and not ready for one that names it.
    #[test]
    fn the_rules_refusals_become_the_webhooks_outcomes() {
        let caches = vec![
            cache("b-qwen", "hf://Qwen/Qwen3", 1),
            cache("a-llama", "hf://meta/llama", 0),
        ];
        let chosen = choose(&md("Qwen/Qwen3", None), &caches).unwrap();
        assert_eq!(
            (chosen.name.as_str(), chosen.claim.as_str()),
            ("b-qwen", "modelcache-b-qwen")
        );
        assert_eq!(
            choose(&md("meta/llama", None), &caches),
            Err(ModelOutcome::NoCache)
        );
        assert_eq!(
            choose(&md("meta/llama", Some("a-llama")), &caches),
            Err(ModelOutcome::CacheNotReady)
        );
        assert_eq!(
            choose(&md("Qwen/Qwen3", Some("nope")), &caches),
            Err(ModelOutcome::CacheNotFound)
        );
        assert_eq!(
            choose(&md("x/y", None), &caches),
            Err(ModelOutcome::NoCache)
        );
        let mut custom = md("Qwen/Qwen3", None);
        custom.spec.model.source = ModelSource::Custom;
        assert_eq!(choose(&custom, &caches), Err(ModelOutcome::NoCache));
    }

    fn chosen() -> Chosen {
        Chosen {
            name: "qwen".into(),
            claim: "modelcache-qwen".into(),
            repo: "Qwen/Qwen3".into(),
            commit: "abc".into(),
            ready_nodes: 1,
            gguf: None,
        }
    }

    #[test]
    fn every_container_gets_the_claim_read_only_and_the_environment_it_lacks() {
        let p = pod(&json!([
            {"name": "a", "image": "vllm"},
            {"name": "b", "image": "vllm", "env": [
                {"name": "HF_HUB_CACHE", "value": "/data/hub/"},
                {"name": "HF_HUB_OFFLINE", "value": "0"},
            ], "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        ]));
        let out = apply(&p, patch(&p, "ml", &chosen(), None).unwrap());
        let spec = &out["spec"];
        assert_eq!(
            spec["volumes"],
            json!([{"name": VOLUME, "persistentVolumeClaim": {"claimName": "modelcache-qwen", "readOnly": true}}])
        );
        let a = &spec["containers"][0];
        assert_eq!(
            a["volumeMounts"],
            json!([{"name": VOLUME, "mountPath": "/models/hf/models--Qwen--Qwen3", "readOnly": true}])
        );
        assert_eq!(
            a["env"],
            json!([{"name": "HF_HUB_CACHE", "value": "/models/hf"}, {"name": "HF_HUB_OFFLINE", "value": "1"}])
        );
        let b = &spec["containers"][1];
        assert_eq!(
            b["volumeMounts"][1]["mountPath"],
            "/data/hub/models--Qwen--Qwen3"
        );
        assert_eq!(b["env"][0]["value"], "/data/hub/", "the user's values stay");
        assert_eq!(b["env"][1]["value"], "0");
        assert_eq!(b["env"].as_array().unwrap().len(), 2);
        assert_eq!(
            out["metadata"]["annotations"][MODEL_INJECTED_ANNOTATION],
            "ml/qwen@abc"
        );
    }

    #[test]
    fn a_pod_using_our_name_or_path_is_left_alone() {
        let taken = json!({"metadata": {}, "spec": {"volumes": [{"name": VOLUME, "emptyDir": {}}], "containers": [{"name": "a"}]}});
        assert!(patch(&taken, "ml", &chosen(), None).is_err());
        let mounted = pod(
            &json!([{"name": "a", "volumeMounts": [{"name": "x", "mountPath": "/models/hf/models--Qwen--Qwen3/"}]}]),
        );
        assert!(patch(&mounted, "ml", &chosen(), None).is_err());
        let referenced = pod(
            &json!([{"name": "a", "env": [{"name": "HF_HUB_CACHE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}]),
        );
        assert!(patch(&referenced, "ml", &chosen(), None).is_err());
        assert!(patch(&pod(&json!([])), "ml", &chosen(), None).is_err());
    }

    fn env_of(c: &Value) -> Vec<(String, String)> {
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                (
                    v["name"].as_str().unwrap().to_string(),
                    v["value"].as_str().unwrap_or("<ref>").to_string(),
                )
            })
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| ((*n).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn how_a_llama_cpp_container_names_its_model_is_read_from_its_command_args_and_env() {
        let c = |v: Value| v;
        assert_eq!(
            llama_model(&c(
                json!({"command": ["llama-server"], "args": ["--hf-repo", "a/b"]})
            )),
            LlamaModel::HfRepo { file: false }
        );
        assert_eq!(
            llama_model(&c(json!({"args": ["-hf", "a/b:Q8_0", "-hff", "x.gguf"]}))),
            LlamaModel::HfRepo { file: true }
        );
        assert_eq!(
            llama_model(&c(
                json!({"args": ["--hf-repo=a/b"], "env": [{"name": "LLAMA_ARG_HF_FILE", "value": "x.gguf"}]})
            )),
            LlamaModel::HfRepo { file: true }
        );
        assert_eq!(
            llama_model(&c(
                json!({"env": [{"name": "LLAMA_ARG_HF_REPO", "value": "a/b"}]})
            )),
            LlamaModel::HfRepo { file: false }
        );
        for other in [
            json!({"args": ["-m", "/models/x.gguf"]}),
            json!({"args": ["--model=/x.gguf"]}),
            json!({"args": ["-mu", "https://h/x.gguf"]}),
            json!({"args": ["huggingface://a/b", "--address=:5000"]}),
            json!({"env": [{"name": "LLAMA_ARG_MODEL", "value": "/x.gguf"}]}),
        ] {
            assert_eq!(llama_model(&other), LlamaModel::Other, "{other}");
        }
        assert_eq!(
            llama_model(&c(
                json!({"command": ["llama-server"], "args": ["--port", "8000", "--host", "0.0.0.0"]})
            )),
            LlamaModel::Unnamed
        );
        // `-mg` (main GPU) is not `-m`.
        assert_eq!(
            llama_model(&c(json!({"args": ["-mg", "0"]}))),
            LlamaModel::Unnamed
        );
    }

    #[test]
    fn a_llama_cpp_hf_repo_container_loads_the_cached_gguf_offline_from_its_llama_cache() {
        let one = Chosen {
            gguf: Some("gemma-q8_0.gguf".into()),
            ..chosen()
        };
        // The Deployment provider's container: --hf-repo, LLAMA_CACHE set.
        let p = pod(&json!([{"name": "llama", "command": ["llama-server"],
            "args": ["--hf-repo", "Qwen/Qwen3", "--port", "8000"],
            "env": [{"name": "LLAMA_CACHE", "value": "/model-cache"}],
            "volumeMounts": [{"name": "model-cache", "mountPath": "/model-cache"}]}]));
        let out = apply(
            &p,
            patch(&p, "ml", &one, Some(EngineType::Llamacpp)).unwrap(),
        );
        let c = &out["spec"]["containers"][0];
        assert_eq!(
            c["volumeMounts"][1],
            json!({"name": VOLUME, "mountPath": "/model-cache/models--Qwen--Qwen3", "readOnly": true})
        );
        assert_eq!(
            env_of(c),
            pairs(&[
                ("LLAMA_CACHE", "/model-cache"),
                ("HF_HUB_OFFLINE", "1"),
                ("LLAMA_ARG_OFFLINE", "1"),
                ("LLAMA_ARG_HF_FILE", "gemma-q8_0.gguf"),
            ])
        );
        // Without LLAMA_CACHE: HF_HUB_CACHE, as for the other engines; the file unknown
        // (a wildcard include): llama.cpp chooses among the cached files, offline.
        let p = pod(&json!([{"name": "llama", "args": ["-hf", "Qwen/Qwen3"]}]));
        let out = apply(
            &p,
            patch(&p, "ml", &chosen(), Some(EngineType::Llamacpp)).unwrap(),
        );
        let c = &out["spec"]["containers"][0];
        assert_eq!(
            c["volumeMounts"][0]["mountPath"],
            "/models/hf/models--Qwen--Qwen3"
        );
        assert_eq!(
            env_of(c),
            pairs(&[
                ("HF_HUB_CACHE", "/models/hf"),
                ("HF_HUB_OFFLINE", "1"),
                ("LLAMA_ARG_OFFLINE", "1"),
            ])
        );
        // The user's values stay: their --hf-file and offline setting.
        let p = pod(
            &json!([{"name": "llama", "args": ["-hf", "Qwen/Qwen3", "--hf-file", "mine.gguf"],
            "env": [{"name": "LLAMA_ARG_OFFLINE", "value": "0"}]}]),
        );
        let out = apply(
            &p,
            patch(&p, "ml", &one, Some(EngineType::Llamacpp)).unwrap(),
        );
        let env = env_of(&out["spec"]["containers"][0]);
        assert_eq!(env[0], ("LLAMA_ARG_OFFLINE".into(), "0".into()));
        assert!(!env.iter().any(|(n, _)| n == LLAMA_ARG_HF_FILE), "{env:?}");
        // LLAMA_CACHE on a read-only volume (a claim of weights): no mount point can be
        // made in it, the pod is left alone.
        let p = pod(&json!([{"name": "llama", "args": ["-hf", "Qwen/Qwen3"],
            "env": [{"name": "LLAMA_CACHE", "value": "/model-cache/"}],
            "volumeMounts": [{"name": "weights", "mountPath": "/model-cache", "readOnly": true}]}]));
        let why = patch(&p, "ml", &one, Some(EngineType::Llamacpp)).unwrap_err();
        assert!(why.contains("read-only"), "{why}");
        // A LLAMA_CACHE from a reference: its path unknown, the pod is left alone.
        let p = pod(&json!([{"name": "llama", "args": ["-hf", "Qwen/Qwen3"],
            "env": [{"name": "LLAMA_CACHE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}]));
        assert!(patch(&p, "ml", &one, Some(EngineType::Llamacpp)).is_err());
    }

    #[test]
    fn a_llama_cpp_container_naming_no_model_gets_the_snapshot_path_of_the_one_gguf() {
        let one = Chosen {
            gguf: Some("sub/gemma-q8_0.gguf".into()),
            ..chosen()
        };
        let p = pod(
            &json!([{"name": "llama", "command": ["llama-server"], "args": ["--port", "8000"]}]),
        );
        let out = apply(
            &p,
            patch(&p, "ml", &one, Some(EngineType::Llamacpp)).unwrap(),
        );
        let env = env_of(&out["spec"]["containers"][0]);
        assert_eq!(
            env.last().unwrap(),
            &(
                "LLAMA_ARG_MODEL".to_string(),
                "/models/hf/models--Qwen--Qwen3/snapshots/abc/sub/gemma-q8_0.gguf".to_string()
            )
        );
        // The file not known: nothing of llama.cpp's is set.
        let out = apply(
            &p,
            patch(&p, "ml", &chosen(), Some(EngineType::Llamacpp)).unwrap(),
        );
        let env = env_of(&out["spec"]["containers"][0]);
        assert!(env.iter().all(|(n, _)| !n.starts_with("LLAMA_")), "{env:?}");
        // A container with a model of its own (KAITO's runner), or another engine: the
        // Hugging Face environment only, whatever the cache holds.
        for (containers, engine) in [
            (
                json!([{"name": "model", "args": ["huggingface://Qwen/Qwen3", "--address=:5000"]}]),
                Some(EngineType::Llamacpp),
            ),
            (
                json!([{"name": "llama", "args": ["-m", "/data/x.gguf"]}]),
                Some(EngineType::Llamacpp),
            ),
            (
                json!([{"name": "vllm", "args": ["--model", "Qwen/Qwen3"]}]),
                Some(EngineType::Vllm),
            ),
        ] {
            let p = pod(&containers);
            let out = apply(&p, patch(&p, "ml", &one, engine).unwrap());
            let env = env_of(&out["spec"]["containers"][0]);
            assert_eq!(
                env,
                pairs(&[("HF_HUB_CACHE", "/models/hf"), ("HF_HUB_OFFLINE", "1")]),
                "{containers}"
            );
        }
    }
}
