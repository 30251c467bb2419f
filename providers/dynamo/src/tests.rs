//! Unit tests: rendering (snapshots of both adapters, checked against the real upstream
//! schemas), compatibility, registration, and status mapping.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::needless_pass_by_value
)]

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kubeairunway_sdk::api::{EngineType, Phase, ServingMode};
use kubeairunway_sdk::runtime::fit;
use kubeairunway_sdk::testing::ModelDeploymentBuilder;
use kubeairunway_sdk::{ModelDeployment, Provider, UpstreamApi, UpstreamRef, Warning};
use serde_json::{Value, json};

use super::*;

fn crd(file: &str) -> CustomResourceDefinition {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/crds/upstream")
        .join(file);
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The installed APIs an adapter is chosen for: the v1alpha1-only CRD of Dynamo 1.1, and
/// the newer CRD (v1beta1 preferred; its deprecated v1alpha1 checked as well).
fn apis() -> &'static [(&'static str, UpstreamApi)] {
    static APIS: OnceLock<Vec<(&'static str, UpstreamApi)>> = OnceLock::new();
    APIS.get_or_init(|| {
        let ours = Dynamo::default().upstream();
        let old = crd("nvidia.com_dynamographdeployments.v1alpha1-only.dynamo-1.1-branchcut.yaml");
        let new = crd("nvidia.com_dynamographdeployments.yaml");
        let alpha_of_new = UpstreamApi::detect(
            &new,
            &UpstreamRef {
                versions: vec!["v1alpha1".into()],
                ..ours.clone()
            },
        )
        .unwrap();
        vec![
            ("v1alpha1", UpstreamApi::detect(&old, &ours).unwrap()),
            ("v1beta1", UpstreamApi::detect(&new, &ours).unwrap()),
            ("v1alpha1-deprecated", alpha_of_new),
        ]
    })
}

fn api(version: &str) -> &'static UpstreamApi {
    &apis().iter().find(|(v, _)| *v == version).unwrap().1
}

fn md(yaml: &str) -> ModelDeployment {
    let mut md: ModelDeployment = serde_saphyr::from_str(yaml).unwrap();
    md.metadata.uid = Some("uid-1".into());
    md
}

/// An aggregated vLLM deployment of an 8B model on one GPU, with a Hugging Face token.
fn example1() -> ModelDeployment {
    md(r"
apiVersion: kubeairunway.ai/v1alpha1
kind: ModelDeployment
metadata: {name: llama-8b, namespace: default}
spec:
  model: {id: meta-llama/Llama-3.1-8B-Instruct, source: huggingface}
  engine: {type: vllm, contextLength: 8192}
  serving: {mode: aggregated}
  scaling: {replicas: 1}
  resources: {gpu: {count: 1}, memory: 32Gi}
  secrets: {huggingFaceToken: hf-token}
")
}

/// A disaggregated vLLM deployment with KV routing and a scaled frontend (router mode
/// as env, `--disaggregation-mode`).
fn example3() -> ModelDeployment {
    md(r#"
apiVersion: kubeairunway.ai/v1alpha1
kind: ModelDeployment
metadata: {name: llama-70b-pd, namespace: default}
spec:
  model: {id: meta-llama/Llama-3.1-70B-Instruct, source: huggingface}
  provider:
    name: dynamo
    overrides:
      routerMode: kv
      frontend: {replicas: 2, resources: {cpu: "4", memory: 8Gi}}
  engine: {type: vllm}
  serving: {mode: disaggregated}
  scaling:
    prefill: {replicas: 2, gpu: {count: 4}, memory: 128Gi}
    decode: {replicas: 4, gpu: {count: 2}, memory: 64Gi}
  secrets: {huggingFaceToken: hf-token}
"#)
}

/// Everything a pod template can carry: labels, annotations, env, node selector,
/// tolerations, engine args, trust-remote-code, a served name and a custom image.
fn full(engine: EngineType) -> ModelDeployment {
    let mut m = md(r#"
apiVersion: kubeairunway.ai/v1alpha1
kind: ModelDeployment
metadata: {name: full, namespace: team-a}
spec:
  model: {id: Qwen/Qwen3-0.6B, servedName: qwen}
  engine:
    contextLength: 4096
    trustRemoteCode: true
    args: {tensor-parallel-size: "1", enforce-eager: "true", gpu-memory-utilization: "0.9"}
  resources: {gpu: {count: 2}, memory: 48Gi, cpu: "8"}
  scaling: {replicas: 3}
  env: [{name: LOG_LEVEL, value: debug}]
  podTemplate: {metadata: {labels: {team: a}, annotations: {note: hi}}}
  nodeSelector: {gpu: h100}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
"#);
    m.spec.engine.type_ = Some(engine);
    m
}

fn render(md: &ModelDeployment, version: &str) -> (Value, Vec<String>) {
    let rendered = Dynamo::default().render(md, api(version)).unwrap();
    assert_eq!(rendered.objects.len(), 1);
    let object = serde_json::to_value(&rendered.objects[0]).unwrap();
    // Every rendered field exists in the real upstream schema.
    assert_eq!(
        api(version).missing_paths(&object),
        Vec::<String>::new(),
        "{version}"
    );
    // Deterministic.
    let again = Dynamo::default().render(md, api(version)).unwrap();
    assert_eq!(rendered, again);
    (
        object,
        rendered.warnings.into_iter().map(|w| w.message).collect(),
    )
}

fn snapshot(name: &str, md: &ModelDeployment) {
    for version in ["v1alpha1", "v1beta1"] {
        let (object, warnings) = render(md, version);
        insta::assert_yaml_snapshot!(
            format!("{name}_{version}"),
            json!({"object": object, "warnings": warnings})
        );
    }
    let (deprecated, _) = render(md, "v1alpha1-deprecated");
    assert!(
        !deprecated.to_string().contains("dynamoNamespace"),
        "the deprecated dynamoNamespace is never written"
    );
}

/// Reviewed against `examples/backends/vllm/deploy/agg.yaml` at ai-dynamo/dynamo
/// `3e3b3b187` (v1alpha1) and `2a6da14c8` (v1beta1): frontend with its image only, worker
/// `python3 -m dynamo.vllm --model ...`, GPU limit; ours adds `--tensor-parallel-size`.
#[test]
fn example1_aggregated_vllm() {
    snapshot("example1", &example1());
}

/// Reviewed against `examples/backends/vllm/deploy/disagg.yaml` (v1alpha1 `3e3b3b187`,
/// v1beta1 `2a6da14c8`): `--disaggregation-mode prefill|decode` and
/// `--kv-transfer-config` NixlConnector on both roles (as at `2a6da14c8`; `3e3b3b187`
/// passed it to prefill only), `subComponentType` / `type: prefill|decode`.
#[test]
fn example3_disaggregated_with_kv_routing() {
    snapshot("example3", &example3());
}

/// Aggregated, every option: reviewed against `examples/backends/{vllm,sglang,trtllm}/
/// deploy/agg.yaml` at `3e3b3b187` and `2a6da14c8` (SGLang `--model-path`,
/// `--served-model-name`, `--tp`, `--trust-remote-code`; TensorRT-LLM engine settings
/// given inline instead of an `--extra-engine-args` file, and `--model` where the example
/// still spells the model with its obsolete alias `--model-path`).
#[test]
fn each_engine_with_every_option() {
    snapshot("vllm", &full(EngineType::Vllm));
    snapshot("sglang", &full(EngineType::Sglang));
    snapshot("trtllm", &full(EngineType::Trtllm));
}

/// Reviewed against `examples/backends/sglang/deploy/disagg.yaml` (`--disaggregation-mode`,
/// `--disaggregation-transfer-backend nixl`, `--host 0.0.0.0`; the bootstrap port left to
/// Dynamo) and `examples/backends/trtllm/deploy/disagg.yaml` with
/// `engine_configs/qwen3/{prefill,decode}.yaml` (`cache_transceiver_config.backend:
/// DEFAULT`, prefill `disable_overlap_scheduler: true`), at `3e3b3b187` and `2a6da14c8`.
#[test]
fn each_engine_disaggregated() {
    for engine in [EngineType::Sglang, EngineType::Trtllm] {
        let mut m = example3();
        m.spec.engine.type_ = Some(engine);
        m.spec.provider = None;
        snapshot(&format!("{engine}_disaggregated"), &m);
    }
}

/// Overrides only change the frontend's `DYN_ROUTER_MODE` (`components/src/dynamo/
/// common/configuration/groups/router_args.py:64-80@3e3b3b187`), replicas and resources.
#[test]
fn each_override() {
    let base = || ModelDeploymentBuilder::new("ov").namespace("ns");
    snapshot(
        "override_router_mode",
        &base()
            .overrides(json!({"routerMode": "least-loaded"}))
            .build(),
    );
    snapshot(
        "override_frontend",
        &base()
            .overrides(
                json!({"frontend": {"replicas": 3, "resources": {"cpu": "500m", "memory": "1Gi"}}}),
            )
            .build(),
    );
}

/// Keys other than the typed ones are merged into the DynamoGraphDeployment, checked
/// against the installed CRD: v1alpha1's `spec.services` is a map by component name, so
/// `spec.services.VllmWorker.replicas` reaches the worker; v1beta1 has no `services` but
/// a list `spec.components` (`nvidia.com_dynamographdeployments.yaml`, `2a6da14c8`), which
/// a merge patch can only replace whole: both mistakes are refused naming the path.
#[test]
fn other_overrides_merge_into_the_graph_checked_against_its_schema() {
    let with = |patch: Value| {
        ModelDeploymentBuilder::new("ov")
            .namespace("ns")
            .overrides(json!({"routerMode": "kv", "spec": patch}))
            .build()
    };
    let finalize = |md: &ModelDeployment, version: &str| {
        let rendered = Dynamo::default().render(md, api(version)).unwrap();
        kubeairunway_sdk::render::finalize(&Dynamo::default(), md, api(version), rendered.objects)
    };
    let services = with(json!({"services": {"VllmWorker": {"replicas": 3}}}));
    let merged = finalize(&services, "v1alpha1").unwrap();
    let rendered = &merged[0].data["spec"]["services"];
    assert_eq!(rendered["VllmWorker"]["replicas"], 3);
    assert_eq!(rendered["Frontend"]["replicas"], 1, "untouched");
    for (md, named) in [
        (
            &services,
            "provider.overrides.spec.services (no such field)",
        ),
        (
            &with(json!({"components": {"VllmWorker": {"replicas": 3}}})),
            "provider.overrides.spec.components (must be array, not object)",
        ),
    ] {
        let err = finalize(md, "v1beta1").unwrap_err();
        assert_eq!(err.reason(), "InvalidOverride");
        assert!(err.to_string().contains(named), "{err}");
    }
}

/// The engine fields AI Runway users bring: `engine.image` as the image of every
/// component, prefix caching and eager execution as the engines' own flags (the vLLM and
/// SGLang workers add the engines' parsers: `components/src/dynamo/vllm/args.py:93` and
/// `components/src/dynamo/sglang/args.py:186@3e3b3b187`; the flags themselves are cited
/// by the SDK's `prefix_caching_and_eager_are_spelled_as_each_engine_parses_them`), and
/// `extraArgs` last on each worker. Dynamo's TensorRT-LLM worker has no flag for prefix
/// caching or eager execution (`components/src/dynamo/trtllm/backend_args.py@3e3b3b187`:
/// its `--enable-cuda-graph` is for diffusion), so both are named as ignored there.
fn engine_fields(engine: EngineType) -> ModelDeployment {
    let extra = match engine {
        EngineType::Sglang => r#"["--max-running-requests", "64", "--enable-metrics"]"#,
        EngineType::Trtllm => r#"["--max-batch-size", "64"]"#,
        _ => r#"["--max-num-seqs", "64", "--enable-auto-tool-choice"]"#,
    };
    let mut m = md(&format!(
        r"
apiVersion: kubeairunway.ai/v1alpha1
kind: ModelDeployment
metadata: {{name: fields, namespace: default}}
spec:
  model: {{id: Qwen/Qwen3-0.6B}}
  engine:
    image: registry.example/dynamo-runtime:1.1.0
    enablePrefixCaching: false
    enforceEager: true
    extraArgs: {extra}
  resources: {{gpu: {{count: 1}}}}
"
    ));
    m.spec.engine.type_ = Some(engine);
    m
}

#[test]
fn engine_fields_snapshots() {
    snapshot("engine_fields_vllm", &engine_fields(EngineType::Vllm));
    snapshot("engine_fields_sglang", &engine_fields(EngineType::Sglang));
    snapshot("engine_fields_trtllm", &engine_fields(EngineType::Trtllm));
}

#[test]
fn engine_fields_reach_the_workers_or_are_named() {
    let worker_args = |m: &ModelDeployment| {
        let (object, warnings) = render(m, "v1beta1");
        let args = object["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            object
                .to_string()
                .contains("registry.example/dynamo-runtime:1.1.0"),
            "engine.image is the image"
        );
        (args, warnings)
    };
    let (vllm, warnings) = worker_args(&engine_fields(EngineType::Vllm));
    assert!(
        vllm.contains("--no-enable-prefix-caching --enforce-eager")
            && vllm.ends_with("--max-num-seqs 64 --enable-auto-tool-choice"),
        "{vllm}"
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    let (sglang, warnings) = worker_args(&engine_fields(EngineType::Sglang));
    assert!(
        sglang.contains("--disable-radix-cache --disable-cuda-graph")
            && sglang.ends_with("--max-running-requests 64 --enable-metrics"),
        "{sglang}"
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    let (trtllm, _) = worker_args(&engine_fields(EngineType::Trtllm));
    assert!(trtllm.ends_with("--max-batch-size 64"), "{trtllm}");
    assert!(
        !trtllm.contains("prefix") && !trtllm.contains("eager"),
        "{trtllm}"
    );
    let rendered = Dynamo::default()
        .render(&engine_fields(EngineType::Trtllm), api("v1beta1"))
        .unwrap();
    assert_eq!(
        Warning::ignored_fields(&rendered.warnings),
        [
            "spec.engine.enablePrefixCaching",
            "spec.engine.enforceEager"
        ]
    );
}

/// `extraArgs` count as the user's flags: pipeline parallelism there leaves room in
/// tensor parallelism, an `--override-engine-args` there replaces the TensorRT-LLM
/// worker's own (it comes last), and a flag set both there and in `engine.args` is refused.
#[test]
fn extra_args_are_the_user_s_flags() {
    let mut m = engine_fields(EngineType::Vllm);
    m.spec.resources = serde_json::from_value(json!({"gpu": {"count": 4}})).unwrap();
    m.spec.engine.extra_args = Some(vec!["--pipeline-parallel-size=2".into()]);
    let (object, _) = render(&m, "v1beta1");
    let text = object.to_string();
    assert!(text.contains(r#""--tensor-parallel-size","2""#), "{text}");

    let mut trt = example3();
    trt.spec.engine.type_ = Some(EngineType::Trtllm);
    trt.spec.engine.extra_args = Some(vec![
        "--override-engine-args".into(),
        r#"{"cache_transceiver_config": {"backend": "NIXL"}}"#.into(),
    ]);
    let (object, _) = render(&trt, "v1beta1");
    let prefill = object["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        prefill
            .iter()
            .filter(|a| a.as_str() == Some("--override-engine-args"))
            .count(),
        1,
        "{prefill:?}"
    );

    let mut both = engine_fields(EngineType::Vllm);
    both.spec.engine.args = Some([("max-num-seqs".to_string(), "8".to_string())].into());
    let err = Dynamo::default().render(&both, api("v1beta1")).unwrap_err();
    assert!(
        err.0.starts_with("the flag --max-num-seqs is set both"),
        "{err}"
    );
}

#[test]
fn custom_image_overrides_the_runtime_image() {
    let m = ModelDeploymentBuilder::new("img")
        .image("registry.example/dynamo:dev")
        .build();
    for version in ["v1alpha1", "v1beta1"] {
        let (object, _) = render(&m, version);
        let text = object.to_string();
        assert!(text.contains("registry.example/dynamo:dev"));
        assert!(!text.contains("nvcr.io"));
    }
    let settings = Settings {
        dynamo_version: "9.9.9".into(),
        ..Settings::default()
    };
    let rendered = Dynamo::new(settings)
        .render(
            &ModelDeploymentBuilder::new("v")
                .engine(EngineType::Sglang)
                .build(),
            api("v1beta1"),
        )
        .unwrap();
    assert!(
        serde_json::to_string(&rendered.objects[0])
            .unwrap()
            .contains("nvcr.io/nvidia/ai-dynamo/sglang-runtime:9.9.9")
    );
}

/// A model cache (frontend and workers, `HF_HOME`) and a compilation cache (workers), as
/// `examples/deployments/EKS/manifests/vllm/disagg.yaml@2a6da14c8` (v1beta1) and
/// `recipes/llama-3-70b/vllm/agg/deploy.yaml@3e3b3b187` (v1alpha1, with `spec.pvcs`)
/// mount them; a claim Dynamo creates (v1alpha1 only, with a storage class).
#[test]
fn storage_snapshots() {
    let m = ModelDeploymentBuilder::new("st")
        .spec(|s| {
            s.model.storage = serde_json::from_value(json!({"volumes": [
                {"name": "weights", "claimName": "model-cache", "purpose": "modelCache", "readOnly": true},
                {"name": "cc", "claimName": "compilation-cache", "purpose": "compilationCache", "mountPath": "/home/dynamo/.cache/vllm"},
                {"name": "scratch", "size": "100Gi", "storageClassName": "fast", "purpose": "custom", "mountPath": "/scratch"},
            ]}))
            .unwrap();
        })
        .build();
    snapshot("storage", &m);
}

#[test]
fn storage_volumes_dynamo_cannot_create_are_named() {
    let m = ModelDeploymentBuilder::new("s")
        .spec(|s| {
            s.model.storage = serde_json::from_value(json!({"volumes": [
                {"name": "weights", "size": "100Gi", "purpose": "modelCache"},
            ]}))
            .unwrap();
        })
        .build();
    for version in ["v1alpha1", "v1beta1"] {
        let (object, warnings) = render(&m, version);
        assert!(
            !object.to_string().contains("s-weights"),
            "{version}: not mounted"
        );
        assert_eq!(warnings.len(), 1, "{version}: {warnings:?}");
        assert!(
            warnings[0].starts_with("spec.model.storage.volumes[weights].size is ignored: "),
            "{}",
            warnings[0]
        );
    }
    let rendered = Dynamo::default().render(&m, api("v1beta1")).unwrap();
    assert_eq!(
        rendered.warnings[0].ignored_field.as_deref(),
        Some("spec.model.storage.volumes[weights].size")
    );
}

#[test]
fn a_custom_volume_without_a_path_fails_with_the_field() {
    let m = ModelDeploymentBuilder::new("s")
        .spec(|s| {
            s.model.storage =
                serde_json::from_value(json!({"volumes": [{"name": "x", "claimName": "c"}]}))
                    .unwrap();
        })
        .build();
    let err = Dynamo::default().render(&m, api("v1beta1")).unwrap_err();
    assert_eq!(
        err.0,
        "spec.model.storage.volumes[x].mountPath is required when purpose is custom"
    );
}

/// `spec.gateway` renders Dynamo's own gateway shape: no standalone frontend, an endpoint
/// picker the operator accepts, and a frontend sidecar on every worker; the serving pods
/// are then the workers on the sidecar's port, in the pool the operator makes
/// (`examples/backends/vllm/deploy/gaie/agg.yaml@2a6da14c8`).
#[test]
fn gateway_renders_the_endpoint_picker_and_worker_sidecars() {
    for mode in ["aggregated", "disaggregated"] {
        let mut m = full(EngineType::Vllm);
        m.metadata.name = Some("g".into());
        m.spec.gateway = serde_json::from_value(json!({"enabled": true})).unwrap();
        m.spec.engine.args = Some([("block-size".to_string(), "128".to_string())].into());
        if mode == "disaggregated" {
            m.spec.serving.mode = ServingMode::Disaggregated;
            m.spec.scaling = serde_json::from_value(json!({
                "prefill": {"replicas": 1, "gpu": {"count": 1}},
                "decode": {"replicas": 2, "gpu": {"count": 1}}}))
            .unwrap();
            m.spec.resources = None;
        }
        snapshot(&format!("gateway_{mode}"), &m);
        for version in ["v1alpha1", "v1beta1"] {
            let (dgd, warnings) = render(&m, version);
            assert_eq!(warnings, Vec::<String>::new(), "{version}");
            let components: Vec<(String, Value)> = if version == "v1beta1" {
                dgd["spec"]["components"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| (c["name"].as_str().unwrap().to_string(), c.clone()))
                    .collect()
            } else {
                dgd["spec"]["services"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            };
            let names: Vec<&str> = components.iter().map(|(n, _)| n.as_str()).collect();
            assert!(!names.contains(&"Frontend"), "{version}: {names:?}");
            let epp = &components.iter().find(|(n, _)| n == "Epp").unwrap().1;
            let type_key = if version == "v1beta1" {
                "type"
            } else {
                "componentType"
            };
            assert_eq!(epp[type_key], "epp");
            assert_eq!(epp["replicas"], 1);
            let profiles = epp["eppConfig"]["config"]["schedulingProfiles"]
                .as_array()
                .unwrap();
            assert_eq!(profiles.len(), if mode == "aggregated" { 1 } else { 2 });
            let epp_text = epp.to_string();
            assert!(
                epp_text.contains(r#"{"name":"DYN_KV_CACHE_BLOCK_SIZE","value":"128"}"#),
                "{epp_text}"
            );
            assert!(
                epp_text.contains(r#"{"name":"DYN_MODEL_NAME","value":"qwen"}"#),
                "{epp_text}"
            );
            assert!(epp_text.contains("dynamo-frontend:"), "{epp_text}");
            let workers: Vec<&Value> = components
                .iter()
                .filter(|(n, _)| n.contains("Worker"))
                .map(|(_, c)| c)
                .collect();
            assert_eq!(workers.len(), if mode == "aggregated" { 1 } else { 2 });
            for w in workers {
                let args = if version == "v1beta1" {
                    assert_eq!(w["frontendSidecar"], "sidecar-frontend");
                    let c = w["podTemplate"]["spec"]["containers"].as_array().unwrap();
                    c.iter().find(|c| c["name"] == "sidecar-frontend").unwrap()["args"].clone()
                } else {
                    w["frontendSidecar"]["args"].clone()
                };
                let direct = json!(["-m", "dynamo.frontend", "--router-mode", "direct"]);
                let default = json!(["-m", "dynamo.frontend"]);
                assert_eq!(
                    args,
                    if mode == "aggregated" {
                        direct
                    } else {
                        default
                    }
                );
            }
        }
        let pods = Dynamo::default().serving_pods(&m);
        assert_eq!(
            (pods.port, pods.inference_pool.as_deref()),
            (Some(8000), Some("g-pool"))
        );
    }
    // The frontend overrides have nothing to act on: named.
    let mut m = full(EngineType::Vllm);
    m.spec.gateway = serde_json::from_value(json!({"enabled": true})).unwrap();
    m.spec.provider = serde_json::from_value(json!({"overrides": {"routerMode": "kv"}})).unwrap();
    let rendered = Dynamo::default().render(&m, api("v1beta1")).unwrap();
    assert_eq!(
        Warning::ignored_fields(&rendered.warnings),
        ["provider.overrides.routerMode/frontend"]
    );
}

/// The serving pods are the graph's workers, by the operator's own labels; without the
/// gateway they serve no HTTP port of their own.
#[test]
fn serving_pods_are_the_workers_by_the_operators_labels() {
    let m = ModelDeploymentBuilder::new("g").build();
    let pods = Dynamo::default().serving_pods(&m);
    assert_eq!(
        pods.selector(),
        "nvidia.com/dynamo-component-type=worker,nvidia.com/dynamo-graph-deployment-name=g"
    );
    assert_eq!((pods.port, pods.inference_pool), (None, None));
}

/// The frontend is rendered with its image only, as every upstream
/// example does (`examples/backends/vllm/deploy/agg.yaml` at `3e3b3b187` and `2a6da14c8`),
/// so the operator's `python3` + `-m dynamo.frontend` stays whole.
#[test]
fn the_frontend_keeps_the_operators_command() {
    for version in ["v1alpha1", "v1beta1"] {
        let (object, _) = render(&example3(), version);
        let main = if version == "v1beta1" {
            object["spec"]["components"][0]["podTemplate"]["spec"]["containers"][0].clone()
        } else {
            object["spec"]["services"]["Frontend"]["extraPodSpec"]["mainContainer"].clone()
        };
        assert!(main.get("command").is_none(), "{version}: {main}");
        assert!(main.get("args").is_none(), "{version}: {main}");
    }
}

/// Node selector and tolerations place the GPU workers, not the
/// frontend.
#[test]
fn placement_is_for_the_workers() {
    let m = full(EngineType::Vllm);
    let (object, _) = render(&m, "v1beta1");
    let components = object["spec"]["components"].as_array().unwrap();
    for c in components {
        let pod = &c["podTemplate"]["spec"];
        let worker = c["type"] != "frontend";
        assert_eq!(pod.get("nodeSelector").is_some(), worker, "{c}");
        assert_eq!(pod.get("tolerations").is_some(), worker, "{c}");
    }
    let (object, _) = render(&m, "v1alpha1");
    let services = object["spec"]["services"].as_object().unwrap();
    for (name, s) in services {
        let worker = name != "Frontend";
        assert_eq!(
            s["extraPodSpec"].get("nodeSelector").is_some(),
            worker,
            "{name}"
        );
    }
}

/// A custom image without a semantic-version tag carries
/// `runtimeVersionOverride` on v1beta1 (the provider's version, or the override).
#[test]
fn custom_images_carry_a_runtime_version_on_v1beta1() {
    let versions = |m: &ModelDeployment, settings: Settings| {
        let rendered = Dynamo::new(settings).render(m, api("v1beta1")).unwrap();
        let object = serde_json::to_value(&rendered.objects[0]).unwrap();
        object["spec"]["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["runtimeVersionOverride"].clone())
            .collect::<Vec<_>>()
    };
    let custom = ModelDeploymentBuilder::new("img")
        .image("registry.example/dynamo:dev")
        .build();
    assert_eq!(
        versions(&custom, Settings::default()),
        [json!("1.1.0"), json!("1.1.0")]
    );
    let with_override = ModelDeploymentBuilder::new("img")
        .image("registry.example/dynamo:dev")
        .overrides(json!({"runtimeVersion": "1.4.2"}))
        .build();
    assert_eq!(
        versions(&with_override, Settings::default()),
        [json!("1.4.2"), json!("1.4.2")]
    );
    let tagged = ModelDeploymentBuilder::new("img")
        .image("registry.example/dynamo:1.3.0")
        .build();
    assert_eq!(
        versions(&tagged, Settings::default()),
        [Value::Null, Value::Null]
    );
    let rc = Settings {
        dynamo_version: "v1.5.0-rc1".into(),
        ..Settings::default()
    };
    assert_eq!(versions(&custom, rc), [json!("1.5.0"), json!("1.5.0")]);
    // v1alpha1 (Dynamo <= 1.1) has neither the field nor the rule.
    let (old, _) = render(&custom, "v1alpha1");
    assert!(!old.to_string().contains("runtimeVersionOverride"));
}

/// A worker's GPUs become its tensor parallelism.
#[test]
fn gpus_become_tensor_parallelism() {
    for (engine, flag) in [
        (EngineType::Vllm, "--tensor-parallel-size"),
        (EngineType::Sglang, "--tp"),
        (EngineType::Trtllm, "--tensor-parallel-size"),
    ] {
        let m = ModelDeploymentBuilder::new("tp")
            .engine(engine)
            .gpus(4)
            .build();
        let (object, _) = render(&m, "v1beta1");
        let args = &object["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["args"];
        let args: Vec<&str> = args
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.windows(2).any(|w| w == [flag, "4"]),
            "{engine}: {args:?}"
        );
    }
}

/// The CRD accepts `resources.gpu.type: ""`; the workers then get the default GPU
/// resource (an empty resource name used to make v1beta1 pods invalid, and v1alpha1 got
/// `gpuType: ""`).
#[test]
fn an_empty_gpu_type_is_the_default_gpu() {
    let mut m = ModelDeploymentBuilder::new("g").gpus(2).build();
    m.spec
        .resources
        .as_mut()
        .unwrap()
        .gpu
        .as_mut()
        .unwrap()
        .type_ = String::new();
    let (beta, _) = render(&m, "v1beta1");
    let main = &beta["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0];
    assert_eq!(main["resources"]["limits"]["nvidia.com/gpu"], "2", "{main}");
    assert!(main["resources"]["limits"].get("").is_none(), "{main}");
    let (alpha, _) = render(&m, "v1alpha1");
    let limits = &alpha["spec"]["services"]["VllmWorker"]["resources"]["limits"];
    assert_eq!(limits["gpu"], "2", "{limits}");
    assert!(limits.get("gpuType").is_none(), "{limits}");
}

/// The vLLM and SGLang workers take the engines' own flags: the SDK's table. The
/// TensorRT-LLM worker has a parser of its own, not `trtllm-serve`'s.
#[test]
fn vllm_and_sglang_workers_use_the_sdks_flags() {
    use kubeairunway_sdk::engine::Flags;
    for engine in [EngineType::Vllm, EngineType::Sglang] {
        assert_eq!(
            crate::args::backend(engine).unwrap().flags,
            Flags::of(engine),
            "{engine}"
        );
    }
    let trtllm = crate::args::backend(EngineType::Trtllm).unwrap().flags;
    assert_ne!(trtllm, Flags::of(EngineType::Trtllm));
    assert_eq!(trtllm.served_name, Some("--served-model-name"));
}

#[test]
fn bad_overrides_fail_rendering() {
    let m = ModelDeploymentBuilder::new("bad")
        .overrides(json!({"routerMode": "none"}))
        .build();
    let err = Dynamo::default().render(&m, api("v1beta1")).unwrap_err();
    assert!(err.0.contains("routerMode"), "{}", err.0);
    let m = ModelDeploymentBuilder::new("bad")
        .overrides(json!({"routerMode": 3}))
        .build();
    let err = Dynamo::default().render(&m, api("v1beta1")).unwrap_err();
    assert!(
        err.0
            .starts_with("invalid override provider.overrides.routerMode:"),
        "{}",
        err.0
    );
}

#[test]
fn the_adapter_follows_the_installed_crd() {
    assert_eq!(api("v1alpha1").version, "v1alpha1");
    assert_eq!(api("v1beta1").version, "v1beta1");
    let (old, _) = render(&example1(), "v1alpha1");
    let (new, _) = render(&example1(), "v1beta1");
    assert_eq!(old["apiVersion"], "nvidia.com/v1alpha1");
    assert!(old["spec"]["services"].is_object());
    assert_eq!(new["apiVersion"], "nvidia.com/v1beta1");
    assert!(new["spec"]["components"].is_array());
}

/// What Dynamo cannot serve is refused by the runtime from its registered capabilities
/// (no llama.cpp, no CPU-only), with the field, its value and what Dynamo serves.
#[test]
fn what_the_capabilities_exclude_is_refused_by_the_runtime() {
    let p = Dynamo::default();
    let refused = |md: &ModelDeployment| fit::check(&p, md).unwrap_err().0;
    let llama = ModelDeploymentBuilder::new("l")
        .engine(EngineType::Llamacpp)
        .build();
    assert_eq!(
        refused(&llama),
        "spec.engine.type is llamacpp, which provider dynamo does not support: it serves the engines vllm, sglang, trtllm"
    );
    let cpu = ModelDeploymentBuilder::new("c").gpus(0).build();
    assert_eq!(
        refused(&cpu),
        "spec.resources.gpu.count is 0 (CPU only), but provider dynamo requires GPU for vllm (set resources.gpu.count > 0)"
    );
    let mut no_resources = ModelDeploymentBuilder::new("n").build();
    no_resources.spec.resources = None;
    assert!(refused(&no_resources).starts_with("spec.resources.gpu is not set (CPU only)"));
    assert_eq!(fit::check(&p, &example1()), Ok(()));
    assert_eq!(fit::check(&p, &example3()), Ok(()));
}

#[test]
fn registration() {
    assert_eq!(
        Dynamo::default().immutable_fields("DynamoGraphDeployment"),
        ["spec.backendFramework"]
    );
    assert!(Dynamo::default().immutable_fields("ConfigMap").is_empty());
    let config = Dynamo::default().config();
    let caps = config.capabilities.unwrap();
    assert_eq!(
        caps.engine_names(),
        [EngineType::Vllm, EngineType::Sglang, EngineType::Trtllm]
    );
    for engine in caps.engine_names() {
        let served = caps.engine(engine).unwrap();
        assert_eq!(
            served.serving_modes,
            [ServingMode::Aggregated, ServingMode::Disaggregated],
            "{engine}"
        );
        assert!(served.gpu_support && !served.cpu_support, "{engine}");
        assert_eq!(
            served.api_formats,
            kubeairunway_sdk::api::ApiFormat::native(engine)
        );
    }
    let rules: Vec<_> = config
        .selection_rules
        .iter()
        .map(|r| (r.condition.as_str(), r.priority))
        .collect();
    assert_eq!(
        rules,
        [
            ("spec.engine.type == 'trtllm'", 100),
            ("spec.engine.type == 'sglang'", 100),
            ("spec.serving.mode == 'disaggregated'", 90),
            (
                "spec.engine.type == 'vllm' && has(spec.resources) && has(spec.resources.gpu) && spec.resources.gpu.count > 0",
                50
            ),
        ]
    );
}

// ---- status mapping ----

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn observe(status: Value, failed_since: Option<Timestamp>, now: &str) -> Observed {
    let upstream = status::Upstream::read(Some(&status));
    status::observe(
        &example3(),
        &upstream,
        failed_since,
        Duration::from_secs(300),
        at(now),
    )
}

fn ready(status: &str, reason: &str, message: &str, since: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": message, "lastTransitionTime": since})
}

#[test]
fn no_status_yet_is_deploying_with_the_endpoint() {
    let o = status::observe(
        &example1(),
        &status::Upstream::read(None),
        None,
        Duration::from_secs(300),
        at("2026-01-01T00:00:00Z"),
    );
    assert_eq!(o.phase, Phase::Deploying);
    assert!(!o.ready);
    let endpoint = o.endpoint.unwrap();
    assert_eq!(
        (endpoint.service.as_deref(), endpoint.port),
        (Some("llama-8b-frontend"), Some(8000))
    );
    assert_eq!(o.replicas, None);
}

#[test]
fn initializing_and_pending_are_deploying_with_the_ready_message() {
    let o = observe(
        json!({"state": "initializing"}),
        None,
        "2026-01-01T00:00:00Z",
    );
    assert_eq!(
        (o.phase, o.message.as_str()),
        (Phase::Deploying, "DynamoGraphDeployment is initializing")
    );
    let o = observe(
        json!({"state": "pending", "conditions": [ready("False", "ComponentsNotReady", "VllmDecodeWorker: 1/4 ready", "2026-01-01T00:00:00Z")]}),
        None,
        "2026-01-01T00:00:00Z",
    );
    assert_eq!(
        (o.phase, o.message.as_str()),
        (Phase::Deploying, "VllmDecodeWorker: 1/4 ready")
    );
    assert!(!o.ready);
}

#[test]
fn successful_is_running_with_worker_replicas() {
    // v1alpha1 reports per service in status.services.
    let o = observe(
        json!({"state": "successful",
               "conditions": [ready("True", "AllComponentsReady", "All resources are ready", "2026-01-01T00:00:00Z")],
               "services": {
                   "Frontend": {"replicas": 2, "readyReplicas": 2},
                   "VllmPrefillWorker": {"replicas": 2, "readyReplicas": 2},
                   "VllmDecodeWorker": {"replicas": 4, "readyReplicas": 3}}}),
        None,
        "2026-01-01T00:00:00Z",
    );
    assert_eq!(
        (o.phase, o.ready, o.message.as_str()),
        (Phase::Running, true, "All resources are ready")
    );
    let r = o.replicas.unwrap();
    assert_eq!((r.desired, r.ready), (Some(6), Some(5)));
    assert_eq!(
        o.endpoint.unwrap().service.as_deref(),
        Some("llama-70b-pd-frontend")
    );
    // v1beta1 reports per component in status.components.
    let o = observe(
        json!({"state": "successful", "components": {"VllmWorker": {"replicas": 3, "readyReplicas": 3}}}),
        None,
        "2026-01-01T00:00:00Z",
    );
    let r = o.replicas.unwrap();
    assert_eq!((r.desired, r.ready), (Some(3), Some(3)));
}

#[test]
fn failed_counts_only_once_it_persists() {
    let failed = json!({"state": "failed", "conditions": [ready("False", "ReconcileError", "image pull failed", "2026-01-01T00:00:00Z")]});
    let o = observe(failed.clone(), None, "2026-01-01T00:01:00Z");
    assert_eq!(o.phase, Phase::Deploying);
    assert_eq!(
        o.message,
        "Dynamo reports a failure, which may be transient (for 60s so far): image pull failed"
    );
    let o = observe(failed, None, "2026-01-01T00:05:00Z");
    assert_eq!(
        (o.phase, o.reason.as_str(), o.message.as_str()),
        (Phase::Failed, "ReconcileError", "image pull failed")
    );
    // Ready was False long before (pending), but failed was first seen just now.
    let failed = json!({"state": "failed", "conditions": [ready("False", "ReconcileError", "image pull failed", "2026-01-01T00:00:00Z")]});
    let o = observe(
        failed,
        Some(at("2026-01-01T00:09:00Z")),
        "2026-01-01T00:10:00Z",
    );
    assert_eq!(o.phase, Phase::Deploying);
    // Without a Ready condition, from when the provider first saw it.
    let bare = json!({"state": "failed"});
    let o = observe(
        bare.clone(),
        Some(at("2026-01-01T00:00:00Z")),
        "2026-01-01T00:04:59Z",
    );
    assert_eq!(o.phase, Phase::Deploying);
    let o = observe(
        bare,
        Some(at("2026-01-01T00:00:00Z")),
        "2026-01-01T00:05:00Z",
    );
    assert_eq!(
        (o.phase, o.message.as_str()),
        (Phase::Failed, "DynamoGraphDeployment failed")
    );
}

#[test]
fn unknown_states_are_deploying() {
    let o = observe(json!({"state": "deploying"}), None, "2026-01-01T00:00:00Z");
    assert_eq!(o.phase, Phase::Deploying);
}

#[test]
fn first_sighting_of_failed_is_remembered_and_forgotten() {
    let p = Dynamo::default();
    let live: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
        "metadata": {"name": "x", "uid": "u"}, "status": {"state": "failed"}}))
    .unwrap();
    let first = p.failed_since(&live, true).unwrap();
    assert_eq!(p.failed_since(&live, true), Some(first));
    assert_eq!(p.failed_since(&live, false), None);
    let o = p.observe(
        &example1(),
        &kubeairunway_sdk::Live::new(Some(live.clone())),
    );
    assert_eq!(
        o.phase,
        Phase::Deploying,
        "a fresh failure is not yet Failed"
    );
}

/// A PodCliqueScalingGroup (multinode) component reports
/// `availableReplicas` and no `readyReplicas` (the CRD's descriptions of
/// `status.services.*` / `status.components.*` in tests/fixtures/crds/upstream).
#[test]
fn scaling_groups_count_their_available_replicas() {
    let o = observe(
        json!({"state": "successful", "components": {
            "Frontend": {"componentKind": "Deployment", "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1},
            "VllmPrefillWorker": {"componentKind": "PodCliqueScalingGroup", "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2},
            "VllmDecodeWorker": {"componentKind": "PodClique", "replicas": 4, "updatedReplicas": 4, "readyReplicas": 3}}}),
        None,
        "2026-01-01T00:00:00Z",
    );
    let r = o.replicas.unwrap();
    assert_eq!((r.desired, r.ready), (Some(6), Some(5)));
}

/// The frontend Service of a dotted name: dots become dashes
/// (`NormalizeKubeResourceName`, `deploy/operator/internal/dynamo/graph.go:756@2a6da14c8`).
#[test]
fn the_frontend_service_of_a_dotted_name() {
    assert_eq!(
        status::frontend_service("qwen3-0.6b"),
        "qwen3-0-6b-frontend"
    );
    assert_eq!(status::frontend_service("agg"), "agg-frontend");
}

/// Overrides as users write them (documented keys holding any value, typos at any depth):
/// rendering never panics, a refusal names the override, and an accepted rendering only
/// has fields of the real upstream schema, for both API versions.
#[test]
fn any_overrides_render_or_are_refused_by_name() {
    let paths = [
        ("routerMode", vec![json!("kv"), json!("least-loaded")]),
        ("frontend.replicas", vec![json!(0), json!(3)]),
        ("frontend.resources.cpu", vec![json!("500m")]),
        ("frontend.resources.memory", vec![json!("1Gi")]),
        ("runtimeVersion", vec![json!("1.4.0"), json!("01.2.3")]),
    ];
    for version in ["v1alpha1", "v1beta1"] {
        kubeairunway_sdk::testing::overrides::check_overrides(
            &full(EngineType::Vllm),
            &paths,
            |m| Dynamo::default().render(m, api(version)),
            |_, r| {
                for object in &r.objects {
                    let missing =
                        api(version).missing_paths(&serde_json::to_value(object).unwrap());
                    if !missing.is_empty() {
                        return Err(format!("{version}: fields not in the schema: {missing:?}"));
                    }
                }
                Ok(())
            },
        );
    }
}

/// The environment of each worker of `md`'s graph, by component name.
fn worker_env(md: &ModelDeployment) -> Vec<(String, Vec<EnvVar>)> {
    let overrides = crate::overrides::parse(md).unwrap();
    let (graph, _) = crate::graph::build(md, &overrides, "1.1.0").unwrap();
    graph
        .components
        .into_iter()
        .filter(|c| c.role.is_worker())
        .map(|c| (c.name, c.env))
        .collect()
}

/// Dynamo's vLLM worker refuses `--connector` and `DYN_CONNECTOR` since Dynamo 1.0: it
/// raises "--connector is no longer supported for the vLLM backend"
/// (`_reject_connector_flag`, `components/src/dynamo/vllm/args.py:189-190,439-475@3e3b3b187`,
/// `:227-228@2a6da14c8`; the flag and its variable are Dynamo's runtime arguments,
/// `components/src/dynamo/common/configuration/groups/runtime_args.py:111-118@3e3b3b187`).
/// So the render refuses it, naming the field, rather than start a worker that stops (AI
/// Runway drops it silently, dfa64a4). The TensorRT-LLM worker still takes it
/// (`components/src/dynamo/trtllm/args.py:42-50@3e3b3b187`).
#[test]
fn a_vllm_connector_is_refused_as_dynamo_refuses_it() {
    let with = |engine: EngineType, spec: &dyn Fn(&mut kubeairunway_sdk::ModelDeploymentSpec)| {
        let md = ModelDeploymentBuilder::new("c")
            .engine(engine)
            .gpus(1)
            .spec(spec)
            .build();
        Dynamo::default().render(&md, api("v1beta1"))
    };
    let args = |s: &mut kubeairunway_sdk::ModelDeploymentSpec| {
        s.engine.args = Some([("connector".to_string(), "nixl".to_string())].into());
    };
    let extra = |s: &mut kubeairunway_sdk::ModelDeploymentSpec| {
        s.engine.extra_args = Some(vec!["--connector".into(), "none".into()]);
    };
    let env = |s: &mut kubeairunway_sdk::ModelDeploymentSpec| {
        s.env = Some(vec![crate::graph::env("DYN_CONNECTOR", "nixl")]);
    };
    for (spec, field) in [
        (
            &args as &dyn Fn(&mut _),
            "spec.engine.args.connector (--connector)",
        ),
        (&extra, "spec.engine.args.connector (--connector)"),
        (&env, "spec.env DYN_CONNECTOR"),
    ] {
        let err = with(EngineType::Vllm, spec).unwrap_err();
        assert!(
            err.0
                .starts_with(&format!("{field} is refused: Dynamo's vLLM worker")),
            "{err}"
        );
        assert!(err.0.contains("engine.args.kv-transfer-config"), "{err}");
    }
    let rendered = with(EngineType::Trtllm, &args).unwrap();
    let object = serde_json::to_string(&rendered.objects[0]).unwrap();
    assert!(object.contains("--connector"), "TensorRT-LLM takes it");
}

/// vLLM's NIXL connector advertises `VLLM_NIXL_SIDE_CHANNEL_HOST` to the other role's
/// workers; vLLM's default is `localhost` (`VLLM_NIXL_SIDE_CHANNEL_HOST: str =
/// "localhost"`, `vllm/envs.py@001f69f8`: read there, Dynamo 1.1's v0.19.1 was not
/// reachable), and Dynamo fills it
/// only from the worker's resolved hostname when unset (`ensure_side_channel_host`,
/// `components/src/dynamo/vllm/args.py:237-238,604-614@3e3b3b187`). AI Runway sets it
/// from the pod IP (3759d4f), and so do we, on every worker whose vLLM uses NIXL: both
/// disaggregated roles (ours is NixlConnector), and an aggregated one only when the user's
/// own `kv-transfer-config` names NixlConnector; never on SGLang, whose NIXL backend has
/// no such variable; a value the user sets wins.
#[test]
fn nixl_workers_advertise_their_pod_ip() {
    let pod_ip = crate::graph::env_from_field("VLLM_NIXL_SIDE_CHANNEL_HOST", "status.podIP");
    let nixl = |env: &Vec<EnvVar>| {
        env.iter()
            .filter(|e| e.name == "VLLM_NIXL_SIDE_CHANNEL_HOST")
            .cloned()
            .collect::<Vec<_>>()
    };
    for (name, env) in worker_env(&example3()) {
        assert_eq!(nixl(&env), std::slice::from_ref(&pod_ip), "{name}");
    }
    assert_eq!(
        serde_json::to_value(&pod_ip).unwrap(),
        json!({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    );
    for (name, env) in worker_env(&example1()) {
        assert!(nixl(&env).is_empty(), "{name}: aggregated, no connector");
    }
    let mut own = example1();
    own.spec.engine.args = Some(
        [(
            "kv-transfer-config".to_string(),
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#.to_string(),
        )]
        .into(),
    );
    for (_, env) in worker_env(&own) {
        assert_eq!(nixl(&env), std::slice::from_ref(&pod_ip));
    }
    let mut sglang = example3();
    sglang.spec.engine.type_ = Some(EngineType::Sglang);
    for (name, env) in worker_env(&sglang) {
        assert!(nixl(&env).is_empty(), "{name}");
    }
    let mut theirs = example3();
    theirs.spec.env = Some(vec![crate::graph::env(
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "10.0.0.1",
    )]);
    for (_, env) in worker_env(&theirs) {
        assert_eq!(
            nixl(&env),
            [crate::graph::env("VLLM_NIXL_SIDE_CHANNEL_HOST", "10.0.0.1")]
        );
    }
}

/// Each engine declares that the operator makes the pool, named as the provider then
/// reports it for a ModelDeployment, and Dynamo's own picker image.
#[test]
fn gateway_capabilities_name_the_pool_the_provider_reports() {
    let provider = Dynamo::default();
    let caps = provider.config().capabilities.unwrap();
    let mut m = ModelDeploymentBuilder::new("llama").build();
    m.metadata.namespace = Some("team".into());
    m.spec.gateway = serde_json::from_value(json!({"enabled": true})).unwrap();
    let reported = provider.serving_pods(&m).inference_pool.unwrap();
    for engine in [EngineType::Vllm, EngineType::Sglang, EngineType::Trtllm] {
        let gateway = caps.engines.iter().find(|e| e.name == engine).unwrap();
        let gateway = gateway.gateway.clone().unwrap();
        assert!(gateway.manages_inference_pool);
        let pattern = gateway.inference_pool_name_pattern.unwrap();
        assert_eq!(pattern.replace("{name}", "llama"), reported);
        assert_eq!(
            gateway.inference_pool_namespace.as_deref(),
            Some("{namespace}")
        );
        let image = gateway.endpoint_picker.unwrap().image.unwrap();
        assert!(
            image.starts_with("nvcr.io/nvidia/ai-dynamo/dynamo-frontend:"),
            "{image}"
        );
    }
}
