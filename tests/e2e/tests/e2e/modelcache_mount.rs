//! Serving pods use a model cache, within Pod Security: the controller (as its chart's
//! service account) makes a ready ModelCache's local PersistentVolume and claim, the pod
//! webhook (as its chart's service account, served to the API server as the chart
//! installs it) mounts the claim into a ModelDeployment's pods created through the API
//! server in a namespace labelled `pod-security.kubernetes.io/enforce: restricted`, and
//! deleting the cache removes both objects.
//!
//! The chart's ValidatingAdmissionPolicies on the controller's volumes, claims and Node
//! labels are enforced by the API server throughout, shown refusing what they fence
//! ([`enforce_controller_policies`]) while the controller's own writes pass them.
//!
//! The test API server does not run the PodSecurity admission plugin (docs/testing.md).
//! So the pod the API server returns is checked here against the `restricted` profile's
//! rules that concern a pod's spec ([`restricted_violations`], shown to find the
//! violations of a pod without a security context).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kubeairunway_e2e::{eventually, helm, policy, rbac};
use kubeairunway_kernelcache_api::KernelCacheNode;
use kubeairunway_kernelcache_api::model::{
    FINALIZER, ModelCache, conditions, deployment_reasons, reasons,
};
use kubeairunway_kernelcache_api::names::{MODEL_STORAGE_CLASS, model_ready_label, model_volume};
use kubeairunway_kernelcache_webhook::model_inject::{MODEL_INJECTED_ANNOTATION, VOLUME};
use kubeairunway_modelcache_hub::testing::{StandIn, commit_id};
use kubeairunway_sdk::conditions::MODEL_CACHE_READY;
use kubeairunway_testcluster::TestCluster;
use serde_json::{Value, json};

use super::modelcache::{
    MODEL_ROOT, NS, RunningAgent, cache_where, files, model_cache, node, setup, start_agent,
    start_controller,
};

const SYSTEM: &str = "kubeairunway-system";

/// The pod webhook as the chart installs it (its Service routed to an in-process server
/// running as the chart's service account), until the sender is used.
async fn start_webhook(
    cluster: &TestCluster,
    admin: &Client,
    objects: &[Value],
) -> (
    rbac::ChartIdentity,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    cluster.ensure_namespace(SYSTEM);
    helm::apply_kinds(
        admin,
        objects,
        &[
            "ServiceAccount",
            "Secret",
            "Service",
            "MutatingWebhookConfiguration",
        ],
    )
    .await
    .unwrap();
    let hook = objects
        .iter()
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .unwrap();
    let service = hook["webhooks"][0]["clientConfig"]["service"]["name"]
        .as_str()
        .unwrap();
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == service)
        .unwrap();
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let bind = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut args = vec!["kernelcache-webhook".to_string()];
    args.extend(helm::args_with(
        helm::container(objects, service, "webhook").unwrap(),
        &[
            ("webhook-bind-address", bind.to_string()),
            ("metrics-bind-address", String::new()),
        ],
    ));
    args.push(format!("--namespace={SYSTEM}"));
    let cli = <kubeairunway_kernelcache_webhook::app::Cli as clap::Parser>::try_parse_from(&args)
        .unwrap();
    let identity =
        rbac::ChartIdentity::apply(cluster, admin, objects, "the pod webhook", SYSTEM, account)
            .await
            .unwrap();
    let client = identity.client(cluster).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let rt = kubeairunway_sdk::process::Runtime::with_client(
        kubeairunway_kernelcache_webhook::app::COMPONENT,
        cli.process.clone(),
        client,
        kubeairunway_sdk::process::Shutdown::on(async {
            let _ = stopped.await;
        }),
    );
    let task = tokio::spawn(kubeairunway_kernelcache_webhook::app::run(cli, rt));
    cluster
        .route_service(admin, SYSTEM, service, 443, bind.port())
        .await
        .unwrap();
    (identity, stop, task)
}

/// The chart's ValidatingAdmissionPolicies on the controller (its volumes and claims, its
/// Node labels), applied and enforced by the API server before the controller starts:
/// waits until a volume outside the agents' root is refused to the controller's service
/// account, then shows what else the policies refuse it (a hostPath or a local path
/// elsewhere on the node, one climbing out of the root, another class, a claim of another
/// class, a Node label of someone else's) and that the cluster admin is not fenced. The
/// controller's own volume, claim and labels are admitted as the test goes on.
async fn enforce_controller_policies(
    cluster: &TestCluster,
    admin: &Client,
    objects: &[Value],
) -> (rbac::ChartIdentity, usize) {
    let name_of = |suffix: &str| {
        helm::of_kind(objects, "ValidatingAdmissionPolicy")
            .iter()
            .find_map(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .filter(|n| n.ends_with(suffix))
            })
            .unwrap_or_else(|| panic!("the chart's {suffix} policy"))
            .to_string()
    };
    let (volumes, node_labels) = (name_of("-model-volumes"), name_of("-node-labels"));
    let deployment = objects
        .iter()
        .find(|o| {
            o["kind"] == "Deployment"
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-controller"))
        })
        .unwrap();
    let identity = rbac::ChartIdentity::apply(
        cluster,
        admin,
        objects,
        "kernelcache-controller (policy probes)",
        deployment["metadata"]["namespace"].as_str().unwrap(),
        deployment["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap(),
    )
    .await
    .unwrap();
    policy::apply(admin, objects).await.unwrap();
    let controller = identity.client(cluster).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(controller.clone());
    let volume = |class: &str, source: Value| -> PersistentVolume {
        let mut spec = json!({"capacity": {"storage": "1Ki"}, "accessModes": ["ReadOnlyMany"],
            "storageClassName": class});
        spec.as_object_mut()
            .unwrap()
            .extend(source.as_object().unwrap().clone());
        serde_json::from_value(json!({"metadata": {"name": "probe"}, "spec": spec})).unwrap()
    };
    let host_path = volume(MODEL_STORAGE_CLASS, json!({"hostPath": {"path": "/etc"}}));
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let outside = "the kernel-cache controller's volumes are local paths to a repository folder below the model-cache root";
    let message = policy::until_denied(&volumes, || pvs.create(&dry_run, &host_path))
        .await
        .unwrap();
    assert!(message.ends_with(outside), "{message}");
    let pp = PostParams::default();
    policy::assert_denied(&pvs.create(&pp, &host_path).await, &volumes, outside);
    let local = |path: String| volume(MODEL_STORAGE_CLASS, json!({"local": {"path": path}}));
    for path in [
        "/var/lib/kubelet".to_string(),
        format!("{MODEL_ROOT}/models--acme--tiny"),
        format!("{MODEL_ROOT}/hub/models--acme--tiny/../../../../etc"),
        format!("{MODEL_ROOT}/hub/"),
    ] {
        policy::assert_denied(&pvs.create(&pp, &local(path)).await, &volumes, outside);
    }
    let other_class = "the kernel-cache controller touches only volumes and claims of the class kubeairunway-modelcache";
    let repository = json!({"local": {"path": format!("{MODEL_ROOT}/hub/models--acme--tiny")}});
    policy::assert_denied(
        &pvs.create(&pp, &volume("standard", repository.clone()))
            .await,
        &volumes,
        other_class,
    );
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {"storageClassName": "standard", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Ki"}}},
    }))
    .unwrap();
    policy::assert_denied(
        &Api::<PersistentVolumeClaim>::namespaced(controller.clone(), NS)
            .create(&pp, &claim)
            .await,
        &volumes,
        other_class,
    );
    // A volume of the class at a repository's folder below the root passes (a dry run:
    // the controller makes the real one); the admin is not fenced.
    pvs.create(&dry_run, &volume(MODEL_STORAGE_CLASS, repository))
        .await
        .unwrap();
    Api::<PersistentVolume>::all(admin.clone())
        .create(&dry_run, &host_path)
        .await
        .unwrap();
    // The Node labels: the controller may not change another's label.
    policy::assert_denied(
        &Api::<Node>::all(controller.clone())
            .patch(
                "gpu-a",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"pool": "b"}}})),
            )
            .await,
        &node_labels,
        "the kernel-cache controller changes only kernelcache.kubeairunway.ai/ and modelcache.kubeairunway.ai/ labels",
    );
    // A report of an agent: the controller may change only its spec.inUse.
    let reports: Api<KernelCacheNode> = Api::all(admin.clone());
    reports
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "probe-node"},
                                           "spec": {"nodeName": "probe-node"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    // Nor its nodeName, nor the key the agent published (the controller cannot have a
    // node's credentials sealed to a key of its choosing).
    for change in [
        json!({"spec": {"nodeName": "gpu-a", "inUse": []}}),
        json!({"spec": {"credentialsKey": "AAAA", "inUse": []}}),
    ] {
        policy::assert_denied(
            &Api::<KernelCacheNode>::all(controller.clone())
                .patch("probe-node", &PatchParams::default(), &Patch::Merge(change))
                .await,
            &name_of("-node-reports"),
            "the kernel-cache controller changes only spec.inUse and spec.modelDownloads of a KernelCacheNode",
        );
    }
    reports
        .delete("probe-node", &DeleteParams::default())
        .await
        .unwrap();
    // Where the probes end in the audit log: the controller's own requests come after.
    let probed = eventually(10, "the probes in the audit log", || async {
        let events = cluster.audit_events().ok()?;
        let last = events.iter().rposition(|e| {
            e.user.username == identity.user
                && e.verb == "patch"
                && e.response_status.as_ref().is_some_and(|s| s.code == 422)
        })?;
        Some(last + 1)
    })
    .await
    .unwrap();
    (identity, probed)
}

/// The controller's requests after the probes that an admission policy refused (the
/// plugin answers 422 Invalid, which [`rbac::ChartIdentity`]'s 403 guard does not see).
fn refused_by_policies(
    cluster: &TestCluster,
    identity: &rbac::ChartIdentity,
    probed: usize,
) -> Vec<String> {
    cluster.audit_events().unwrap()[probed..]
        .iter()
        .filter(|e| {
            e.user.username == identity.user
                && e.stage == "ResponseComplete"
                && e.response_status.as_ref().is_some_and(|s| s.code == 422)
        })
        .filter_map(rbac::Request::from_audit)
        .map(|r| r.to_string())
        .collect()
}

/// What the Pod Security `restricted` profile refuses in `pod`, for the rules about a
/// pod's spec (host namespaces and ports, privileged, volume types, privilege escalation,
/// non-root, seccomp, capabilities); empty: admitted at that level.
fn restricted_violations(pod: &Value) -> Vec<String> {
    const VOLUMES: &[&str] = &[
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    let spec = &pod["spec"];
    let mut out = Vec::new();
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[key] == true {
            out.push(key.to_string());
        }
    }
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let kinds: Vec<&String> = v
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "name")
            .collect();
        if !kinds.iter().all(|k| VOLUMES.contains(&k.as_str())) {
            out.push(format!("volume {}: {kinds:?}", v["name"]));
        }
    }
    let pod_sc = &spec["securityContext"];
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().cloned().unwrap_or_default());
    for c in containers {
        let sc = &c["securityContext"];
        let name = c["name"].as_str().unwrap_or_default().to_string();
        let either = |k: &str| if sc[k].is_null() { &pod_sc[k] } else { &sc[k] };
        if sc["privileged"] == true {
            out.push(format!("{name}: privileged"));
        }
        if sc["allowPrivilegeEscalation"] != false {
            out.push(format!("{name}: allowPrivilegeEscalation"));
        }
        if either("runAsNonRoot") != true || either("runAsUser") == 0 {
            out.push(format!("{name}: runAsNonRoot"));
        }
        if !["RuntimeDefault", "Localhost"].contains(
            &either("seccompProfile")["type"]
                .as_str()
                .unwrap_or_default(),
        ) {
            out.push(format!("{name}: seccompProfile"));
        }
        let caps = &sc["capabilities"];
        if !caps["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x == "ALL"))
            || caps["add"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x != "NET_BIND_SERVICE"))
        {
            out.push(format!("{name}: capabilities"));
        }
        if c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["hostPort"].as_i64().unwrap_or(0) != 0)
        {
            out.push(format!("{name}: hostPort"));
        }
    }
    out
}

/// `pod` created (again, until the webhook's configuration and CA bundle reach the API
/// server's informers) with the model cache injected: what the API server stored.
async fn created_with_cache(pods: &Api<Pod>, pod: &Pod, what: &str) -> Pod {
    eventually(60, &format!("{what} with the model cache"), || async {
        let p = pods.create(&PostParams::default(), pod).await.ok()?;
        p.metadata
            .annotations
            .as_ref()?
            .contains_key(MODEL_INJECTED_ANNOTATION)
            .then_some(p)
    })
    .await
    .unwrap()
}

/// A serving pod of the ModelDeployment `md` that the `restricted` level admits (or, with
/// `compliant` false, one it refuses: no security context).
fn serving_pod(md: &str, compliant: bool) -> Pod {
    let (pod_sc, container_sc) = if compliant {
        (
            json!({"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}),
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}),
        )
    } else {
        (json!({}), json!({}))
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": format!("{md}-"), "namespace": NS,
                     "labels": {"kubeairunway.ai/model-deployment": md}},
        "spec": {"securityContext": pod_sc, "containers": [{
            "name": "vllm", "image": "vllm/vllm-openai:v0.11", "securityContext": container_sc,
        }]},
    }))
    .unwrap()
}

async fn model_deployment(client: &Client, name: &str, model: Value) {
    let api: Api<kubeairunway_sdk::ModelDeployment> = Api::namespaced(client.clone(), NS);
    api.patch(
        name,
        &PatchParams::apply("user").force(),
        &Patch::Apply(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"model": model, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}},
        })),
    )
    .await
    .unwrap();
}

/// The PersistentVolume of the ModelCache `tiny` and its claim, checked field by field.
async fn assert_volumes(client: &Client, claim_name: &str) {
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&model_volume(NS, "tiny"))
        .await
        .unwrap();
    let spec = serde_json::to_value(pv.spec.unwrap()).unwrap();
    assert_eq!(
        spec["local"]["path"],
        format!("{MODEL_ROOT}/hub/models--acme--tiny")
    );
    assert_eq!(
        spec["nodeAffinity"]["required"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [{"key": "modelcache.kubeairunway.ai/ml.tiny", "operator": "In", "values": ["true"]}]}])
    );
    assert_eq!(spec["accessModes"], json!(["ReadOnlyMany"]));
    assert_eq!(spec["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(spec["storageClassName"], MODEL_STORAGE_CLASS);
    assert_eq!(spec["claimRef"]["namespace"], NS);
    assert_eq!(spec["claimRef"]["name"], claim_name);
    let total: u64 = files().iter().map(|f| f.content.len()).sum();
    assert_eq!(spec["capacity"]["storage"], total.to_string());
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .get(claim_name)
        .await
        .unwrap();
    let owner = &pvc.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("ModelCache", "tiny")
    );
    let spec = serde_json::to_value(pvc.spec.unwrap()).unwrap();
    assert_eq!(spec["volumeName"], model_volume(NS, "tiny"));
    assert_eq!(spec["storageClassName"], MODEL_STORAGE_CLASS);
    assert_eq!(spec["accessModes"], json!(["ReadOnlyMany"]));
}

/// The pod's model-cache volume, its container's mount and environment.
fn assert_mounted(pod: &Pod, claim_name: &str) {
    let spec = serde_json::to_value(pod.spec.clone().unwrap()).unwrap();
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == VOLUME)
        .unwrap_or_else(|| panic!("no {VOLUME} volume: {spec}"));
    assert_eq!(
        volume["persistentVolumeClaim"],
        json!({"claimName": claim_name, "readOnly": true})
    );
    let c = &spec["containers"][0];
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == VOLUME)
        .unwrap();
    assert_eq!(mount["mountPath"], "/models/hf/models--acme--tiny");
    assert_eq!(mount["readOnly"], true);
    let env: BTreeMap<&str, &str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    assert_eq!(env["HF_HUB_CACHE"], "/models/hf");
    assert_eq!(env["HF_HUB_OFFLINE"], "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_pods_mount_a_ready_model_cache_in_a_restricted_namespace() {
    let Some(helm_bin) = helm::require() else {
        return;
    };
    let objects = helm::template(&helm_bin, &helm::chart("kernelcache-provider"), &[]).unwrap();
    let controller_args = objects
        .iter()
        .find(|o| {
            o["kind"] == "Deployment"
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-controller"))
        })
        .unwrap()["spec"]["template"]["spec"]["containers"][0]["args"]
        .to_string();
    assert!(
        controller_args.contains(&format!("--model-cache-root={MODEL_ROOT}")),
        "the controller is told the agents' root: {controller_args}"
    );
    let (cluster, client) = setup("mc-mount").await;
    let hub = StandIn::start().await;
    let commit = commit_id("tiny-1");
    hub.commit("acme/tiny", "main", &commit, files());
    for (name, pool) in [("gpu-a", "a"), ("gpu-b", "a"), ("cpu-c", "c")] {
        node(&client, name, pool).await;
    }
    model_cache(
        &client,
        "tiny",
        json!({"source": "hf://acme/tiny", "nodeSelector": {"pool": "a"}}),
    )
    .await
    .unwrap();
    // Another cache of the same repository (its folder on the nodes shared), at another
    // commit with the same files (the blobs shared too).
    let commit_v2 = commit_id("tiny-2");
    hub.commit("acme/tiny", "v2", &commit_v2, files());
    model_cache(
        &client,
        "tiny-v2",
        json!({"source": "hf://acme/tiny", "revision": "v2", "nodeSelector": {"pool": "a"}}),
    )
    .await
    .unwrap();
    let (probes, probed) = enforce_controller_policies(&cluster, &client, &objects).await;
    let (controller_identity, stop_controller, controller) =
        start_controller(&cluster, &client).await;
    let roots: Vec<(&str, tempfile::TempDir)> = ["gpu-a", "gpu-b", "cpu-c"]
        .into_iter()
        .map(|n| (n, tempfile::tempdir().unwrap()))
        .collect();
    let agents: Vec<RunningAgent> = roots
        .iter()
        .map(|(n, root)| start_agent(&client, n, root.path(), &hub))
        .collect();

    // Ready on two of three nodes: the volume on those nodes, the claim bound to it.
    let status = cache_where(&client, "tiny", "Ready with its claim", |s| {
        s.ready_nodes == 2 && s.claim_name.is_some()
    })
    .await;
    let claim_name = status.claim_name.unwrap();
    assert_eq!(claim_name, "modelcache-tiny");
    assert_volumes(&client, &claim_name).await;
    // The controller labelled the ready nodes, under the chart's policy on Node labels.
    let label = model_ready_label(NS, "tiny");
    for (name, ready) in [("gpu-a", true), ("gpu-b", true), ("cpu-c", false)] {
        eventually(30, &format!("{label} on {name}: {ready}"), || async {
            let node = Api::<Node>::all(client.clone()).get(name).await.ok()?;
            (node.labels().get(&label).is_some_and(|v| v == "true") == ready).then_some(())
        })
        .await
        .unwrap();
    }

    // The namespace enforces `restricted` (as labelled; see the module's comment).
    Api::<Namespace>::all(client.clone())
        .patch(
            NS,
            &PatchParams::apply("test-operator").force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": NS, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    model_deployment(&client, "llama", json!({"id": "acme/tiny"})).await;
    model_deployment(
        &client,
        "named-missing",
        json!({"id": "acme/tiny", "cacheRef": {"name": "nope"}}),
    )
    .await;
    let unsafe_pod = serde_json::to_value(serving_pod("llama", false)).unwrap();
    assert_eq!(
        restricted_violations(&unsafe_pod),
        [
            "vllm: allowPrivilegeEscalation",
            "vllm: runAsNonRoot",
            "vllm: seccompProfile",
            "vllm: capabilities",
        ],
        "the check finds what restricted refuses: {unsafe_pod}"
    );

    let (webhook_identity, stop_webhook, webhook) =
        start_webhook(&cluster, &client, &objects).await;
    // The webhook's CA bundle and configuration reach the API server's informers.
    let injected = created_with_cache(&pods, &serving_pod("llama", true), "a serving pod").await;
    assert_eq!(
        injected.metadata.annotations.as_ref().unwrap()[MODEL_INJECTED_ANNOTATION],
        format!("{NS}/tiny@{commit}")
    );
    assert_mounted(&injected, &claim_name);
    let returned = serde_json::to_value(&injected).unwrap();
    assert_eq!(
        restricted_violations(&returned),
        Vec::<String>::new(),
        "{returned}"
    );
    // A cache named but missing: the pod is created as it is.
    let plain = pods
        .create(&PostParams::default(), &serving_pod("named-missing", true))
        .await
        .unwrap();
    assert!(plain.metadata.annotations.unwrap_or_default().is_empty());
    assert!(
        plain
            .spec
            .unwrap()
            .volumes
            .unwrap_or_default()
            .iter()
            .all(|v| v.name != VOLUME)
    );

    // A llama.cpp pod naming its model with --hf-repo (the Deployment provider's
    // container, LLAMA_CACHE on a volume of its own): the claim where llama.cpp looks,
    // offline. The ModelDeployment goes after (it would hold the cache's deletion).
    let mds: Api<kubeairunway_sdk::ModelDeployment> = Api::namespaced(client.clone(), NS);
    mds.patch(
        "gguf",
        &PatchParams::apply("user").force(),
        &Patch::Apply(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "gguf", "namespace": NS},
            "spec": {"model": {"id": "acme/tiny", "cacheRef": {"name": "tiny"}},
                     "engine": {"type": "llamacpp"}, "resources": {"gpu": {"count": 0}}},
        })),
    )
    .await
    .unwrap();
    let mut llama_pod = serde_json::to_value(serving_pod("gguf", true)).unwrap();
    let container = &mut llama_pod["spec"]["containers"][0];
    container["name"] = json!("llama");
    container["args"] = json!(["--hf-repo", "acme/tiny", "--port", "8000"]);
    container["env"] = json!([{"name": "LLAMA_CACHE", "value": "/model-cache"}]);
    container["volumeMounts"] = json!([{"name": "model-cache", "mountPath": "/model-cache"}]);
    llama_pod["spec"]["volumes"] = json!([{"name": "model-cache", "emptyDir": {}}]);
    let llama_pod: Pod = serde_json::from_value(llama_pod).unwrap();
    let llama = created_with_cache(&pods, &llama_pod, "a llama.cpp pod").await;
    let c = serde_json::to_value(&llama.spec.as_ref().unwrap().containers[0]).unwrap();
    assert_eq!(
        c["volumeMounts"][1],
        json!({"name": VOLUME, "mountPath": "/model-cache/models--acme--tiny", "readOnly": true}),
        "{c}"
    );
    assert_eq!(
        c["env"],
        json!([
            {"name": "LLAMA_CACHE", "value": "/model-cache"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "LLAMA_ARG_OFFLINE", "value": "1"},
        ]),
        "no GGUF file named by the cache's include: llama.cpp picks among the cached ones"
    );
    mds.delete("gguf", &DeleteParams::default()).await.unwrap();
    eventually(30, "the llama.cpp ModelDeployment gone", || async {
        mds.get_opt("gguf").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();

    // Status says whether the cache is used: which one at which commit, or why not.
    let condition = |name: &'static str| {
        let mds: Api<kubeairunway_sdk::ModelDeployment> = Api::namespaced(client.clone(), NS);
        async move {
            let md = mds.get(name).await.ok()?;
            kubeairunway_sdk::conditions::find(&md.status?.conditions, MODEL_CACHE_READY).cloned()
        }
    };
    let used = eventually(30, "llama's ModelCacheReady", || async {
        condition("llama").await.filter(|c| c.status == "True")
    })
    .await
    .unwrap();
    assert_eq!(used.reason, deployment_reasons::READY);
    assert!(
        used.message
            .contains(&format!("'tiny' holds acme/tiny at commit {commit}")),
        "{}",
        used.message
    );
    let missing = eventually(30, "named-missing's ModelCacheReady", || {
        condition("named-missing")
    })
    .await
    .unwrap();
    assert_eq!(
        (missing.status.as_str(), missing.reason.as_str()),
        ("False", deployment_reasons::NOT_FOUND),
        "{}",
        missing.message
    );
    // No cache concerns a ModelDeployment of another model: no condition.
    model_deployment(&client, "unrelated", json!({"id": "acme/other"})).await;
    model_deployment(
        &client,
        "witness",
        json!({"id": "acme/tiny", "cacheRef": {"name": "nope-either"}}),
    )
    .await;
    eventually(30, "the witness's condition, written after", || {
        condition("witness")
    })
    .await
    .unwrap();
    assert_eq!(condition("unrelated").await, None);

    cache_where(&client, "tiny-v2", "the other cache Ready", |s| {
        s.ready_nodes == 2
    })
    .await;
    let caches: Api<ModelCache> = Api::namespaced(client.clone(), NS);
    assert!(
        caches
            .get("tiny")
            .await
            .unwrap()
            .finalizers()
            .iter()
            .any(|f| f == FINALIZER),
        "the controller's finalizer is on the cache"
    );

    // Deleted while `llama` uses it (its model at main): held, the user named, the
    // volume kept.
    caches
        .delete("tiny", &DeleteParams::default())
        .await
        .unwrap();
    let held = eventually(60, "the deletion held, naming its user", || async {
        let c = caches.get_opt("tiny").await.unwrap()?;
        c.metadata.deletion_timestamp.as_ref()?;
        c.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == conditions::DELETING && c.status == "True")
    })
    .await
    .unwrap();
    assert_eq!(held.reason, reasons::IN_USE);
    assert_eq!(
        held.message,
        "in use by ModelDeployments llama: delete them or point them elsewhere"
    );
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&model_volume(NS, "tiny"))
        .await
        .unwrap();
    assert!(
        pv.metadata.deletion_timestamp.is_none(),
        "the volume is kept while held"
    );
    let held_files = |root: &std::path::Path, commit: &str| {
        root.join("models/hub/models--acme--tiny/snapshots")
            .join(commit)
            .join("config.json")
    };
    for (_, root) in &roots[..2] {
        assert!(
            held_files(root.path(), &commit).exists(),
            "files kept while held"
        );
    }

    // Its user deleted: the cache goes, and the claim and the cluster-scoped volume with it.
    Api::<kubeairunway_sdk::ModelDeployment>::namespaced(client.clone(), NS)
        .delete("llama", &DeleteParams::default())
        .await
        .unwrap();
    eventually(60, "the cache gone once unused", || async {
        caches
            .get_opt("tiny")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await
    .unwrap();
    eventually(60, "the volume and claim removed", || async {
        let pv = Api::<PersistentVolume>::all(client.clone())
            .get_opt(&model_volume(NS, "tiny"))
            .await
            .unwrap();
        let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
            .get_opt(&claim_name)
            .await
            .unwrap();
        // Deleted objects may linger with a protection finalizer (none here: no
        // controller-manager runs): gone or being deleted.
        let going = |m: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>| {
            m.is_none_or(|m| m.deletion_timestamp.is_some())
        };
        (going(pv.as_ref().map(|p| &p.metadata)) && going(pvc.as_ref().map(|p| &p.metadata)))
            .then_some(())
    })
    .await
    .unwrap();

    // The files go from the nodes' roots: the snapshot and ref of the deleted cache's
    // commit; the other cache of the repository keeps its snapshot and the blobs it links.
    eventually(
        60,
        "the deleted cache's files removed from the nodes",
        || async {
            roots[..2]
                .iter()
                .all(|(_, root)| {
                    !root
                        .path()
                        .join("models/hub/models--acme--tiny/snapshots")
                        .join(&commit)
                        .exists()
                })
                .then_some(())
        },
    )
    .await
    .unwrap();
    for (node, root) in &roots[..2] {
        let repo = root.path().join("models/hub/models--acme--tiny");
        assert!(
            !repo.join("refs/main").exists(),
            "{node}: refs/main removed"
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("refs/v2")).unwrap(),
            commit_v2
        );
        for f in files() {
            let kept = std::fs::read(repo.join("snapshots").join(&commit_v2).join(&f.path))
                .unwrap_or_else(|e| panic!("{node}: {} of the other cache: {e}", f.path));
            assert_eq!(
                kubeairunway_modelcache_hub::hash::sha256(&kept),
                f.sha256,
                "{node}: {}",
                f.path
            );
        }
    }
    let other = caches.get("tiny-v2").await.unwrap();
    assert_eq!(other.status.unwrap().ready_nodes, 2);

    for a in agents {
        a.stop().await;
    }
    let _ = stop_webhook.send(());
    webhook.await.unwrap().unwrap();
    let _ = stop_controller.send(());
    controller.await.unwrap().unwrap();
    drop(webhook_identity);
    drop(controller_identity);
    let refused = refused_by_policies(&cluster, &probes, probed);
    assert!(
        refused.is_empty(),
        "the chart's admission policies refused the controller: {refused:#?}"
    );
    drop(probes);
}
