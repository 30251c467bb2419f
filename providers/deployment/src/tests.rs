//! The Deployment provider without a cluster: its selection rules scored as core scores
//! them against the operator-backed providers' registrations, what it refuses, what it
//! renders (a snapshot of the full spec), any overrides, and its status. The e2e test
//! (`tests/e2e/tests/e2e/sdk_builtin.rs`) runs it on the real API server.

use kubeairunway_sdk::api::{EngineType, ModelDeployment, Phase, ServingMode};
use kubeairunway_sdk::provider::object;
use kubeairunway_sdk::runtime::fit;
use kubeairunway_sdk::selection::Outcome;
use kubeairunway_sdk::testing::{self, ModelDeploymentBuilder};
use kubeairunway_sdk::{Live, Provider, Rendered, UpstreamApi, Warning};
use serde_json::json;

use crate::{DEFAULT_LLAMACPP_GPU_IMAGE, DEFAULT_LLAMACPP_IMAGE, DeploymentProvider, NAME};

fn md(engine: EngineType, gpus: i32) -> ModelDeploymentBuilder {
    ModelDeploymentBuilder::new("qwen")
        .namespace("ns")
        .model("Qwen/Qwen3-0.6B")
        .engine(engine)
        .gpus(gpus)
}

/// The upstream API with a schema that takes every field (the e2e test checks the
/// rendered fields against the real `apps/v1` schema of the API server).
fn api(provider: &DeploymentProvider) -> UpstreamApi {
    UpstreamApi::new(
        &provider.upstream(),
        "v1",
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
    )
}

fn render(md: &ModelDeployment) -> Rendered {
    let provider = DeploymentProvider::default();
    provider.render(md, &api(&provider)).unwrap()
}

/// Scored as core scores (`selection::select`), the Deployment provider never outranks an
/// operator-backed provider whose rule holds, and serves everything it can when it is
/// the only one registered.
#[test]
fn it_never_outranks_an_operator_and_wins_alone() {
    use kubeairunway_dynamo_provider::Dynamo;
    use kubeairunway_kaito_provider::KaitoProvider;
    use kubeairunway_kuberay_provider::KubeRayProvider;

    let all = [
        (NAME, DeploymentProvider::default().config()),
        ("dynamo", Dynamo::default().config()),
        ("kaito", KaitoProvider::default().config()),
        ("kuberay", KubeRayProvider::default().config()),
    ];
    let winner = |md: &ModelDeployment, among: &[(&str, _)]| match testing::score(md, among).outcome
    {
        Outcome::Selected { provider, .. } => provider,
        other => panic!("nothing selected: {other:?}"),
    };
    // A vLLM spec on a GPU, with KAITO, Dynamo and KubeRay registered: an operator.
    let vllm = md(EngineType::Vllm, 1).build();
    assert_eq!(winner(&vllm, &all), "dynamo");
    // Each case an operator-backed provider serves, it keeps.
    assert_eq!(winner(&md(EngineType::Sglang, 1).build(), &all), "dynamo");
    assert_eq!(winner(&md(EngineType::Llamacpp, 0).build(), &all), "kaito");
    assert_eq!(winner(&md(EngineType::Llamacpp, 1).build(), &all), "kaito");
    assert_eq!(winner(&md(EngineType::Trtllm, 1).build(), &all), "dynamo");
    // Alone, it serves each engine it knows, by its one rule at the lowest priority.
    for (engine, gpus) in [
        (EngineType::Vllm, 1),
        (EngineType::Sglang, 1),
        (EngineType::Trtllm, 1),
        (EngineType::Llamacpp, 0),
    ] {
        let selection = testing::score(&md(engine, gpus).build(), &all[..1]);
        assert!(
            matches!(&selection.outcome, Outcome::Selected { provider, priority: 1, .. } if provider == NAME),
            "{engine}: {:?}",
            selection.outcome
        );
        assert!(selection.rule_errors.is_empty());
    }
    // KubeRay is chosen only by name (no rules), so beside it alone this one serves vLLM.
    assert_eq!(winner(&vllm, &[all[0].clone(), all[3].clone()]), NAME);
    // Disaggregated serving is not its to take: nothing is selected without an operator.
    let disaggregated = md(EngineType::Vllm, 1)
        .mode(ServingMode::Disaggregated)
        .build();
    assert!(!matches!(
        testing::score(&disaggregated, &all[..1]).outcome,
        Outcome::Selected { .. }
    ));
}

#[test]
fn it_refuses_what_a_deployment_cannot_serve() {
    let provider = DeploymentProvider::default();
    // As the runtime asks: capability fit first, then the provider's own check.
    let refused = |md: &ModelDeployment| fit::check(&provider, md).unwrap_err().0;
    let gpu_roles = |spec: &mut kubeairunway_sdk::api::ModelDeploymentSpec| {
        spec.resources = None;
        let role = serde_json::from_value(serde_json::json!({"gpu": {"count": 1}})).unwrap();
        spec.scaling.prefill = Some(role);
        spec.scaling.decode = spec.scaling.prefill.clone();
    };
    assert_eq!(
        refused(
            &md(EngineType::Vllm, 1)
                .mode(ServingMode::Disaggregated)
                .spec(gpu_roles)
                .build()
        ),
        "spec.serving.mode is disaggregated, which provider deployment does not support with \
         vllm: it serves the serving modes aggregated"
    );
    // SGLang has no default image unless the flag gives one, TensorRT-LLM none at all.
    assert_eq!(
        refused(&md(EngineType::Sglang, 1).build()),
        "spec.engine.image (or spec.image) is required for the sglang engine: the \
         Deployment provider has no default image for it"
    );
    assert_eq!(
        refused(&md(EngineType::Trtllm, 1).build()),
        "spec.engine.image (or spec.image) is required for the trtllm engine: the \
         Deployment provider has no default image for it"
    );
    let sglang = md(EngineType::Sglang, 1)
        .image("lmsysorg/sglang:v0.5.5")
        .build();
    assert_eq!(fit::check(&provider, &sglang), Ok(()));
    // spec.engine.image is the same setting.
    let sglang = md(EngineType::Sglang, 1)
        .spec(|s| s.engine.image = Some("lmsysorg/sglang:v0.5.5".into()))
        .build();
    assert_eq!(fit::check(&provider, &sglang), Ok(()));
}

/// TensorRT-LLM runs `trtllm-serve` from the image the ModelDeployment names, with the
/// SDK's container; a served name it cannot serve is named in the warnings.
#[test]
fn trtllm_serves_from_its_own_image_and_names_its_served_name() {
    let md = md(EngineType::Trtllm, 2)
        .image("nvcr.io/nvidia/tensorrt-llm/release:1.0.0")
        .spec(|s| s.model.served_name = Some("qwen".into()))
        .build();
    assert_eq!(fit::check(&DeploymentProvider::default(), &md), Ok(()));
    let rendered = render(&md);
    let container = &rendered.objects[0].data["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        "nvcr.io/nvidia/tensorrt-llm/release:1.0.0"
    );
    assert_eq!(container["command"], json!(["trtllm-serve"]));
    assert_eq!(
        container["args"],
        json!([
            "Qwen/Qwen3-0.6B",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--tp_size",
            "2"
        ])
    );
    assert_eq!(
        Warning::ignored_fields(&rendered.warnings),
        ["spec.model.servedName"]
    );
}

/// The objects for a ModelDeployment that sets every field this provider reads: the
/// snapshot is the spec of what it applies.
#[test]
fn full_spec_renders_a_deployment_and_a_service() {
    let md = md(EngineType::Vllm, 2)
        .replicas(3)
        .label("kubeairunway.ai/team", "ml")
        .overrides(json!({"progressDeadlineSeconds": 3600}))
        .spec(|s| {
            s.engine.image = Some("vllm/vllm-openai:v0.11.0".into());
            s.engine.args = Some([("max-num-seqs".into(), "64".into())].into());
            s.engine.enable_prefix_caching = Some(true);
            s.engine.enforce_eager = Some(true);
            s.engine.extra_args = Some(vec![
                "--enable-auto-tool-choice".into(),
                "--tool-call-parser".into(),
                "hermes".into(),
            ]);
            s.node_selector = Some([("pool".into(), "gpu".into())].into());
            s.tolerations = Some(vec![
                serde_json::from_value(
                    json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
                )
                .unwrap(),
            ]);
        })
        .build();
    let rendered = render(&md);
    assert!(rendered.warnings.is_empty(), "{:?}", rendered.warnings);
    let objects: Vec<_> = rendered
        .objects
        .iter()
        .map(|o| serde_json::to_value(o).unwrap())
        .collect();
    insta::assert_yaml_snapshot!(objects);
    // The Service selects exactly the Deployment's pods.
    assert_eq!(
        objects[1]["spec"]["selector"],
        objects[0]["spec"]["selector"]["matchLabels"]
    );
}

#[test]
fn llama_cpp_gets_the_cuda_image_only_with_gpus() {
    let image = |gpus| {
        render(&md(EngineType::Llamacpp, gpus).build()).objects[0].data["spec"]["template"]["spec"]
            ["containers"][0]["image"]
            .clone()
    };
    assert_eq!(image(0), DEFAULT_LLAMACPP_IMAGE);
    assert_eq!(image(1), DEFAULT_LLAMACPP_GPU_IMAGE);
    // spec.image wins.
    let own = render(&md(EngineType::Llamacpp, 1).image("my/llama:1").build());
    assert_eq!(
        own.objects[0].data["spec"]["template"]["spec"]["containers"][0]["image"],
        "my/llama:1"
    );
}

/// The engine fields per engine: `engine.image` as the container's image, prefix caching
/// and eager execution as each server's flags (cited by the SDK's
/// `prefix_caching_and_eager_are_spelled_as_each_engine_parses_them`), named as ignored
/// where the server has none, `extraArgs` last; a flag in both `args` and `extraArgs` is
/// refused.
#[test]
fn engine_fields_render_per_engine_or_are_named() {
    let render_args = |engine: EngineType, image: &str| {
        let md = md(engine, 1)
            .spec(|s| {
                s.engine.image = Some(image.into());
                s.engine.enable_prefix_caching = Some(false);
                s.engine.enforce_eager = Some(true);
                s.engine.extra_args = Some(vec!["--x".into(), "1".into()]);
            })
            .build();
        let rendered = render(&md);
        let container = &rendered.objects[0].data["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], image);
        let args: Vec<String> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let ignored: Vec<String> = Warning::ignored_fields(&rendered.warnings)
            .into_iter()
            .map(String::from)
            .collect();
        (args.join(" "), ignored)
    };
    let (vllm, ignored) = render_args(EngineType::Vllm, "my/vllm:1");
    assert!(
        vllm.ends_with("--no-enable-prefix-caching --enforce-eager --x 1"),
        "{vllm}"
    );
    assert!(ignored.is_empty(), "{ignored:?}");
    let (sglang, ignored) = render_args(EngineType::Sglang, "my/sglang:1");
    assert!(
        sglang.ends_with("--disable-radix-cache --disable-cuda-graph --x 1"),
        "{sglang}"
    );
    assert!(ignored.is_empty(), "{ignored:?}");
    let (llama, ignored) = render_args(EngineType::Llamacpp, "my/llama:1");
    assert!(llama.ends_with("--no-cache-prompt --x 1"), "{llama}");
    assert_eq!(ignored, ["spec.engine.enforceEager"]);
    let (trtllm, ignored) = render_args(EngineType::Trtllm, "my/trtllm:1");
    assert!(
        trtllm.ends_with("--tp_size 1 --x 1") || trtllm.ends_with("8000 --x 1"),
        "{trtllm}"
    );
    assert_eq!(
        ignored,
        [
            "spec.engine.enablePrefixCaching",
            "spec.engine.enforceEager"
        ]
    );

    let both = md(EngineType::Vllm, 1)
        .spec(|s| {
            s.engine.args = Some([("x".into(), "2".into())].into());
            s.engine.extra_args = Some(vec!["--x=1".into()]);
        })
        .build();
    let provider = DeploymentProvider::default();
    let err = provider.render(&both, &api(&provider)).unwrap_err();
    assert!(err.0.starts_with("the flag --x is set both"), "{err}");
}

/// `spec.gateway` is served by core's gateway, from the serving pods this provider names.
#[test]
fn a_gateway_is_not_named_as_ignored() {
    let md = md(EngineType::Vllm, 1)
        .spec(|s| s.gateway = Some(serde_json::from_value(json!({"enabled": true})).unwrap()))
        .build();
    let warnings = render(&md).warnings;
    assert!(warnings.is_empty(), "{warnings:?}");
}

/// Any typed overrides a user may write: never a panic, wrong types refused naming the
/// key, and what is accepted rendered as documented.
#[test]
fn any_overrides() {
    let provider = DeploymentProvider::default();
    let api = api(&provider);
    let base = md(EngineType::Vllm, 1).replicas(2).build();
    testing::overrides::check_overrides(
        &base,
        &[
            ("progressDeadlineSeconds", vec![json!(3600)]),
            ("autoscaled", vec![json!(true), json!(false)]),
        ],
        |m| provider.render(m, &api),
        |m, r| {
            let o = m
                .spec
                .provider
                .as_ref()
                .and_then(|p| p.overrides.clone())
                .unwrap_or_default();
            let spec = &r.objects[0].data["spec"];
            let autoscaled = o.get("autoscaled") == Some(&json!(true));
            if spec.get("replicas").is_some() == autoscaled {
                return Err(format!(
                    "replicas rendered: {}, autoscaled: {autoscaled}",
                    !autoscaled
                ));
            }
            // Two replicas asked for while the autoscaler owns the count: named.
            let named = r
                .warnings
                .iter()
                .any(|w| w.message.contains("spec.scaling.replicas"));
            if named != autoscaled {
                return Err(format!("scaling.replicas named: {named}"));
            }
            let deadline = o.get("progressDeadlineSeconds").filter(|v| !v.is_null());
            if deadline != spec.get("progressDeadlineSeconds") {
                return Err("progressDeadlineSeconds not rendered as given".into());
            }
            Ok(())
        },
    );
}

/// The status is the Deployment's; the endpoint is the Service, once it exists.
#[test]
fn status_is_the_deployments_with_the_service_as_endpoint() {
    let provider = DeploymentProvider::default();
    let md = md(EngineType::Vllm, 1).build();
    assert_eq!(
        provider.observe(&md, &Live::empty()).phase,
        Phase::Deploying
    );
    let deployment = object(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "qwen", "generation": 1},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                   "readyReplicas": 1, "availableReplicas": 1,
                   "conditions": [{"type": "Available", "status": "True"},
                                  {"type": "Progressing", "status": "True",
                                   "reason": "NewReplicaSetAvailable"}]},
    }))
    .unwrap();
    let service = object(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "qwen"},
    }))
    .unwrap();
    let without = provider.observe(&md, &Live::new(Some(deployment.clone())));
    assert_eq!(without.phase, Phase::Running);
    assert_eq!(without.endpoint, None);
    let with = provider.observe(&md, &Live::new(Some(deployment)).with(service));
    let endpoint = with.endpoint.unwrap();
    assert_eq!(
        (endpoint.service.as_deref(), endpoint.port),
        (Some("qwen"), Some(80))
    );
}

/// The serving pods are the rendered Deployment's, on the port its container serves.
#[test]
fn serving_pods_are_the_deployments_on_the_engine_port() {
    let md = md(EngineType::Vllm, 1).build();
    let objects: Vec<_> = render(&md)
        .objects
        .iter()
        .map(|o| serde_json::to_value(o).unwrap())
        .collect();
    let pods = DeploymentProvider::default().serving_pods(&md);
    assert_eq!(
        objects[0]["spec"]["selector"]["matchLabels"],
        json!(pods.labels)
    );
    let template = &objects[0]["spec"]["template"];
    for (k, v) in &pods.labels {
        assert_eq!(template["metadata"]["labels"][k], json!(v), "{k}");
    }
    let port = &template["spec"]["containers"][0]["ports"][0]["containerPort"];
    assert_eq!(Some(port.as_i64().unwrap()), pods.port.map(i64::from));
    assert_eq!(pods.inference_pool, None);
}
