//! Snapshot tests of rendered RayServices (the snapshots under `src/snapshots/` are the
//! spec), with `serveConfigV2` parsed back as YAML and checked, and every rendered field
//! checked against both real RayService CRDs (KubeRay 1.3 and 1.7).

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DynamicObject;
use kubeairunway_sdk::api::{ComponentScaling, GpuSpec, ModelDeployment, ServingMode};
use kubeairunway_sdk::testing::ModelDeploymentBuilder;
use kubeairunway_sdk::{Provider, UpstreamApi};
use serde_json::{Value, json};

use crate::KubeRayProvider;

fn upstream(file: &str) -> UpstreamApi {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/crds/upstream")
        .join(file);
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    UpstreamApi::detect(&crd, &KubeRayProvider::default().upstream()).unwrap()
}

fn apis() -> &'static [(String, UpstreamApi)] {
    static APIS: std::sync::OnceLock<Vec<(String, UpstreamApi)>> = std::sync::OnceLock::new();
    APIS.get_or_init(|| {
        ["ray.io_rayservices.yaml", "ray.io_rayservices.v1.3.0.yaml"]
            .into_iter()
            .map(|f| (f.to_string(), upstream(f)))
            .collect()
    })
}

/// Render with the real v1.7 API, check the fields against both CRDs, and return the
/// object as JSON with the parsed serve config.
fn render(md: &ModelDeployment) -> (Value, Value) {
    let provider = KubeRayProvider::default();
    let rendered = provider.render(md, &apis()[0].1).unwrap();
    assert_eq!(rendered.objects.len(), 1);
    let object = serde_json::to_value(&rendered.objects[0]).unwrap();
    for (file, api) in apis() {
        assert_eq!(api.api_version(), "ray.io/v1");
        assert!(
            api.missing_paths(&object).is_empty(),
            "{file}: {:?}",
            api.missing_paths(&object)
        );
    }
    // Deterministic: the same input gives byte-identical output.
    let again = provider.render(md, &apis()[0].1).unwrap();
    assert_eq!(
        serde_json::to_string(&again.objects[0]).unwrap(),
        serde_json::to_string(&rendered.objects[0]).unwrap()
    );
    let text = object["spec"]["serveConfigV2"].as_str().unwrap();
    let serve: Value = serde_saphyr::from_str(text).unwrap();
    (object, serve)
}

fn full() -> ModelDeployment {
    let md: ModelDeployment = serde_json::from_value(json!({
        "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "llama", "namespace": "team-a",
                     "labels": {"kubeairunway.ai/team": "a", "app": "x"}},
        "spec": {
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-3.1-8b"},
            "provider": {"name": "kuberay", "overrides": {"head": {
                "resources": {"cpu": "2", "memory": "8Gi"},
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
            }}},
            "engine": {"type": "vllm", "contextLength": 8192, "trustRemoteCode": true,
                       "args": {"--enforce-eager": "true", "gpu-memory-utilization": "0.9",
                                "max-num-seqs": "64", "quantization": "awq", "tokenizer-mode": "on"}},
            "scaling": {"replicas": 2},
            "resources": {"gpu": {"count": 2, "type": "amd.com/gpu"}, "memory": "64Gi", "cpu": "8"},
            "image": "registry.example.com/ray-llm:custom",
            "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
            "podTemplate": {"metadata": {"labels": {"tier": "gold"}, "annotations": {"note": "n"}}},
            "secrets": {"huggingFaceToken": "hf-token"},
            "nodeSelector": {"gpu": "mi300"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }))
    .unwrap();
    md
}

fn disaggregated() -> ModelDeployment {
    let role = |replicas, count, memory: Option<&str>| ComponentScaling {
        replicas,
        gpu: Some(GpuSpec {
            count,
            ..GpuSpec::default()
        }),
        memory: memory.map(ToString::to_string),
    };
    ModelDeploymentBuilder::new("pd")
        .namespace("team-b")
        .provider("kuberay")
        .mode(ServingMode::Disaggregated)
        .spec(|s| {
            s.resources = None;
            s.scaling.prefill = Some(role(2, 1, Some("64Gi")));
            s.scaling.decode = Some(role(1, 4, None));
        })
        .build()
}

#[test]
fn minimal_aggregated() {
    let md = ModelDeploymentBuilder::new("qwen")
        .provider("kuberay")
        .build();
    let (object, serve) = render(&md);
    insta::assert_yaml_snapshot!("minimal_aggregated", object);
    insta::assert_yaml_snapshot!("minimal_aggregated_serve_config", serve);

    let app = &serve["applications"][0];
    assert_eq!(app["import_path"], "ray.serve.llm:build_openai_app");
    assert_eq!(app["route_prefix"], "/");
    let config = &app["args"]["llm_configs"][0];
    assert_eq!(
        config["model_loading_config"],
        json!({"model_id": "Qwen2.5-0.5B-Instruct", "model_source": "Qwen/Qwen2.5-0.5B-Instruct"})
    );
    assert_eq!(config["engine_kwargs"], json!({"tensor_parallel_size": 1}));
    assert_eq!(config["deployment_config"], json!({"num_replicas": 1}));

    let cluster = &object["spec"]["rayClusterConfig"];
    assert_eq!(cluster["rayVersion"], "2.52.0");
    let head = &cluster["headGroupSpec"];
    assert_eq!(head["rayStartParams"], json!({}));
    let head_container = &head["template"]["spec"]["containers"][0];
    assert_eq!(
        head_container["image"],
        "rayproject/ray-llm:2.52.0-py311-cu128"
    );
    assert_eq!(
        head_container["resources"]["requests"],
        json!({"cpu": "4", "memory": "16Gi"})
    );
    assert!(
        head_container["ports"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "serve", "containerPort": 8000}))
    );
    let worker = &cluster["workerGroupSpecs"][0];
    assert_eq!(worker["rayStartParams"], json!({}));
    assert_eq!(
        worker["template"]["spec"]["containers"][0]["resources"]["limits"],
        json!({"memory": "32Gi", "nvidia.com/gpu": 1})
    );
    for group in [head, worker] {
        assert_eq!(
            group["template"]["metadata"]["labels"],
            json!({"kubeairunway.ai/model-deployment": "qwen"})
        );
    }
}

#[test]
fn full_aggregated() {
    let (object, serve) = render(&full());
    insta::assert_yaml_snapshot!("full_aggregated", object);
    insta::assert_yaml_snapshot!("full_aggregated_serve_config", serve);

    let config = &serve["applications"][0]["args"]["llm_configs"][0];
    assert_eq!(
        config["model_loading_config"],
        json!({"model_id": "llama-3.1-8b", "model_source": "meta-llama/Llama-3.1-8B-Instruct"})
    );
    assert_eq!(
        config["engine_kwargs"],
        json!({
            "enforce_eager": true,
            "gpu_memory_utilization": 0.9,
            "max_model_len": 8192,
            "max_num_seqs": 64,
            "quantization": "awq",
            "tensor_parallel_size": 2,
            "tokenizer_mode": "on",
            "trust_remote_code": true,
        })
    );
    assert_eq!(config["deployment_config"], json!({"num_replicas": 2}));
    // A YAML 1.1 reader (Ray's PyYAML) would read a bare `on` as a boolean.
    let text = object["spec"]["serveConfigV2"].as_str().unwrap();
    assert!(
        text.contains("tokenizer_mode: \"on\"") || text.contains("tokenizer_mode: 'on'"),
        "{text}"
    );

    let cluster = &object["spec"]["rayClusterConfig"];
    let head = &cluster["headGroupSpec"];
    assert_eq!(
        head["rayStartParams"],
        json!({"dashboard-host": "0.0.0.0", "num-cpus": "0"})
    );
    let head_container = &head["template"]["spec"]["containers"][0];
    assert_eq!(
        head_container["resources"]["limits"],
        json!({"cpu": "2", "memory": "8Gi"})
    );
    let worker = &cluster["workerGroupSpecs"][0];
    assert_eq!(
        (
            &worker["replicas"],
            &worker["minReplicas"],
            &worker["maxReplicas"]
        ),
        (&json!(2), &json!(2), &json!(2))
    );
    let worker_container = &worker["template"]["spec"]["containers"][0];
    assert_eq!(
        worker_container["resources"]["limits"],
        json!({"amd.com/gpu": 2, "cpu": "8", "memory": "64Gi"})
    );
    for (group, container) in [(head, head_container), (worker, worker_container)] {
        let pod = &group["template"];
        assert_eq!(
            pod["metadata"]["labels"],
            json!({"kubeairunway.ai/model-deployment": "llama", "tier": "gold"})
        );
        assert_eq!(pod["metadata"]["annotations"], json!({"note": "n"}));
        assert_eq!(pod["spec"]["nodeSelector"], json!({"gpu": "mi300"}));
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}])
        );
        assert_eq!(container["image"], "registry.example.com/ray-llm:custom");
        assert_eq!(
            container["env"],
            json!([{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}])
        );
        assert_eq!(
            container["envFrom"],
            json!([{"secretRef": {"name": "hf-token"}}])
        );
    }
}

#[test]
fn disaggregated_prefill_and_decode() {
    let (object, serve) = render(&disaggregated());
    insta::assert_yaml_snapshot!("disaggregated", object);
    insta::assert_yaml_snapshot!("disaggregated_serve_config", serve);

    let app = &serve["applications"][0];
    assert_eq!(app["import_path"], "ray.serve.llm:build_pd_openai_app");
    let kv = json!({"kv_connector": "NixlConnector", "kv_role": "kv_both"});
    for (role, tp, replicas) in [("prefill", 1, 2), ("decode", 4, 1)] {
        let config = &app["args"][format!("{role}_config")];
        assert_eq!(
            config["model_loading_config"]["model_source"],
            "Qwen/Qwen2.5-0.5B-Instruct"
        );
        assert_eq!(config["engine_kwargs"]["tensor_parallel_size"], tp);
        assert_eq!(config["engine_kwargs"]["kv_transfer_config"], kv);
        assert_eq!(config["deployment_config"]["num_replicas"], replicas);
    }
    let groups: BTreeMap<String, Value> = object["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["groupName"].as_str().unwrap().to_string(), g.clone()))
        .collect();
    let limits =
        |g: &str| groups[g]["template"]["spec"]["containers"][0]["resources"]["limits"].clone();
    assert_eq!(
        limits("prefill"),
        json!({"memory": "64Gi", "nvidia.com/gpu": 1})
    );
    assert_eq!(
        limits("decode"),
        json!({"memory": "32Gi", "nvidia.com/gpu": 4})
    );
    assert_eq!(groups["prefill"]["replicas"], 2);
    assert_eq!(groups["decode"]["replicas"], 1);
}

#[test]
fn unknown_overrides_warn_and_wrong_types_fail() {
    let provider = KubeRayProvider::default();
    let md = ModelDeploymentBuilder::new("m")
        .overrides(json!({"head": {"resources": {"cpu": "1", "cpus": "2"}}, "worker": {}}))
        .build();
    let rendered = provider.render(&md, &apis()[0].1).unwrap();
    let warnings: Vec<_> = rendered
        .warnings
        .iter()
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(
        warnings,
        [
            "unknown override provider.overrides.head.resources.cpus is ignored",
            "unknown override provider.overrides.worker is ignored",
        ]
    );
    let object: DynamicObject = rendered.objects[0].clone();
    assert_eq!(
        object.data["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
            [0]["resources"]["requests"]["cpu"],
        "1"
    );

    let bad = ModelDeploymentBuilder::new("m")
        .overrides(json!({"head": {"rayStartParams": ["num-cpus=0"]}}))
        .build();
    let err = provider.render(&bad, &apis()[0].1).unwrap_err();
    assert!(
        err.0
            .starts_with("invalid override provider.overrides.head.rayStartParams"),
        "{}",
        err.0
    );
}

#[test]
fn a_model_id_is_required() {
    let md = ModelDeploymentBuilder::new("m")
        .spec(|s| s.model.id = None)
        .build();
    let err = KubeRayProvider::default()
        .render(&md, &apis()[0].1)
        .unwrap_err();
    assert!(err.0.contains("spec.model.id"), "{}", err.0);
}

#[test]
fn image_and_ray_version_come_from_the_flags() {
    let provider = KubeRayProvider::new("mirror.example.com/ray-llm", "2.49.1-py311-cu128");
    let md = ModelDeploymentBuilder::new("m").build();
    let object =
        serde_json::to_value(&provider.render(&md, &apis()[1].1).unwrap().objects[0]).unwrap();
    let cluster = &object["spec"]["rayClusterConfig"];
    assert_eq!(cluster["rayVersion"], "2.49.1");
    assert_eq!(
        cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"],
        "mirror.example.com/ray-llm:2.49.1-py311-cu128"
    );
}

#[test]
fn registration_is_vllm_gpu_only_and_never_auto_selected() {
    let config = KubeRayProvider::default().config();
    let caps = config.capabilities.unwrap();
    assert_eq!(caps.engines, [kubeairunway_sdk::api::EngineType::Vllm]);
    assert!(caps.gpu_support && !caps.cpu_support);
    assert_eq!(
        caps.serving_modes,
        [ServingMode::Aggregated, ServingMode::Disaggregated]
    );
    assert!(config.selection_rules.is_empty());
    assert_eq!(KubeRayProvider::default().name(), "kuberay");
}
