//! Snapshot tests of rendered RayServices (the snapshots under `src/snapshots/` are the
//! spec), with `serveConfigV2` parsed back as YAML and checked, and every rendered field
//! checked against both real RayService CRDs (KubeRay 1.3 and 1.7).
//!
//! Each snapshot was reviewed against the upstream example of the same mode, cited next
//! to its test: KubeRay's Ray Serve LLM sample
//! `ray-operator/config/samples/ray-service.llm-serve.yaml@v1.7.0` (aggregated) and its
//! autoscaling RayService sample `ray-service.incremental-upgrade.yaml@v1.7.0`, and Ray's
//! own `build_openai_app` / `build_pd_openai_app` YAML examples in
//! `python/ray/serve/llm/__init__.py@ray-2.52.0`. Where we differ from the sample, the
//! test says why.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kubeairunway_sdk::api::{
    ComponentScaling, GpuSpec, ModelDeployment, ResourceSpec, ServingMode,
};
use kubeairunway_sdk::testing::ModelDeploymentBuilder;
use kubeairunway_sdk::{Provider, UpstreamApi, Warning};
use serde_json::{Value, json};

use crate::settings::KubeRayProvider;

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
            "provider": {"name": "kuberay", "overrides": {"head": {
                "resources": {"cpu": "2", "memory": "8Gi"},
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
            }}},
            "engine": {"type": "vllm", "contextLength": 8192, "trustRemoteCode": true,
                       "image": "registry.example.com/ray-llm:custom",
                       "enablePrefixCaching": true, "enforceEager": true,
                       "args": {"gpu-memory-utilization": "0.9",
                                "max-num-seqs": "64", "quantization": "awq", "tokenizer-mode": "on"}},
            "scaling": {"replicas": 2},
            "resources": {"gpu": {"count": 2, "type": "amd.com/gpu"}, "memory": "64Gi", "cpu": "8"},
            "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
            "podTemplate": {"metadata": {"labels": {"tier": "gold"}, "annotations": {"note": "n"}}},
            "secrets": {"huggingFaceToken": "hf-token"},
            "nodeSelector": {"gpu": "mi300"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-3.1-8b",
                      "storage": {"volumes": [
                          {"name": "weights", "claimName": "hf-cache", "purpose": "modelCache"},
                          {"name": "compile", "claimName": "vllm-cache", "purpose": "compilationCache"},
                          {"name": "datasets", "claimName": "datasets", "mountPath": "/data", "readOnly": true},
                      ]}},
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
            // Per replica of either role; a role's own memory wins.
            s.resources = Some(ResourceSpec {
                gpu: None,
                memory: Some("16Gi".into()),
                cpu: Some("6".into()),
            });
            s.scaling.prefill = Some(role(2, 1, Some("64Gi")));
            s.scaling.decode = Some(role(1, 4, None));
        })
        .build()
}

/// Reviewed against `ray-operator/config/samples/ray-service.llm-serve.yaml@v1.7.0` (same
/// mode: one `build_openai_app` application, one GPU worker group): the same head
/// (`num-gpus: "0"`, ports `serve` 8000, `gcs-server`/`dashboard`/`client` as KubeRay names
/// them) and worker shape (`num-gpus` = the GPU limit, `nvidia.com/gpu` limit, the Ray LLM
/// image of the `rayVersion`). Differences, on purpose: the head keeps its CPUs
/// (`num-cpus` not `"0"`) for the OpenAI ingress replica, so that it never needs a GPU
/// pod; the cluster autoscales (`enableInTreeAutoscaling`, `minReplicas: 0`, the CRD's
/// default `maxReplicas`, as `ray-service.incremental-upgrade.yaml:51,76-79@v1.7.0`)
/// because KubeRay never passes worker replica counts to an existing cluster; the
/// worker advertises one CPU when none is given (the autoscaler needs a number);
/// `deployment_config.num_replicas` instead of the sample's autoscaling_config (the
/// replicas asked for).
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
    assert_eq!(cluster["enableInTreeAutoscaling"], true);
    let head = &cluster["headGroupSpec"];
    assert_eq!(head["rayStartParams"], json!({"num-gpus": "0"}));
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
    assert_eq!(
        worker["rayStartParams"],
        json!({"num-cpus": "1", "num-gpus": "1"})
    );
    assert_eq!(
        (
            &worker["replicas"],
            &worker["minReplicas"],
            &worker["maxReplicas"]
        ),
        (&json!(1), &json!(0), &json!(2_147_483_647))
    );
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

/// Reviewed against `ray-service.llm-serve.yaml@v1.7.0` like [`minimal_aggregated`], with
/// every field of the ModelDeployment set: a CPU request on the workers replaces the
/// advertised `num-cpus` (KubeRay derives it from the limit, `pod.go:1394-1405@v1.7.0`);
/// the storage volumes on head and workers, `HF_HOME` and `VLLM_CACHE_ROOT` after the
/// user's env; the Hugging Face token Secret as `envFrom` (the sample uses one key of it).
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
            "enable_prefix_caching": true,
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
    assert!(config.get("placement_group_config").is_none());
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
        json!({"dashboard-host": "0.0.0.0", "num-cpus": "0", "num-gpus": "0"})
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
        (&json!(2), &json!(0), &json!(2_147_483_647))
    );
    assert_eq!(worker["rayStartParams"], json!({"num-gpus": "2"}));
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
            json!([
                {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
                {"name": "HF_HOME", "value": "/model-cache"},
                {"name": "VLLM_CACHE_ROOT", "value": "/compilation-cache"},
            ])
        );
        assert_eq!(
            container["volumeMounts"],
            json!([
                {"name": "weights", "mountPath": "/model-cache"},
                {"name": "compile", "mountPath": "/compilation-cache"},
                {"name": "datasets", "mountPath": "/data", "readOnly": true},
            ])
        );
        assert_eq!(
            pod["spec"]["volumes"][2],
            json!({"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": true}})
        );
        assert_eq!(
            container["envFrom"],
            json!([{"secretRef": {"name": "hf-token"}}])
        );
    }
}

/// Reviewed against Ray's `build_pd_openai_app` YAML example
/// (`python/ray/serve/llm/__init__.py@ray-2.52.0`: `args.prefill_config` and
/// `args.decode_config`, each an LLMConfig) and the builder's rules
/// (`serving_patterns/prefill_decode/builder.py:100-115@ray-2.52.0`: the same `model_id`,
/// a `kv_transfer_config` in both; Ray's docs use `NixlConnector`/`kv_both`); KubeRay has
/// no P/D sample, so the cluster follows `ray-service.llm-serve.yaml@v1.7.0` with one
/// group per role, each advertising its role's custom resource, which the role's
/// placement group asks for (`STRICT_PACK`, one GPU bundle per tensor-parallel rank).
#[test]
fn disaggregated_prefill_and_decode() {
    let (object, serve) = render(&disaggregated());
    insta::assert_yaml_snapshot!("disaggregated", object);
    insta::assert_yaml_snapshot!("disaggregated_serve_config", serve);

    let app = &serve["applications"][0];
    assert_eq!(app["import_path"], "ray.serve.llm:build_pd_openai_app");
    let kv = json!({"kv_connector": "NixlConnector", "kv_role": "kv_both"});
    for (role, tp, replicas) in [("prefill", 1_usize, 2), ("decode", 4, 1)] {
        let config = &app["args"][format!("{role}_config")];
        assert_eq!(
            config["model_loading_config"]["model_source"],
            "Qwen/Qwen2.5-0.5B-Instruct"
        );
        assert_eq!(config["engine_kwargs"]["tensor_parallel_size"], tp);
        assert_eq!(config["engine_kwargs"]["kv_transfer_config"], kv);
        assert_eq!(config["deployment_config"]["num_replicas"], replicas);
        let bundle = json!({"GPU": 1, role: 1});
        assert_eq!(
            config["placement_group_config"],
            json!({"bundles": vec![bundle; tp], "strategy": "STRICT_PACK"})
        );
    }
    assert_eq!(
        app["args"]["prefill_config"]["model_loading_config"]["model_id"],
        app["args"]["decode_config"]["model_loading_config"]["model_id"]
    );
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
        json!({"cpu": "6", "memory": "64Gi", "nvidia.com/gpu": 1})
    );
    assert_eq!(
        limits("decode"),
        json!({"cpu": "6", "memory": "16Gi", "nvidia.com/gpu": 4})
    );
    assert_eq!(groups["prefill"]["replicas"], 2);
    assert_eq!(groups["decode"]["replicas"], 1);
    assert_eq!(
        groups["prefill"]["rayStartParams"],
        json!({"num-gpus": "1", "resources": "'{\"prefill\":1}'"})
    );
    assert_eq!(
        groups["decode"]["rayStartParams"],
        json!({"num-gpus": "4", "resources": "'{\"decode\":4}'"})
    );
}

#[test]
fn unknown_keys_under_head_and_wrong_types_fail_other_keys_merge_into_the_rayservice() {
    let provider = KubeRayProvider::default();
    let refused = |overrides: serde_json::Value, starts: &str| {
        let md = ModelDeploymentBuilder::new("m")
            .overrides(overrides)
            .build();
        let err = provider.render(&md, &apis()[0].1).unwrap_err();
        assert!(err.0.starts_with(starts), "{err}");
    };
    refused(
        json!({"head": {"resources": {"cpu": "1", "cpus": "2"}}}),
        "unknown override provider.overrides.head.resources.cpus:",
    );
    refused(
        json!({"head": {"rayStartParams": ["num-cpus=0"]}}),
        "invalid override provider.overrides.head.rayStartParams",
    );

    // `spec.upgradeStrategy.type` is a string and `spec.suspend` a boolean of the
    // RayService, which has no `spec.replicas` (ray.io_rayservices.yaml, v1.7.0).
    let md = ModelDeploymentBuilder::new("m")
        .namespace("ns")
        .overrides(json!({"head": {"resources": {"cpu": "1"}},
                          "spec": {"upgradeStrategy": {"type": "NewCluster"}}}))
        .build();
    let api = &apis()[0].1;
    let rendered = provider.render(&md, api).unwrap();
    let object =
        &kubeairunway_sdk::render::finalize(&provider, &md, api, rendered.objects).unwrap()[0];
    assert_eq!(
        object.data["spec"]["upgradeStrategy"]["type"], "NewCluster",
        "merged"
    );
    assert_eq!(
        object.data["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
            [0]["resources"]["requests"]["cpu"],
        "1"
    );
    let md = ModelDeploymentBuilder::new("m")
        .namespace("ns")
        .overrides(json!({"spec": {"replicas": 2, "suspend": "yes"}}))
        .build();
    let rendered = provider.render(&md, api).unwrap();
    let err =
        kubeairunway_sdk::render::finalize(&provider, &md, api, rendered.objects).unwrap_err();
    assert_eq!(err.reason(), "InvalidOverride");
    assert!(
        err.to_string().contains(
            "provider.overrides.spec.replicas (no such field), \
             provider.overrides.spec.suspend (must be boolean, not string)"
        ),
        "{err}"
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

/// `spec.image` and `spec.engine.image` are one setting: either names every pod's image.
#[test]
fn either_image_field_names_the_image() {
    let provider = KubeRayProvider::default();
    for md in [
        ModelDeploymentBuilder::new("m")
            .image("my/ray-llm:1")
            .build(),
        ModelDeploymentBuilder::new("m")
            .spec(|s| s.engine.image = Some("my/ray-llm:1".into()))
            .build(),
    ] {
        let object =
            serde_json::to_value(&provider.render(&md, &apis()[0].1).unwrap().objects[0]).unwrap();
        assert_eq!(
            object["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
                [0]["image"],
            "my/ray-llm:1"
        );
    }
}

/// `engine.extraArgs` cannot become `engine_kwargs` faithfully: named as ignored, and
/// left out of the Serve config.
#[test]
fn extra_args_are_named_as_ignored() {
    let md = ModelDeploymentBuilder::new("m")
        .spec(|s| s.engine.extra_args = Some(vec!["--max-num-seqs".into(), "8".into()]))
        .build();
    let rendered = KubeRayProvider::default()
        .render(&md, &apis()[0].1)
        .unwrap();
    assert_eq!(
        Warning::ignored_fields(&rendered.warnings),
        ["spec.engine.extraArgs"]
    );
    assert!(
        !serde_json::to_string(&rendered.objects[0])
            .unwrap()
            .contains("max_num_seqs")
    );
}

#[test]
fn registration_is_vllm_gpu_only_and_never_auto_selected() {
    let config = KubeRayProvider::default().config();
    let caps = config.capabilities.unwrap();
    assert_eq!(
        caps.engine_names(),
        [kubeairunway_sdk::api::EngineType::Vllm]
    );
    let vllm = caps
        .engine(kubeairunway_sdk::api::EngineType::Vllm)
        .unwrap();
    assert!(vllm.gpu_support && !vllm.cpu_support);
    assert_eq!(
        vllm.serving_modes,
        [ServingMode::Aggregated, ServingMode::Disaggregated]
    );
    // Ray Serve's OpenAI app serves chat completions only.
    assert_eq!(
        vllm.api_formats,
        [kubeairunway_sdk::api::ApiFormat::OpenaiChat]
    );
    assert!(config.selection_rules.is_empty());
    assert_eq!(KubeRayProvider::default().name(), "kuberay");
}

#[test]
fn ignored_fields_are_named() {
    let provider = KubeRayProvider::default();
    let md = ModelDeploymentBuilder::new("m")
        .spec(|s| {
            s.gateway = Some(serde_json::from_value(json!({"enabled": true})).unwrap());
            s.model.storage = Some(
                serde_json::from_value(json!({"volumes": [
                    {"name": "weights", "purpose": "modelCache", "size": "100Gi"},
                ]}))
                .unwrap(),
            );
        })
        .build();
    let rendered = provider.render(&md, &apis()[0].1).unwrap();
    assert_eq!(
        Warning::ignored_fields(&rendered.warnings),
        ["spec.model.storage.volumes[weights].size"]
    );
    // The claim a controller would have created is what is mounted.
    let object = serde_json::to_value(&rendered.objects[0]).unwrap();
    assert_eq!(
        object["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["volumes"],
        json!([{"name": "weights", "persistentVolumeClaim": {"claimName": "m-weights"}}])
    );
    // A gateway switched off is nothing to ignore.
    let off = ModelDeploymentBuilder::new("m")
        .spec(|s| s.gateway = Some(serde_json::from_value(json!({"enabled": false})).unwrap()))
        .build();
    assert!(
        provider
            .render(&off, &apis()[0].1)
            .unwrap()
            .warnings
            .is_empty()
    );
}

#[test]
fn head_parameters_kuberay_refuses_fail_the_render() {
    let md = ModelDeploymentBuilder::new("m")
        .overrides(json!({"head": {"rayStartParams": {"labels": "a=b"}}}))
        .build();
    let err = KubeRayProvider::default()
        .render(&md, &apis()[0].1)
        .unwrap_err();
    assert!(err.0.contains("rayStartParams.labels"), "{}", err.0);
}

/// `servedName` is ignored for a custom source (the ModelDeployment API); the served name
/// is the basename of the path in the image.
#[test]
fn a_custom_source_serves_under_the_basename_of_its_path() {
    let md = ModelDeploymentBuilder::new("m")
        .spec(|s| {
            s.model.source = kubeairunway_sdk::api::ModelSource::Custom;
            s.model.id = Some("/models/llama-3-8b/".into());
            s.model.served_name = Some("ignored".into());
        })
        .build();
    let (_, serve) = render(&md);
    assert_eq!(
        serve["applications"][0]["args"]["llm_configs"][0]["model_loading_config"],
        json!({"model_id": "llama-3-8b", "model_source": "/models/llama-3-8b/"})
    );
}

/// `disable_log_stats` with Ray Serve LLM's default `log_engine_metrics: true` fails the
/// LLMConfig (`core/configs/llm_config.py:429-438@ray-2.52.0`).
#[test]
fn disabling_log_stats_turns_engine_metrics_off() {
    let md = ModelDeploymentBuilder::new("m")
        .spec(|s| {
            s.engine.args = Some([("disable-log-stats".to_string(), "true".to_string())].into());
        })
        .build();
    let (_, serve) = render(&md);
    let config = &serve["applications"][0]["args"]["llm_configs"][0];
    assert_eq!(config["log_engine_metrics"], false);
    assert_eq!(config["engine_kwargs"]["disable_log_stats"], true);
}

/// Every key we put in an `LLMConfig` is one Ray Serve LLM 2.52.0 knows: its models forbid
/// others (`common/base_pydantic.py:16-19`; fields in `core/configs/llm_config.py:114-226`,
/// placement groups in `engines/vllm/vllm_models.py:35-61`, all `@ray-2.52.0`).
/// (Checked once by hand as well: Ray 2.52.0's `LLMConfig.model_validate`,
/// `ServeDeploySchema` and the autoscaler's `_derive_autoscaling_config_from_ray_cr`
/// accept the snapshots.)
#[test]
fn llm_configs_use_only_fields_ray_2_52_knows() {
    const LLM_CONFIG: [&str; 11] = [
        "runtime_env",
        "model_loading_config",
        "llm_engine",
        "engine_kwargs",
        "accelerator_type",
        "placement_group_config",
        "lora_config",
        "deployment_config",
        "experimental_configs",
        "log_engine_metrics",
        "callback_config",
    ];
    const MODEL_LOADING: [&str; 3] = ["model_id", "model_source", "tokenizer_source"];
    const STRATEGIES: [&str; 4] = ["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"];
    let mut with_metrics_off = ModelDeploymentBuilder::new("m").build();
    with_metrics_off.spec.engine.args =
        Some([("disable-log-stats".to_string(), "true".to_string())].into());
    for md in [full(), disaggregated(), with_metrics_off] {
        let (_, serve) = render(&md);
        let args = &serve["applications"][0]["args"];
        let configs: Vec<&Value> = match args.get("llm_configs") {
            Some(list) => list.as_array().unwrap().iter().collect(),
            None => vec![&args["prefill_config"], &args["decode_config"]],
        };
        for config in configs {
            for key in config.as_object().unwrap().keys() {
                assert!(LLM_CONFIG.contains(&key.as_str()), "LLMConfig.{key}");
            }
            for key in config["model_loading_config"].as_object().unwrap().keys() {
                assert!(
                    MODEL_LOADING.contains(&key.as_str()),
                    "ModelLoadingConfig.{key}"
                );
            }
            assert_eq!(
                config["deployment_config"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .collect::<Vec<_>>(),
                ["num_replicas"]
            );
            if let Some(pg) = config.get("placement_group_config") {
                assert!(STRATEGIES.contains(&pg["strategy"].as_str().unwrap()));
                assert!(pg["bundles"].as_array().is_some_and(|b| !b.is_empty()));
            }
        }
    }
}

/// Overrides as users write them (documented keys holding any value, typos at any depth):
/// rendering never panics, a refusal names the override, and an accepted rendering only
/// has fields of both supported RayService schemas.
#[test]
fn any_overrides_render_or_are_refused_by_name() {
    let paths = [
        ("head.resources.cpu", vec![json!("2")]),
        ("head.resources.memory", vec![json!("8Gi")]),
        (
            "head.rayStartParams",
            vec![json!({"num-cpus": "0"}), json!({"labels": "a=b"})],
        ),
    ];
    let provider = KubeRayProvider::default();
    kubeairunway_sdk::testing::overrides::check_overrides(
        &ModelDeploymentBuilder::new("ov").namespace("ns").build(),
        &paths,
        |m| provider.render(m, &apis()[0].1),
        |_, r| {
            for object in &r.objects {
                let object = serde_json::to_value(object).unwrap();
                for (file, api) in apis() {
                    let missing = api.missing_paths(&object);
                    if !missing.is_empty() {
                        return Err(format!("{file}: fields not in the schema: {missing:?}"));
                    }
                }
            }
            Ok(())
        },
    );
}

/// The serving pods carry our label from the rendered templates (KubeRay copies it onto
/// the pods) and serve on the head's `serve` container port.
#[test]
fn serving_pods_are_labelled_by_the_templates_and_serve_on_the_serve_port() {
    let md = ModelDeploymentBuilder::new("llm").build();
    let (object, _) = render(&md);
    let pods = KubeRayProvider::default().serving_pods(&md);
    assert_eq!(
        pods.selector(),
        "kubeairunway.ai/model-deployment=llm,ray.io/serve=true"
    );
    let head = &object["spec"]["rayClusterConfig"]["headGroupSpec"]["template"];
    assert_eq!(
        head["metadata"]["labels"]["kubeairunway.ai/model-deployment"],
        "llm"
    );
    let ports = head["spec"]["containers"][0]["ports"].as_array().unwrap();
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == "serve" && p["containerPort"] == json!(pods.port)),
        "{ports:?}"
    );
}
