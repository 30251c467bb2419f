use super::*;
use crate::nodes::NodeProvisioning;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kubeairunway_sdk::{Provider, UpstreamRef};

fn crd(file: &str) -> CustomResourceDefinition {
    let path = format!(
        "{}/../../tests/fixtures/crds/upstream/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn api(file: &str) -> UpstreamApi {
    let wanted: UpstreamRef = KaitoProvider::default().upstream();
    UpstreamApi::detect(&crd(file), &wanted).unwrap()
}

fn md(value: Value) -> ModelDeployment {
    serde_json::from_value(value).unwrap()
}

/// The CPU llama.cpp example ModelDeployment, as the generated sample.
fn cpu_llamacpp() -> ModelDeployment {
    let text = std::fs::read_to_string(format!(
        "{}/../../config/samples/cpu-llamacpp.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

fn gpu_vllm() -> ModelDeployment {
    md(json!({
        "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "llama-8b", "namespace": "default"},
        "spec": {
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "source": "huggingface"},
            "engine": {"type": "vllm", "contextLength": 8192, "trustRemoteCode": true,
                       "args": {"gpu-memory-utilization": "0.9", "--enforce-eager": "true", "quantization": "fp8"}},
            "resources": {"gpu": {"count": 1}, "memory": "32Gi"},
            "secrets": {"huggingFaceToken": "hf-token"},
            "nodeSelector": {"kaito.sh/pool": "gpu"},
        },
    }))
}

/// Bring-your-own nodes: no instance type.
fn byo() -> KaitoProvider {
    KaitoProvider {
        inference_set: false,
        nodes: NodeProvisioning::Byo,
    }
}

/// Node auto-provisioning with a GPU and a CPU instance type.
fn nap(inference_set: bool) -> KaitoProvider {
    KaitoProvider {
        inference_set,
        nodes: NodeProvisioning::auto("Standard_NC24ads_A100_v4", "Standard_D8s_v3"),
    }
}

fn render_with(p: &KaitoProvider, m: &ModelDeployment) -> Rendered {
    p.render(m, &api("kaito.sh_workspaces.yaml")).unwrap()
}

fn objects(r: &Rendered) -> Vec<Value> {
    r.objects
        .iter()
        .map(|o| serde_json::to_value(o).unwrap())
        .collect()
}

/// KAITO ships no llama.cpp example; reviewed against the template-mode one,
/// examples/custom-model-integration/custom-model-deployment.yaml@v0.12.0 (a Workspace
/// with `resource.instanceType`, `labelSelector.matchLabels` and an
/// `inference.template` whose container serves on port 5000).
#[test]
fn cpu_llamacpp_example() {
    let m = cpu_llamacpp();
    let p = nap(false);
    assert!(p.check(&m).is_ok());
    let r = render_with(&p, &m);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    insta::assert_yaml_snapshot!(objects(&r));
}

/// Reviewed against examples/inference/kaito_workspace_custom_config.yaml@v0.12.0 (a
/// ConfigMap with `inference_config.yaml` and its `vllm` section, named by
/// `inference.config`; `max-model-len` a bare integer) and
/// kaito_workspace_llama-3.3_70b_instruct.yaml@v0.12.0 (preset with
/// `presetOptions.modelAccessSecret`).
#[test]
fn gpu_vllm_with_context_length_and_args() {
    let r = render_with(&nap(false), &gpu_vllm());
    assert_eq!(r.objects.len(), 2);
    insta::assert_yaml_snapshot!(objects(&r));
}

#[test]
fn vllm_always_names_the_served_model_in_its_config() {
    let mut m = gpu_vllm();
    m.spec.engine.context_length = None;
    m.spec.engine.trust_remote_code = false;
    m.spec.engine.args = None;
    m.spec.resources.as_mut().unwrap().memory = None;
    let r = render_with(&byo(), &m);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let o = objects(&r);
    assert_eq!(o[0]["inference"]["config"], "llama-8b-inference-config");
    let text = o[1]["data"][CONFIG_KEY].as_str().unwrap();
    assert!(
        text.ends_with("vllm:\n  served-model-name: \"Llama-3.1-8B-Instruct\"\n"),
        "{text}"
    );
    m.spec.model.served_name = Some("llama".into());
    m.spec.engine.args = Some([("served-model-name".to_string(), "x".to_string())].into());
    let mut w = Vec::new();
    assert!(inference_config(&m, &mut w).ends_with("  served-model-name: \"llama\"\n"));
    m.spec.model.served_name = None;
    assert!(inference_config(&m, &mut w).ends_with("  served-model-name: \"x\"\n"));
}

/// KAITO's vLLM wrapper appends `--key str(value)` for every key
/// (inference_api.py:143-145@v0.12.0), so a boolean flag would leave a stray `True`;
/// `--trust-remote-code` KAITO passes itself (vllm_model.go:196-199@v0.12.0).
#[test]
fn bare_flags_and_trust_remote_code_are_not_passed_as_key_true() {
    let m = gpu_vllm();
    let mut w = Vec::new();
    let text = inference_config(&m, &mut w);
    assert!(!text.contains("true"), "{text}");
    assert!(!text.contains("trust-remote-code"), "{text}");
    assert!(!text.contains("enforce-eager"), "{text}");
    let fields: Vec<_> = w.iter().map(|w| w.message.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.engine.args.enforce-eager is ignored: KAITO passes each vLLM option as \
             `--key value` and cannot pass a bare flag"
        ]
    );
    let mut m = gpu_vllm();
    m.spec.engine.args = Some([("--trust-remote-code".to_string(), "true".to_string())].into());
    let mut w = Vec::new();
    let _ = inference_config(&m, &mut w);
    assert!(
        w[0].message
            .contains("KAITO's vLLM presets always pass --trust-remote-code"),
        "{w:?}",
    );
}

/// Reviewed against examples/inference/kaito_inferenceset_llama-3.1_8b_instruct.yaml
/// @v0.12.0 (`spec.replicas`, `spec.labelSelector`, `spec.template.resource.instanceType`,
/// `spec.template.inference.preset`). The Service has no upstream example: KAITO makes
/// none for a set.
#[test]
fn replicas_use_an_inference_set_when_enabled_and_are_refused_otherwise() {
    let mut m = gpu_vllm();
    m.spec.scaling.replicas = 3;
    let refused = nap(false).check(&m).unwrap_err();
    assert!(refused.0.contains("scaling.replicas is 3"), "{refused}");
    assert!(refused.0.contains("inferencesets.kaito.sh"), "{refused}");
    let p = nap(true);
    assert!(p.check(&m).is_ok());
    let r = render_with(&p, &m);
    let o = objects(&r);
    assert_eq!(o[0]["kind"], "InferenceSet");
    assert_eq!(o[0]["spec"]["replicas"], 3);
    assert_eq!(o[2]["kind"], "Service");
    assert_eq!(o[2]["metadata"]["name"], "llama-8b-iset");
    assert_eq!(
        o[2]["spec"]["selector"],
        json!({CREATED_BY_INFERENCE_SET: "llama-8b", POD_INDEX_LABEL: "0"})
    );
    insta::assert_yaml_snapshot!(o);
}

#[test]
fn the_inference_set_service_name_is_a_dns_label() {
    let mut m = gpu_vllm();
    m.metadata.name = Some(format!("{}-b", "a".repeat(60)));
    let n = inference_set_service_name(&m);
    assert!(n.len() <= 63, "{n}");
    assert_eq!(n, format!("{}-iset", "a".repeat(58)));
}

/// KAITO has no typed overrides: every key is merged into the Workspace, checked against
/// its schema (`resource.count` is an integer of the Workspace at its root,
/// `api/v1beta1/workspace_types.go@v0.12.0`, `kaito.sh_workspaces.yaml`; it has no
/// `instanceType` at its root, only `resource.instanceType`).
#[test]
fn overrides_merge_into_the_workspace_checked_against_its_schema() {
    let provider = nap(false);
    let api = api("kaito.sh_workspaces.yaml");
    let with = |overrides: Value| {
        let mut m = cpu_llamacpp();
        m.spec.provider =
            Some(serde_json::from_value(json!({"name": "kaito", "overrides": overrides})).unwrap());
        m
    };
    let finalize = |m: &ModelDeployment| {
        let rendered = provider.render(m, &api).unwrap();
        assert!(
            rendered
                .warnings
                .iter()
                .all(|w| !w.message.contains("overrides")),
            "{:?}",
            rendered.warnings
        );
        kubeairunway_sdk::render::finalize(&provider, m, &api, rendered.objects)
    };
    let merged = finalize(&with(json!({"resource": {"count": 10}}))).unwrap();
    assert_eq!(merged[0].data["resource"]["count"], 10);
    let plain = finalize(&cpu_llamacpp()).unwrap();
    assert_eq!(
        merged[0].data["inference"], plain[0].data["inference"],
        "the rest as rendered"
    );

    let err = finalize(&with(
        json!({"instanceType": "Standard_NC6", "resource": {"count": "ten"}}),
    ))
    .unwrap_err();
    assert_eq!(err.reason(), "InvalidOverride");
    let message = err.to_string();
    for named in [
        "provider.overrides.instanceType (no such field)",
        "provider.overrides.resource.count (must be integer, not string)",
    ] {
        assert!(message.contains(named), "{message}");
    }
}

#[test]
fn llamacpp_needs_an_image() {
    let mut m = cpu_llamacpp();
    m.spec.image = None;
    let err = byo()
        .render(&m, &api("kaito.sh_workspaces.yaml"))
        .unwrap_err();
    assert!(
        err.0
            .starts_with("spec.engine.image (or spec.image) is required for llamacpp on KAITO"),
        "{err}"
    );
}

/// llama.cpp on KAITO runs the image `spec.engine.image` names (the same setting as
/// `spec.image`) with `extraArgs` after `args`; prefix caching and eager execution are the
/// image's own flags, unknown here, so they are named; a flag in both `args` and
/// `extraArgs` is refused.
#[test]
fn llamacpp_takes_engine_image_and_extra_args() {
    let mut m = cpu_llamacpp();
    m.spec.image = None;
    m.spec.engine.image = Some("ghcr.io/sozercan/llama-cpp-runner:latest".into());
    m.spec.engine.args = Some([("threads".to_string(), "4".to_string())].into());
    m.spec.engine.extra_args = Some(vec!["--ctx-size".into(), "4096".into()]);
    m.spec.engine.enable_prefix_caching = Some(true);
    m.spec.engine.enforce_eager = Some(true);
    let r = render_with(&byo(), &m);
    let o = objects(&r);
    let c = &o[0]["inference"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "ghcr.io/sozercan/llama-cpp-runner:latest");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        args[args.len() - 4..],
        ["--threads", "4", "--ctx-size", "4096"]
    );
    assert_eq!(
        Warning::ignored_fields(&r.warnings),
        [
            "spec.engine.enablePrefixCaching",
            "spec.engine.enforceEager"
        ]
    );
    m.spec.engine.extra_args = Some(vec!["--threads=8".into()]);
    let err = byo()
        .render(&m, &api("kaito.sh_workspaces.yaml"))
        .unwrap_err();
    assert!(err.0.starts_with("the flag --threads is set both"), "{err}");
}

/// KAITO's vLLM inference config passes `--key value` only: vLLM's boolean flags cannot be
/// passed, so a value other than vLLM's default is named (prefix caching on and eager off
/// are vLLM 0.25.1's defaults, the version KAITO v0.12.0 pins: honoured without a flag),
/// and so are raw `extraArgs` and either image field. Nothing of them reaches the config.
#[test]
fn vllm_engine_fields_are_honoured_by_default_or_named() {
    let fields = |engine: Value, image: Option<&str>| {
        let mut m = gpu_vllm();
        m.spec.engine = serde_json::from_value(engine).unwrap();
        m.spec.image = image.map(String::from);
        let r = render_with(&byo(), &m);
        let config = objects(&r)[1]["data"][CONFIG_KEY]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            !config.contains("prefix") && !config.contains("eager") && !config.contains("seqs"),
            "{config}"
        );
        Warning::ignored_fields(&r.warnings)
            .into_iter()
            .filter(|f| f.starts_with("spec.engine") || *f == "spec.image")
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert!(
        fields(
            json!({"type": "vllm", "enablePrefixCaching": true, "enforceEager": false}),
            None
        )
        .is_empty()
    );
    assert_eq!(
        fields(
            json!({"type": "vllm", "enablePrefixCaching": false, "enforceEager": true,
                   "extraArgs": ["--max-num-seqs", "8"], "image": "x"}),
            Some("x")
        ),
        [
            "spec.image",
            "spec.engine.image",
            "spec.engine.enablePrefixCaching",
            "spec.engine.enforceEager",
            "spec.engine.extraArgs",
        ]
    );
}

#[test]
fn llamacpp_pods_carry_metadata_env_tolerations_and_node_selector() {
    let mut m = cpu_llamacpp();
    m.metadata.uid = Some("u".into());
    m.spec = serde_json::from_value(json!({
        "model": {"id": "google/gemma-3-1b-it-qat-q8_0-gguf"},
        "engine": {"type": "llamacpp", "args": {"ggufUrl": "huggingface://google/gemma-3-1b-it-qat-q8_0-gguf/gemma-3-1b-it-q8_0.gguf", "threads": "4"}},
        "image": "ghcr.io/sozercan/llama-cpp-runner:latest",
        "resources": {"gpu": {"count": 1}},
        "env": [{"name": "A", "value": "1"}],
        "secrets": {"huggingFaceToken": "hf"},
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        "podTemplate": {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "n"}}},
    })).unwrap();
    let o = objects(&render_with(&byo(), &m));
    let t = &o[0]["inference"]["template"];
    assert_eq!(t["metadata"]["labels"]["team"], "a");
    assert_eq!(
        t["metadata"]["labels"]["kubeairunway.ai/model-deployment"],
        "gemma-cpu"
    );
    assert_eq!(t["metadata"]["annotations"]["note"], "n");
    assert_eq!(t["spec"]["nodeSelector"]["pool"], "gpu");
    assert_eq!(
        o[0]["resource"]["labelSelector"]["matchLabels"]["pool"],
        "gpu"
    );
    assert_eq!(t["spec"]["tolerations"][0]["key"], "sku");
    let c = &t["spec"]["containers"][0];
    assert_eq!(
        c["args"],
        json!([
            "huggingface://google/gemma-3-1b-it-qat-q8_0-gguf/gemma-3-1b-it-q8_0.gguf",
            "--address=:5000",
            "--threads",
            "4"
        ])
    );
    assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], 1);
    assert_eq!(c["env"][0]["name"], "A");
    assert_eq!(c["envFrom"][0]["secretRef"]["name"], "hf");
}

/// Every ModelDeployment field KAITO's vLLM preset cannot take is named.
#[test]
fn vllm_unsupported_fields_warn() {
    let mut m = gpu_vllm();
    m.spec = serde_json::from_value(json!({
        "model": {"id": "a/b", "storage": {"volumes": [{"name": "w", "claimName": "c", "mountPath": "/m"}]}},
        "engine": {"type": "vllm"},
        "resources": {"gpu": {"count": 1, "type": "amd.com/gpu"}, "memory": "1Gi", "cpu": "1"},
        "image": "x",
        "env": [{"name": "A", "value": "1"}],
        "tolerations": [{"key": "k", "operator": "Exists"}],
        "podTemplate": {"metadata": {"labels": {"a": "b"}}},
        "gateway": {"enabled": true},
        "kernelCache": {"name": "kc"},
        "scaling": {"replicas": 1, "prefill": {"replicas": 1}},
    }))
    .unwrap();
    let r = render_with(&byo(), &m);
    assert!(
        r.warnings
            .iter()
            .all(|w| w.reason == kubeairunway_sdk::conditions::reasons::UNSUPPORTED_FIELD)
    );
    let fields: Vec<_> = r
        .warnings
        .iter()
        .map(|w| w.message.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "spec.scaling.prefill",
            "spec.image",
            "spec.env",
            "spec.tolerations",
            "spec.podTemplate.metadata",
            "spec.model.storage",
            "spec.kernelCache",
            "spec.resources.memory",
            "spec.resources.cpu",
            "spec.resources.gpu.type",
        ]
    );
}

/// `type: ""`, which the CRD accepts, is the default GPU: nothing to warn about (it
/// used to be named as a GPU type KAITO cannot request).
#[test]
fn an_empty_gpu_type_is_the_default_gpu() {
    let mut m = gpu_vllm();
    m.spec
        .resources
        .as_mut()
        .unwrap()
        .gpu
        .as_mut()
        .unwrap()
        .type_ = String::new();
    let r = render_with(&byo(), &m);
    assert!(
        r.warnings
            .iter()
            .all(|w| w.ignored_field.as_deref() != Some("spec.resources.gpu.type")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn llamacpp_mounts_existing_claims_and_names_the_volumes_it_cannot() {
    let mut m = cpu_llamacpp();
    m.spec.model.storage = Some(
        serde_json::from_value(json!({"volumes": [
            {"name": "weights", "claimName": "gguf", "mountPath": "/models", "readOnly": true},
            {"name": "new", "size": "10Gi", "mountPath": "/x"},
            {"name": "nopath", "claimName": "c"},
        ]}))
        .unwrap(),
    );
    m.spec.model.served_name = Some("gemma".into());
    let r = render_with(&byo(), &m);
    let o = objects(&r);
    let spec = &o[0]["inference"]["template"]["spec"];
    assert_eq!(
        spec["volumes"],
        json!([{"name": "weights", "persistentVolumeClaim": {"claimName": "gguf", "readOnly": true}}])
    );
    assert_eq!(
        spec["containers"][0]["volumeMounts"],
        json!([{"name": "weights", "mountPath": "/models", "readOnly": true}])
    );
    let fields: Vec<_> = r
        .warnings
        .iter()
        .map(|w| w.message.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "spec.model.servedName",
            "spec.model.storage.volumes[new]",
            "spec.model.storage.volumes[nopath]"
        ]
    );
}

#[test]
fn instance_types_follow_gpu_use_and_node_provisioning() {
    let gpu = objects(&render_with(&nap(false), &gpu_vllm()));
    assert_eq!(
        gpu[0]["resource"]["instanceType"],
        "Standard_NC24ads_A100_v4"
    );
    let cpu = objects(&render_with(&nap(false), &cpu_llamacpp()));
    assert_eq!(cpu[0]["resource"]["instanceType"], "Standard_D8s_v3");
    let byo = objects(&render_with(&byo(), &gpu_vllm()));
    assert!(byo[0]["resource"].get("instanceType").is_none());
    let unset = KaitoProvider::default();
    let refused = unset.check(&gpu_vllm()).unwrap_err();
    assert!(refused.0.contains("--gpu-instance-type"), "{refused}");
}

/// KAITO's webhooks want DNS-1123 labels (workspace_validation.go:70@v0.12.0).
#[test]
fn names_kaito_refuses_are_refused() {
    let mut m = gpu_vllm();
    m.metadata.name = Some("llama.3".into());
    let refused = byo().check(&m).unwrap_err();
    assert!(refused.0.contains("DNS-1123 label"), "{refused}");
    m.metadata.name = Some("a".repeat(64));
    assert!(byo().check(&m).is_err());
    m.metadata.name = Some("llama-3".into());
    assert!(byo().check(&m).is_ok());
}

/// What KAITO's capabilities exclude is refused by the runtime, before `check`, with
/// the field, its value and what KAITO serves.
#[test]
fn what_the_capabilities_exclude_is_refused_by_the_runtime() {
    let p = byo();
    let with = |spec: Value| {
        let mut v = serde_json::to_value(cpu_llamacpp()).unwrap();
        for (k, val) in spec.as_object().unwrap() {
            v["spec"][k] = val.clone();
        }
        kubeairunway_sdk::runtime::fit::check(&p, &md(v)).map_err(|e| e.0)
    };
    assert_eq!(
        with(json!({"engine": {"type": "sglang"}})).unwrap_err(),
        "spec.engine.type is sglang, which provider kaito does not support: it serves the engines vllm, llamacpp"
    );
    assert_eq!(
        with(json!({"engine": {"type": "trtllm"}})).unwrap_err(),
        "spec.engine.type is trtllm, which provider kaito does not support: it serves the engines vllm, llamacpp"
    );
    assert_eq!(
        with(json!({"serving": {"mode": "disaggregated"}})).unwrap_err(),
        "spec.serving.mode is disaggregated, which provider kaito does not support with llamacpp: it serves the serving modes aggregated"
    );
    assert_eq!(with(json!({})), Ok(()));
}

#[test]
fn rendering_is_deterministic_and_fits_both_schemas() {
    let p = nap(false);
    for m in [cpu_llamacpp(), gpu_vllm()] {
        let a = serde_json::to_string(&objects(&render_with(&p, &m))).unwrap();
        let b = serde_json::to_string(&objects(&render_with(&p, &m))).unwrap();
        assert_eq!(a, b);
        for file in [
            "kaito.sh_workspaces.yaml",
            "kaito.sh_workspaces.v0.10.0.yaml",
        ] {
            let api = api(file);
            for o in objects(&p.render(&m, &api).unwrap()) {
                if api.is_upstream_object(&o) {
                    assert!(
                        api.missing_paths(&o).is_empty(),
                        "{file}: {:?}",
                        api.missing_paths(&o)
                    );
                }
            }
        }
    }
}

/// The InferenceSets rendered fit the real InferenceSet CRD of both KAITO releases
/// (v0.12.0 and v0.10.0, where `template.resource.instanceType` is required when
/// `resource` is given, so bring-your-own nodes render no `resource`).
#[test]
fn inference_sets_fit_both_inference_set_schemas() {
    let wanted = UpstreamRef::new(GROUP, "InferenceSet", "inferencesets", &["v1alpha1"]);
    let mut m = gpu_vllm();
    m.spec.scaling.replicas = 2;
    for file in [
        "kaito.sh_inferencesets.yaml",
        "kaito.sh_inferencesets.v0.10.0.yaml",
    ] {
        let iset_api = UpstreamApi::detect(&crd(file), &wanted).unwrap();
        for p in [
            nap(true),
            KaitoProvider {
                inference_set: true,
                nodes: NodeProvisioning::Byo,
            },
        ] {
            let o = objects(&render_with(&p, &m));
            assert_eq!(o[0]["kind"], "InferenceSet");
            assert!(
                iset_api.missing_paths(&o[0]).is_empty(),
                "{file}: {:?}",
                iset_api.missing_paths(&o[0])
            );
            if p.nodes == NodeProvisioning::Byo {
                assert!(o[0]["spec"]["template"].get("resource").is_none());
            }
        }
    }
}

#[test]
fn selection_rules_are_the_issue_s() {
    let c = byo().config();
    let rules: Vec<_> = c
        .selection_rules
        .iter()
        .map(|r| (r.condition.as_str(), r.priority))
        .collect();
    assert_eq!(
        rules,
        [
            (
                "!has(spec.resources) || !has(spec.resources.gpu) || spec.resources.gpu.count == 0",
                100
            ),
            ("spec.engine.type == 'llamacpp'", 100),
        ]
    );
}

/// The serving pods are the first pod of each Workspace on port 5000: for a set, exactly
/// what the set's Service selects; for a Workspace, KAITO's own labels; a llama.cpp
/// template (a Deployment of one pod, without the StatefulSet pod-index label) by the
/// Workspace label alone.
#[test]
fn serving_pods_are_what_the_services_select() {
    let mut m = gpu_vllm();
    m.spec.scaling.replicas = 3;
    let p = nap(true);
    let o = objects(&render_with(&p, &m));
    let pods = p.serving_pods(&m);
    assert_eq!(o[2]["spec"]["selector"], json!(pods.labels));
    assert_eq!(o[2]["spec"]["ports"][0]["targetPort"], json!(pods.port));
    let vllm = byo().serving_pods(&gpu_vllm());
    assert_eq!(
        vllm.selector(),
        "apps.kubernetes.io/pod-index=0,kaito.sh/workspace=llama-8b"
    );
    let llamacpp = byo().serving_pods(&cpu_llamacpp());
    assert_eq!(
        llamacpp.selector(),
        format!("kaito.sh/workspace={}", cpu_llamacpp().name_any())
    );
    assert_eq!((llamacpp.port, llamacpp.inference_pool), (Some(PORT), None));
}
