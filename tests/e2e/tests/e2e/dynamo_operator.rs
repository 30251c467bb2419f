//! The Dynamo operator stand-in (`kubeairunway_e2e::operators::dynamo`) checked on its own,
//! and the Dynamo provider's rendering checked against it, one test per defect of issue
//! #12 (no cluster needed: these are pure functions).

use std::collections::BTreeSet;
use std::sync::OnceLock;

use kubeairunway_dynamo_provider::Dynamo;
use kubeairunway_e2e::operators::dynamo::{
    self as op, Component, Kind, Outcome, admit, components, image_has_runtime_version,
    main_container, reconcile, start,
};
use kubeairunway_e2e::{fixtures_dir, read_crd};
use kubeairunway_sdk::api::{EngineType, Phase, ServingMode};
use kubeairunway_sdk::testing::ModelDeploymentBuilder;
use kubeairunway_sdk::{ModelDeployment, Provider, UpstreamApi};
use serde_json::{Value, json};

/// The adapters for both real CRDs: Dynamo 1.1's v1alpha1-only one and the newer v1beta1.
fn api(version: &str) -> &'static UpstreamApi {
    static APIS: OnceLock<[UpstreamApi; 2]> = OnceLock::new();
    let apis = APIS.get_or_init(|| {
        let detect = |file: &str| {
            let crd = read_crd(&fixtures_dir().join("crds/upstream").join(file)).unwrap();
            UpstreamApi::detect(&crd, &Dynamo::default().upstream()).unwrap()
        };
        [
            detect("nvidia.com_dynamographdeployments.v1alpha1-only.dynamo-1.1-branchcut.yaml"),
            detect("nvidia.com_dynamographdeployments.yaml"),
        ]
    });
    &apis[usize::from(version == "v1beta1")]
}

const VERSIONS: [&str; 2] = ["v1alpha1", "v1beta1"];

fn render(md: &ModelDeployment, version: &str) -> Value {
    let rendered = Dynamo::default().render(md, api(version)).unwrap();
    let mut object = serde_json::to_value(&rendered.objects[0]).unwrap();
    object["metadata"]["name"] = json!(md.metadata.name.clone().unwrap());
    object
}

/// What becomes of each component of `md` under the stand-in, at `version`.
fn outcomes(md: &ModelDeployment, version: &str) -> Vec<(String, Kind, Outcome)> {
    let dgd = render(md, version);
    let backend = dgd["spec"]["backendFramework"]
        .as_str()
        .unwrap()
        .to_string();
    components(version, &dgd)
        .into_iter()
        .map(|c| {
            let o = start(&backend, &c);
            (c.name, c.kind, o)
        })
        .collect()
}

fn disaggregated(engine: EngineType, prefill_gpus: i32, decode_gpus: i32) -> ModelDeployment {
    ModelDeploymentBuilder::new("pd")
        .engine(engine)
        .mode(ServingMode::Disaggregated)
        .spec(|s| {
            s.resources = None;
            s.scaling.prefill =
                serde_json::from_value(json!({"replicas": 1, "gpu": {"count": prefill_gpus}}))
                    .unwrap();
            s.scaling.decode =
                serde_json::from_value(json!({"replicas": 1, "gpu": {"count": decode_gpus}}))
                    .unwrap();
        })
        .build()
}

const ENGINES: [EngineType; 3] = [EngineType::Vllm, EngineType::Sglang, EngineType::Trtllm];

// ---- what the operator does with what we render, against the stand-in ----

/// The frontend's command merged over the operator's default
/// (`component_frontend.go:30-31` + mergo `WithOverride`) must start.
#[test]
fn the_frontend_starts_after_the_operators_merge() {
    for version in VERSIONS {
        for engine in ENGINES {
            let md = ModelDeploymentBuilder::new("fe").engine(engine).build();
            let (name, kind, outcome) = outcomes(&md, version).remove(0);
            assert_eq!((name.as_str(), kind), ("Frontend", Kind::Frontend));
            assert_eq!(outcome, Outcome::Serves, "{version} {engine}");
        }
    }
}

/// Prefill and decode workers carry what their engine needs to
/// transfer KV cache (vLLM `--kv-transfer-config`, SGLang `--host` for the bootstrap
/// server, TensorRT-LLM `cache_transceiver_config`).
#[test]
fn disaggregated_workers_transfer_kv_cache() {
    for version in VERSIONS {
        for engine in ENGINES {
            for (name, kind, outcome) in outcomes(&disaggregated(engine, 1, 1), version) {
                if matches!(kind, Kind::Prefill | Kind::Decode) {
                    assert_eq!(outcome, Outcome::Serves, "{version} {engine} {name}");
                }
            }
        }
    }
}

/// A worker's GPUs are its tensor parallelism.
#[test]
fn workers_use_all_their_gpus() {
    for version in VERSIONS {
        for engine in ENGINES {
            let md = ModelDeploymentBuilder::new("tp")
                .engine(engine)
                .gpus(4)
                .build();
            let (name, _, outcome) = outcomes(&md, version).remove(1);
            assert_eq!(outcome, Outcome::Serves, "{version} {engine} {name}");
            for (name, kind, outcome) in outcomes(&disaggregated(engine, 4, 2), version) {
                if kind != Kind::Frontend {
                    assert_eq!(outcome, Outcome::Serves, "{version} {engine} {name}");
                }
            }
        }
    }
}

/// Ready replicas of a multinode (PodCliqueScalingGroup) component,
/// which reports `availableReplicas` only.
#[test]
fn scaling_groups_report_ready_replicas() {
    for version in VERSIONS {
        let per = if version == "v1beta1" {
            "components"
        } else {
            "services"
        };
        let status = json!({
            "state": "successful",
            "conditions": [{"type": "Ready", "status": "True", "reason": "all_resources_are_ready", "message": "All resources are ready"}],
            per: {
                "Frontend": op::replica_status(version, "pd-frontend", 1, 1),
                "VllmPrefillWorker": op::scaling_group_status(version, "pd-vllmprefillworker", 2, 2),
                "VllmDecodeWorker": op::scaling_group_status(version, "pd-vllmdecodeworker", 1, 1),
            },
        });
        let live = json!({"apiVersion": format!("nvidia.com/{version}"), "kind": "DynamoGraphDeployment",
                          "metadata": {"name": "pd", "uid": "u"}, "status": status});
        let md = disaggregated(EngineType::Vllm, 1, 1);
        let o = Dynamo::default().observe(
            &md,
            &kubeairunway_sdk::Live::new(Some(serde_json::from_value(live).unwrap())),
        );
        assert_eq!(o.phase, Phase::Running);
        let r = o.replicas.unwrap();
        assert_eq!((r.desired, r.ready), (Some(3), Some(3)), "{version}");
    }
}

/// v1beta1's webhook admits a custom image without a semantic-version
/// tag only with `runtimeVersionOverride`.
#[test]
fn a_custom_image_is_admitted() {
    for version in VERSIONS {
        let md = ModelDeploymentBuilder::new("img")
            .image("registry.example/dynamo:dev")
            .build();
        assert_eq!(
            admit(version, &render(&md, version), None),
            Vec::<String>::new(),
            "{version}"
        );
    }
}

/// The whole graph of every engine and mode serves under the stand-in, and the controller
/// would report it `successful`.
#[test]
fn every_engine_and_mode_reconciles_to_successful() {
    for version in VERSIONS {
        for engine in ENGINES {
            for md in [
                ModelDeploymentBuilder::new("agg")
                    .engine(engine)
                    .gpus(2)
                    .build(),
                disaggregated(engine, 2, 1),
            ] {
                let dgd = render(&md, version);
                assert!(admit(version, &dgd, None).is_empty());
                let (status, outcomes) = reconcile(version, &dgd, &BTreeSet::new());
                assert_eq!(
                    status["state"], "successful",
                    "{version} {engine}: {outcomes:?}"
                );
            }
        }
    }
}

// ---- the stand-in's own rules ----

fn frontend(main: Value) -> Component {
    Component {
        name: "Frontend".into(),
        kind: Kind::Frontend,
        replicas: 1,
        main,
        envs: Value::Null,
        gpus: 0,
    }
}

fn worker(kind: Kind, gpus: i64, args: &[&str]) -> Component {
    Component {
        name: "Worker".into(),
        kind,
        replicas: 1,
        main: json!({"name": "main", "command": ["python3", "-m", "dynamo.vllm"], "args": args}),
        envs: Value::Null,
        gpus,
    }
}

#[test]
fn mergo_keeps_the_default_where_ours_is_empty() {
    let c = main_container(&frontend(
        json!({"image": "x:1.0.0", "command": ["python3", "-m", "dynamo.frontend"]}),
    ));
    assert_eq!(
        c.argv(),
        ["python3", "-m", "dynamo.frontend", "-m", "dynamo.frontend"]
    );
    assert_eq!(c.image, "x:1.0.0");
    let c = main_container(&frontend(
        json!({"image": "x:1.0.0", "command": [], "args": []}),
    ));
    assert_eq!(c.argv(), ["python3", "-m", "dynamo.frontend"]);
    let c = main_container(&frontend(
        json!({"args": ["-m", "dynamo.frontend", "--router-mode", "kv"]}),
    ));
    assert_eq!(
        c.argv(),
        ["python3", "-m", "dynamo.frontend", "--router-mode", "kv"]
    );
    let mut w = worker(Kind::Worker, 0, &[]);
    w.main = json!({"args": ["--model", "m"]});
    assert_eq!(main_container(&w).argv(), ["/bin/sh", "-c", "--model", "m"]);
    w.main = json!({"env": [{"name": "A", "value": "1"}]});
    w.envs = json!([{"name": "A", "value": "2"}, {"name": "B", "value": "3"}]);
    assert_eq!(
        main_container(&w).env.into_iter().collect::<Vec<_>>(),
        [
            ("A".to_string(), "2".to_string()),
            ("B".to_string(), "3".to_string())
        ]
    );
}

#[test]
fn the_frontend_refuses_unknown_arguments() {
    let dup = frontend(json!({"command": ["python3", "-m", "dynamo.frontend"]}));
    assert_eq!(
        start("vllm", &dup),
        Outcome::Exits("Unknown arguments specified: ['-m', 'dynamo.frontend']".into())
    );
    assert_eq!(
        start("vllm", &frontend(json!({"image": "x"}))),
        Outcome::Serves
    );
    let flags = frontend(json!({"args": ["-m", "dynamo.frontend", "--router-mode", "kv", "-i"]}));
    assert_eq!(start("vllm", &flags), Outcome::Serves);
}

#[test]
fn engines_refuse_or_misserve_as_upstream() {
    let exits = |o: Outcome| matches!(o, Outcome::Exits(_));
    let misserves = |o: Outcome| matches!(o, Outcome::Misserves(_));
    assert!(exits(start(
        "vllm",
        &worker(
            Kind::Prefill,
            1,
            &["--model", "m", "--disaggregation-mode", "prefill"]
        )
    )));
    assert_eq!(
        start(
            "vllm",
            &worker(
                Kind::Prefill,
                1,
                &[
                    "--model",
                    "m",
                    "--disaggregation-mode",
                    "prefill",
                    "--kv-transfer-config",
                    "{}"
                ]
            )
        ),
        Outcome::Serves
    );
    assert!(misserves(start(
        "vllm",
        &worker(Kind::Worker, 4, &["--model", "m"])
    )));
    assert!(exits(start(
        "vllm",
        &worker(
            Kind::Worker,
            2,
            &["--model", "m", "--tensor-parallel-size", "4"]
        )
    )));
    assert_eq!(
        start(
            "vllm",
            &worker(
                Kind::Worker,
                4,
                &[
                    "--model",
                    "m",
                    "--tensor-parallel-size=2",
                    "--pipeline-parallel-size",
                    "2"
                ]
            )
        ),
        Outcome::Serves
    );
    let mut sg = worker(
        Kind::Prefill,
        1,
        &["--model-path", "m", "--disaggregation-mode", "prefill"],
    );
    sg.main["command"] = json!(["python3", "-m", "dynamo.sglang"]);
    assert!(misserves(start("sglang", &sg)));
    sg.main["args"] = json!([
        "--model-path",
        "m",
        "--disaggregation-mode",
        "prefill",
        "--host",
        "0.0.0.0",
        "--tp",
        "1"
    ]);
    assert_eq!(start("sglang", &sg), Outcome::Serves);
    let mut trt = worker(
        Kind::Decode,
        1,
        &["--model", "m", "--disaggregation-mode", "decode"],
    );
    trt.main["command"] = json!(["python3", "-m", "dynamo.trtllm"]);
    assert!(misserves(start("trtllm", &trt)));
    trt.main["args"] = json!([
        "--model",
        "m",
        "--disaggregation-mode",
        "decode",
        "--override-engine-args",
        "{\"cache_transceiver_config\":{\"backend\":\"DEFAULT\"}}"
    ]);
    assert_eq!(start("trtllm", &trt), Outcome::Serves);
    assert!(
        misserves(start("sglang", &worker(Kind::Worker, 1, &[]))),
        "module of another backend"
    );
    let mut shell = worker(Kind::Worker, 0, &[]);
    shell.main = json!({"image": "x"});
    assert!(
        exits(start("vllm", &shell)),
        "a worker without a command is `/bin/sh -c`"
    );
}

#[test]
fn the_webhook_rules_on_our_fields() {
    assert!(image_has_runtime_version(
        "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.1.0"
    ));
    assert!(image_has_runtime_version(
        "r:5000/a/b:v1.4.0-rc.1+b.2@sha256:00"
    ));
    for bad in [
        "registry.example/dynamo:dev",
        "r:5000/a/b",
        "a:1.4",
        "a:01.1.0",
        "a:vv1.1.0",
    ] {
        assert!(!image_has_runtime_version(bad), "{bad}");
    }
    let dgd = |image: &str, override_: Option<&str>| {
        let mut c = json!({"name": "Frontend", "type": "frontend",
                           "podTemplate": {"spec": {"containers": [{"name": "main", "image": image}]}}});
        if let Some(v) = override_ {
            c["runtimeVersionOverride"] = json!(v);
        }
        json!({"metadata": {"name": "d"}, "spec": {"backendFramework": "vllm", "components": [c]}})
    };
    let errors = admit("v1beta1", &dgd("registry.example/dynamo:dev", None), None);
    assert_eq!(
        op::denial("v1beta1", "d", &errors),
        "DynamoGraphDeployment.nvidia.com \"d\" is invalid: spec.components[0].runtimeVersionOverride: Required value: is required when the specified main container image has no parseable semantic-version tag"
    );
    assert!(
        admit(
            "v1beta1",
            &dgd("registry.example/dynamo:dev", Some("1.4.0")),
            None
        )
        .is_empty()
    );
    assert_eq!(
        admit("v1beta1", &dgd("", None), None),
        ["spec.components[0].podTemplate.spec.containers[0].image: Required value: is required"]
    );
    // Updates: an unchanged legacy tuple is ratcheted; the framework and component set are fixed.
    let old = dgd("registry.example/dynamo:dev", None);
    assert!(admit("v1beta1", &old, Some(&old)).is_empty());
    let mut other = dgd("x:1.0.0", None);
    other["spec"]["backendFramework"] = json!("sglang");
    other["spec"]["components"][0]["name"] = json!("Other");
    assert_eq!(admit("v1beta1", &other, Some(&old)).len(), 2);
    let pvcs = json!({"metadata": {"name": "d"}, "spec": {"services": {"Frontend": {"componentType": "frontend"}},
                      "pvcs": [{"name": "a", "create": true, "size": "1Gi"}, {"name": "b", "create": false}]}});
    assert_eq!(
        admit("v1alpha1", &pvcs, None),
        [
            "spec.pvcs[0].storageClass is required when create is true",
            "spec.pvcs[0].volumeAccessMode is required when create is true",
        ]
    );
}

#[test]
fn the_controller_reports_crashes_as_pending_and_missing_claims_as_failed() {
    let dgd = json!({"metadata": {"name": "d"}, "spec": {"backendFramework": "vllm", "components": [
        {"name": "Frontend", "type": "frontend", "replicas": 2,
         "podTemplate": {"spec": {"containers": [{"name": "main", "image": "x:1.0.0", "command": ["python3", "-m", "dynamo.frontend"]}]}}},
        {"name": "VllmWorker", "type": "worker",
         "podTemplate": {"spec": {"containers": [{"name": "main", "image": "x:1.0.0", "command": ["python3", "-m", "dynamo.vllm"], "args": ["--model", "m"]}]}}},
    ]}});
    let (status, _) = reconcile("v1beta1", &dgd, &BTreeSet::new());
    assert_eq!(status["state"], "pending");
    assert_eq!(
        status["conditions"][0]["reason"],
        "some_resources_are_not_ready"
    );
    assert_eq!(
        status["conditions"][0]["message"],
        "Resources not ready: d-frontend: Component deployment not ready - Available condition not true"
    );
    assert_eq!(status["components"]["Frontend"]["readyReplicas"], 0);
    assert_eq!(status["components"]["VllmWorker"]["readyReplicas"], 1);

    let alpha = json!({"metadata": {"name": "d"}, "spec": {"backendFramework": "vllm",
        "services": {"Frontend": {"componentType": "frontend"}},
        "pvcs": [{"name": "model-cache", "create": false}]}});
    let (status, _) = reconcile("v1alpha1", &alpha, &BTreeSet::new());
    assert_eq!(status["state"], "failed");
    assert_eq!(
        status["conditions"][0]["message"],
        "failed to reconcile top-level PVCs: persistentvolumeclaims \"model-cache\" not found"
    );
    let (status, _) = reconcile(
        "v1alpha1",
        &alpha,
        &BTreeSet::from(["model-cache".to_string()]),
    );
    assert_eq!(status["state"], "successful");
}
