//! The kernel-cache controller, in-process, against a real API server of its own and a
//! real loopback registry holding real cache images with real cosign signatures (made with
//! the sigstore crate). The test plays the node agents: it writes KernelCacheNode reports
//! with the agent's field manager.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kubeairunway_e2e::cache_images::{
    new_signer, pinned, push, sign, start_registry, triton_cuda, vllm_cuda,
};
use kubeairunway_kernelcache_api::{
    KernelCache, KernelCacheNode, KernelCacheStatus, VerificationMode,
};
use kubeairunway_kernelcache_artifact::sealed::{NodeKey, node_secret_name};
use kubeairunway_kernelcache_artifact::secrets::KubeSecrets;
use kubeairunway_kernelcache_controller::{self as controller, Settings, metrics::Metrics};
use kubeairunway_sdk::conditions::{self, KERNEL_CACHE_READY};
use kubeairunway_sdk::{InferenceProviderConfig, ModelDeployment};
use serde_json::{Value, json};

const NS: &str = "ml";

/// Retry `check` for up to 60 s; on timeout, fail with its last error.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() > deadline => {
                anyhow::bail!("timed out waiting for {what}; last: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

async fn apply(
    client: &Client,
    api_version: &str,
    kind: &str,
    plural: &str,
    name: &str,
    body: Value,
) {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let resource = kube::discovery::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let namespaced = kind != "KernelCachePolicy" && kind != "KernelCacheNode";
    let api: Api<kube::api::DynamicObject> = if namespaced {
        Api::namespaced_with(client.clone(), NS, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    let mut object = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}});
    if let (Some(o), Some(b)) = (object.as_object_mut(), body.as_object()) {
        o.extend(b.clone());
    }
    api.patch(
        name,
        &PatchParams::apply("test").force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
}

async fn cache(client: &Client, name: &str, image: &str) {
    apply(
        client,
        "cache.kubeairunway.ai/v1alpha1",
        "KernelCache",
        "kernelcaches",
        name,
        json!({"spec": {"image": image}}),
    )
    .await;
}

async fn status_where(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&KernelCacheStatus) -> bool,
) -> KernelCacheStatus {
    let api: Api<KernelCache> = Api::namespaced(client.clone(), NS);
    eventually(what, || {
        let api = api.clone();
        let check = &check;
        async move {
            let c = api.get(name).await?;
            let s = c.status.unwrap_or_default();
            anyhow::ensure!(check(&s), "status: {s:?}");
            Ok(s)
        }
    })
    .await
    .unwrap()
}

/// The caches in use on each node, from the serving pods bound to it (the pod webhook's
/// annotation), recorded in the node's report for its agent, which reads no pods: gpu-a
/// (a pod of the cache) and gpu-b (a pod of another namespace naming this one's cache,
/// which counts for nothing); a pod gone uses nothing.
async fn in_use_is_recorded_from_the_pods_on_each_node(
    cluster: &kubeairunway_testcluster::TestCluster,
    client: &Client,
    digest: &str,
) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DeleteParams, PostParams};
    use kubeairunway_kernelcache_api::KernelCacheNode;
    let serving = |name: &str, node: &str| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name,
                         "labels": {"kubeairunway.ai/model-deployment": "uses"},
                         "annotations": {"cache.kubeairunway.ai/injected": format!("{NS}/signed@{digest}")}},
            "spec": {"nodeName": node, "containers": [{"name": "vllm", "image": "vllm"}]},
        }))
        .unwrap()
    };
    cluster.ensure_namespace("tenant-b");
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &serving("served", "gpu-a"))
        .await
        .unwrap();
    Api::<Pod>::namespaced(client.clone(), "tenant-b")
        .create(&PostParams::default(), &serving("claims", "gpu-b"))
        .await
        .unwrap();
    let reports: Api<KernelCacheNode> = Api::all(client.clone());
    let in_use = |node: &'static str| {
        let reports = reports.clone();
        async move { anyhow::Ok(reports.get(node).await?.spec.in_use) }
    };
    let used = vec![format!("{NS}/signed@{digest}")];
    eventually("in use recorded per node", || async {
        let (a, b) = (in_use("gpu-a").await?, in_use("gpu-b").await?);
        anyhow::ensure!(
            a.as_ref() == Some(&used) && b == Some(Vec::new()),
            "{a:?} {b:?}"
        );
        Ok(())
    })
    .await
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete("served", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("nothing in use once the pod is gone", || async {
        let a = in_use("gpu-a").await?;
        anyhow::ensure!(a == Some(Vec::new()), "{a:?}");
        Ok(())
    })
    .await
    .unwrap();
}

/// The registry credentials sealed for `node` under the entry `name` of its Secret,
/// opened with the node's `key`, as its agent reads them.
async fn opened(
    handed: &Api<k8s_openapi::api::core::v1::Secret>,
    node: &str,
    name: &str,
    key: &NodeKey,
    registry: &str,
) -> anyhow::Result<oci_client::secrets::RegistryAuth> {
    let secret = handed.get(&node_secret_name(node)).await?;
    let data = secret.data.unwrap_or_default();
    let sealed = data
        .get(name)
        .ok_or_else(|| anyhow::anyhow!("no entry for the cache yet"))?;
    let opened = key.open(&sealed.0)?;
    Ok(
        kubeairunway_kernelcache_artifact::credentials::registry_auth(
            registry,
            &[(name.to_string(), opened)],
        )?,
    )
}

/// What an agent on `node` reports: `(cache, digest, state, message)` entries.
async fn node_report(client: &Client, node: &str, entries: &[(&str, &str, &str, &str)]) {
    let api: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource::erase::<kubeairunway_kernelcache_api::KernelCacheNode>(&()),
    );
    let body = json!({
        "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode",
        "metadata": {"name": node}, "spec": {"nodeName": node},
    });
    api.patch(
        node,
        &PatchParams::apply("kernelcache-agent").force(),
        &Patch::Apply(&body),
    )
    .await
    .unwrap();
    let caches: Vec<Value> = entries
        .iter()
        .map(|(name, digest, state, message)| {
            json!({"namespace": NS, "name": name, "digest": digest, "state": state, "message": message})
        })
        .collect();
    let status = json!({
        "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode",
        "metadata": {"name": node}, "status": {"gpuCount": 1, "caches": caches},
    });
    api.patch_status(
        node,
        &PatchParams::apply("kernelcache-agent").force(),
        &Patch::Apply(&status),
    )
    .await
    .unwrap();
}

fn condition<'a>(s: &'a KernelCacheStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
    let c = conditions::find(&s.conditions, type_).unwrap_or_else(|| panic!("no {type_}: {s:?}"));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

#[tokio::test]
async fn caches_are_pinned_verified_aggregated_and_reported_on_model_deployments() {
    let (cluster, client) = kubeairunway_sdk::testing::private_cluster(
        "kc-controller",
        &kubeairunway_kernelcache_api::crds(),
    )
    .await
    .unwrap();
    cluster.ensure_namespace(NS);
    let registry = start_registry("kc-controller").unwrap();
    let (signer, public) = new_signer().unwrap();
    let (other_signer, _) = new_signer().unwrap();
    // A trusted key that signs an image only after its KernelCache was refused.
    let (late_signer, late_public) = new_signer().unwrap();

    let signed = push(&registry, "caches/signed:v1", &triton_cuda("90").unwrap())
        .await
        .unwrap();
    sign(
        &registry,
        &pinned(&registry, &signed).await.unwrap(),
        signer,
    )
    .await
    .unwrap();
    let unsigned = push(&registry, "caches/unsigned:v1", &vllm_cuda("90").unwrap())
        .await
        .unwrap();
    let wrong = push(&registry, "caches/wrong:v1", &triton_cuda("80").unwrap())
        .await
        .unwrap();
    sign(
        &registry,
        &pinned(&registry, &wrong).await.unwrap(),
        other_signer,
    )
    .await
    .unwrap();

    cluster.ensure_namespace("kc-credentials");
    // The operator allows the test registry's `caches/` repositories only.
    let settings = Settings {
        plain_http: vec![registry.addr().to_string()],
        allowed: kubeairunway_kernelcache_artifact::allow::AllowedRegistries::new(vec![
            format!("{}/caches", registry.addr()).parse().unwrap(),
        ]),
        resync: Duration::from_secs(2),
        credentials_namespace: Some("kc-credentials".into()),
        ..Settings::default()
    };
    // The controller runs as its chart's service account, under the RBAC the chart renders
    // for the pull Secrets and handover namespace it is told about: a request the chart
    // does not grant fails the test.
    let identity = match kubeairunway_e2e::helm::require() {
        Some(helm_bin) => {
            let objects = kubeairunway_e2e::helm::template(
                &helm_bin,
                &kubeairunway_e2e::helm::chart("kernelcache-provider"),
                &[
                    ("credentials.namespace", "kc-credentials"),
                    ("controller.pullSecrets[0].namespace", NS),
                    ("controller.pullSecrets[0].names[0]", "regcred"),
                ],
            )
            .unwrap();
            let account = objects
                .iter()
                .find(|o| {
                    o["kind"] == "Deployment"
                        && o["metadata"]["name"]
                            .as_str()
                            .is_some_and(|n| n.ends_with("-controller"))
                })
                .and_then(|d| d["spec"]["template"]["spec"]["serviceAccountName"].as_str())
                .unwrap()
                .to_string();
            Some(
                kubeairunway_e2e::rbac::ChartIdentity::apply(
                    &cluster,
                    &client,
                    &objects,
                    "kernelcache-controller",
                    "kubeairunway-system",
                    &account,
                )
                .await
                .unwrap(),
            )
        }
        None => None,
    };
    let controller_client = match &identity {
        Some(identity) => identity.client(&cluster).await.unwrap(),
        None => client.clone(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let synced = kubeairunway_sdk::process::Check::default();
    let task = tokio::spawn(controller::run(
        controller_client.clone(),
        settings,
        Arc::new(KubeSecrets(controller_client.clone())),
        Arc::new(Metrics::default()),
        synced.clone(),
        async move {
            let _ = stopped.await;
        },
    ));

    // Readiness: set once every watch cache the controller reads is filled.
    eventually("the controller's watch caches synced", || {
        let synced = synced.clone();
        async move {
            anyhow::ensure!(synced.is_set(), "not yet");
            Ok(())
        }
    })
    .await
    .unwrap();

    // An image from elsewhere (another repository of the same registry, another host) is
    // refused before any request for it, with the operator's list in the message.
    for (name, image) in [
        ("elsewhere", format!("{}/other/cache:v1", registry.addr())),
        ("far", "registry.example:6443/caches/signed:v1".to_string()),
    ] {
        apply(
            &client,
            "cache.kubeairunway.ai/v1alpha1",
            "KernelCache",
            "kernelcaches",
            name,
            json!({"spec": {"image": image}}),
        )
        .await;
        let s = status_where(&client, name, "refused: registry not allowed", |s| {
            conditions::find(&s.conditions, "Resolved").is_some()
        })
        .await;
        let (status, reason, message) = condition(&s, "Resolved");
        assert_eq!(
            (status, reason),
            ("False", "RegistryNotAllowed"),
            "{message}"
        );
        assert!(
            message.contains(&format!("allowed: {}/caches", registry.addr())),
            "{message}"
        );
        assert_eq!(condition(&s, "Ready").1, "RegistryNotAllowed");
        assert!(s.usable_image().is_none() && s.resolved_digest.is_none());
    }

    // A cache naming a pull Secret: the controller hands the registry's entry over to the
    // agents of the nodes the cache selects, sealed to each one's published key in that
    // node's Secret, and takes it back when the cache goes.
    let keys: Vec<(&str, &str, NodeKey)> = vec![
        ("sealed-a", "sealed", NodeKey::generate()),
        ("sealed-b", "other", NodeKey::generate()),
    ];
    for (node, pool, key) in &keys {
        Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
            .create(
                &kube::api::PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": node, "labels": {"pool": pool}}}),
                )
                .unwrap(),
            )
            .await
            .unwrap();
        Api::<KernelCacheNode>::all(client.clone())
            .patch(
                node,
                &PatchParams::apply("kernelcache-agent").force(),
                &Patch::Apply(json!({
                    "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode",
                    "metadata": {"name": node},
                    "spec": {"nodeName": node, "credentialsKey": key.public()},
                })),
            )
            .await
            .unwrap();
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), NS);
    let config = json!({"auths": {registry.addr(): {"username": "robot", "password": "pw"}}});
    secrets
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "regcred"},
                "type": "kubernetes.io/dockerconfigjson",
                "stringData": {".dockerconfigjson": config.to_string()},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    apply(
        &client,
        "cache.kubeairunway.ai/v1alpha1",
        "KernelCache",
        "kernelcaches",
        "private",
        json!({"spec": {"image": signed, "imagePullSecrets": ["regcred"],
                        "nodeSelector": {"pool": "sealed"}}}),
    )
    .await;
    let handed: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "kc-credentials");
    let name = kubeairunway_kernelcache_artifact::credentials::handover_name(NS, "private");
    let addr = registry.addr().to_string();
    let auth = eventually("the credentials sealed for sealed-a", || {
        opened(&handed, "sealed-a", &name, &keys[0].2, &addr)
    })
    .await
    .unwrap();
    assert_eq!(
        auth,
        oci_client::secrets::RegistryAuth::Basic("robot".into(), "pw".into())
    );
    // sealed-b is not selected: nothing for it; sealed-a's entry does not open with
    // sealed-b's key.
    assert!(
        handed
            .get_opt(&node_secret_name("sealed-b"))
            .await
            .unwrap()
            .is_none()
    );
    let a_secret = handed.get(&node_secret_name("sealed-a")).await.unwrap();
    assert!(keys[1].2.open(&a_secret.data.unwrap()[&name].0).is_err());
    // Once the pool changes, sealed-b gets its own sealed entry.
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch(
            "sealed-b",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pool": "sealed"}}})),
        )
        .await
        .unwrap();
    eventually("the credentials sealed for sealed-b", || {
        opened(&handed, "sealed-b", &name, &keys[1].2, &addr)
    })
    .await
    .unwrap();
    Api::<KernelCache>::namespaced(client.clone(), NS)
        .delete("private", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually("the sealed credentials taken back", || async {
        for node in ["sealed-a", "sealed-b"] {
            anyhow::ensure!(
                handed.get_opt(&node_secret_name(node)).await?.is_none(),
                "{node}'s Secret still there"
            );
        }
        Ok(())
    })
    .await
    .unwrap();

    // Without a policy nothing is usable.
    cache(&client, "signed", &signed).await;
    let s = status_where(&client, "signed", "NoPolicy", |s| {
        conditions::find(&s.conditions, "Verified").is_some_and(|c| c.reason == "NoPolicy")
    })
    .await;
    assert!(
        s.resolved_digest
            .as_deref()
            .is_some_and(|d| d.starts_with("sha256:"))
    );
    assert_eq!(s.usable_image(), None);

    // Key policy: the signed cache is verified and usable; the others are refused.
    apply(
        &client,
        "cache.kubeairunway.ai/v1alpha1",
        "KernelCachePolicy",
        "kernelcachepolicies",
        "default",
        json!({"spec": {"mode": "key", "publicKeys": [public, late_public]}}),
    )
    .await;
    cache(&client, "unsigned", &unsigned).await;
    cache(&client, "wrong", &wrong).await;
    let s = status_where(&client, "signed", "verified", |s| {
        s.usable_image().is_some()
    })
    .await;
    let digest = s.resolved_digest.clone().unwrap();
    assert_eq!(
        s.pinned_image,
        Some(pinned(&registry, &signed).await.unwrap())
    );
    assert_eq!(s.cache_type.as_deref(), Some("triton"));
    assert_eq!(condition(&s, "Verified").1, "Verified");
    assert!(s.verification.as_ref().unwrap().verified);
    assert_eq!(condition(&s, "Ready").1, "NotStaged");
    for (name, why) in [
        ("unsigned", "no signature found"),
        ("wrong", "no signature by a trusted key"),
    ] {
        let s = status_where(&client, name, "refused", |s| {
            conditions::find(&s.conditions, "Verified")
                .is_some_and(|c| c.reason == "VerificationFailed")
        })
        .await;
        assert_eq!(s.usable_image(), None, "{name}");
        assert!(condition(&s, "Verified").2.contains(why), "{name}: {s:?}");
        assert_eq!(condition(&s, "Ready").0, "False");
    }

    // A signature pushed after the refusal is picked up without a restart (the refusal
    // is retried with backoff).
    sign(
        &registry,
        &pinned(&registry, &unsigned).await.unwrap(),
        late_signer,
    )
    .await
    .unwrap();
    let s = status_where(&client, "unsigned", "verified once signed", |s| {
        conditions::find(&s.conditions, "Verified").is_some_and(|c| c.reason == "Verified")
    })
    .await;
    assert!(s.usable_image().is_some());

    // A signed image that is not a kernel cache (no cache labels) is refused too.
    let (plain_signer, plain_public) = new_signer().unwrap();
    let mut plain_image = triton_cuda("90").unwrap();
    plain_image.config = kubeairunway_e2e::cache_images::config(&json!({"maintainer": "x"}));
    let plain = push(&registry, "caches/plain:v1", &plain_image)
        .await
        .unwrap();
    sign(
        &registry,
        &pinned(&registry, &plain).await.unwrap(),
        plain_signer,
    )
    .await
    .unwrap();
    apply(
        &client,
        "cache.kubeairunway.ai/v1alpha1",
        "KernelCachePolicy",
        "kernelcachepolicies",
        "default",
        json!({"spec": {"mode": "key", "publicKeys": [public.clone(), late_public.clone(), plain_public]}}),
    )
    .await;
    cache(&client, "plain", &plain).await;
    let s = status_where(&client, "plain", "not a cache", |s| {
        conditions::find(&s.conditions, "Verified").is_some_and(|c| c.reason == "NotACacheImage")
    })
    .await;
    assert_eq!(s.usable_image(), None);
    assert!(
        condition(&s, "Verified")
            .2
            .contains("not a kernel cache image"),
        "{s:?}"
    );

    // Node reports add up (an old digest's entry is ignored).
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for (node, labels) in [
        (
            "gpu-a",
            json!({"zone": "a", "kernelcache.kubeairunway.ai/ml.gone": "true"}),
        ),
        (
            "gpu-b",
            json!({"kernelcache.kubeairunway.ai/ml.signed": "true"}),
        ),
    ] {
        nodes
            .create(
                &kube::api::PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node, "labels": labels},
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    node_report(&client, "gpu-a", &[("signed", &digest, "Ready", "")]).await;
    node_report(&client, "gpu-b", &[("signed", &digest, "Staging", "")]).await;
    node_report(
        &client,
        "gpu-c",
        &[("signed", &digest, "Failed", "layer digest mismatch")],
    )
    .await;
    node_report(&client, "gpu-d", &[("signed", "sha256:0000", "Ready", "")]).await;
    let s = status_where(&client, "signed", "aggregated", |s| s.nodes.len() == 3).await;
    assert_eq!(s.ready_nodes, Some(1));
    assert_eq!(s.nodes["Ready"], ["gpu-a"]);
    assert_eq!(s.nodes["Staging"], ["gpu-b"]);
    assert_eq!(s.nodes["Failed"], ["gpu-c"]);
    let (ready, reason, message) = condition(&s, "Ready");
    assert_eq!((ready, reason), ("True", "Staged"));
    assert!(
        message.contains("gpu-c: layer digest mismatch"),
        "{message}"
    );
    // The controller sets the ready labels from the reports (the agents never write a
    // Node): on gpu-a, where the cache is Ready, and on no other; labels not its own
    // stay.
    let labels_of = |node: &'static str| {
        let nodes = nodes.clone();
        async move {
            nodes
                .get(node)
                .await
                .map(|n| n.metadata.labels.unwrap_or_default())
                .map_err(anyhow::Error::from)
        }
    };
    let a = eventually("gpu-a labelled", || async {
        let l = labels_of("gpu-a").await?;
        anyhow::ensure!(
            l.contains_key("kernelcache.kubeairunway.ai/ml.signed"),
            "{l:?}"
        );
        anyhow::ensure!(
            !l.contains_key("kernelcache.kubeairunway.ai/ml.gone"),
            "{l:?}"
        );
        Ok(l)
    })
    .await
    .unwrap();
    assert_eq!(a["kernelcache.kubeairunway.ai/ml.signed"], "true");
    assert_eq!(a["zone"], "a");
    eventually("gpu-b unlabelled (Staging)", || async {
        let l = labels_of("gpu-b").await?;
        anyhow::ensure!(l.is_empty(), "{l:?}");
        Ok(())
    })
    .await
    .unwrap();

    in_use_is_recorded_from_the_pods_on_each_node(&cluster, &client, &digest).await;

    // ModelDeployments: KernelCacheReady beside another writer's condition.
    let md = |cache: &str| {
        json!({"spec": {
            "model": {"id": "Qwen/Qwen2.5-0.5B-Instruct"}, "engine": {"type": "vllm"},
            "resources": {"gpu": {"count": 1}}, "kernelCache": {"name": cache},
        }})
    };
    apply(
        &client,
        "kubeairunway.ai/v1alpha1",
        "ModelDeployment",
        "modeldeployments",
        "uses",
        md("signed"),
    )
    .await;
    apply(
        &client,
        "kubeairunway.ai/v1alpha1",
        "ModelDeployment",
        "modeldeployments",
        "missing",
        md("nope"),
    )
    .await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), NS);
    let other = json!({
        "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "uses"},
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "DeploymentProgressing",
            "message": "written by a serving provider", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    });
    mds.patch_status(
        "uses",
        &PatchParams::apply("kaito-provider").force(),
        &Patch::Apply(&other),
    )
    .await
    .unwrap();
    let reason_of = |name: &'static str| {
        let mds = mds.clone();
        async move {
            let md = mds.get(name).await?;
            let conds = md.status.map(|s| s.conditions).unwrap_or_default();
            let c = conditions::find(&conds, KERNEL_CACHE_READY).cloned();
            anyhow::ensure!(c.is_some(), "no KernelCacheReady yet");
            Ok((c, conditions::find(&conds, "Ready").cloned()))
        }
    };
    let (kc, ready) = eventually("KernelCacheReady on uses", || reason_of("uses"))
        .await
        .unwrap();
    let kc = kc.unwrap();
    assert_eq!(
        (kc.status.as_str(), kc.reason.as_str()),
        ("True", "KernelCacheReady"),
        "{kc:?}"
    );
    assert_eq!(
        ready.map(|c| c.message),
        Some("written by a serving provider".to_string())
    );
    let (kc, _) = eventually("KernelCacheReady on missing", || reason_of("missing"))
        .await
        .unwrap();
    assert_eq!(
        kc.map(|c| c.reason),
        Some("KernelCacheNotFound".to_string())
    );
    let md = mds.get("uses").await.unwrap();
    let managers: Vec<String> = md
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| f.manager)
        .collect();
    assert!(
        managers.contains(&"kernelcache-provider".to_string()),
        "{managers:?}"
    );

    // The tag moves after pinning: reported, the verified pin stays.
    let pinned_before = s.pinned_image.clone();
    push(&registry, "caches/signed:v1", &triton_cuda("80").unwrap())
        .await
        .unwrap();
    let s = status_where(&client, "signed", "TagMoved", |s| {
        conditions::find(&s.conditions, "Resolved").is_some_and(|c| c.reason == "TagMoved")
    })
    .await;
    assert_eq!(s.pinned_image, pinned_before);
    assert!(s.usable_image().is_some());

    // Disabled policy: usable, and visibly unverified.
    apply(
        &client,
        "cache.kubeairunway.ai/v1alpha1",
        "KernelCachePolicy",
        "kernelcachepolicies",
        "default",
        json!({"spec": {"mode": "disabled"}}),
    )
    .await;
    let s = status_where(&client, "unsigned", "disabled", |s| {
        conditions::find(&s.conditions, "Verified")
            .is_some_and(|c| c.reason == "VerificationDisabled")
    })
    .await;
    let v = s.verification.clone().unwrap();
    assert_eq!((v.mode, v.verified), (VerificationMode::Disabled, false));
    assert!(s.usable_image().is_some());

    // The deleted cache's credentials were taken back.
    eventually("the handed-over credentials removed", || async {
        anyhow::ensure!(handed.get_opt(&name).await?.is_none(), "still there");
        Ok(())
    })
    .await
    .unwrap();

    // The capability registration: no engines, never selected to serve.
    let ipc: InferenceProviderConfig = Api::all(client.clone()).get("kernelcache").await.unwrap();
    let caps = ipc.spec.capabilities.unwrap();
    assert!(caps.engines.is_empty());
    assert_eq!(caps.features, ["kernelCache"]);
    // Its spec is applied once; each heartbeat (every 2 s here) applies the status alone.
    // Counted from the API server's audit log: nothing else here writes that object.
    let registrations = |subresource: Option<&str>| -> anyhow::Result<usize> {
        Ok(cluster
            .audit_events()?
            .iter()
            .filter(|e| e.stage == "ResponseComplete" && e.verb == "patch")
            .filter_map(|e| e.object_ref.as_ref())
            .filter(|o| o.resource == "inferenceproviderconfigs")
            .filter(|o| o.name.as_deref() == Some("kernelcache"))
            .filter(|o| o.subresource.as_deref() == subresource)
            .count())
    };
    eventually("three heartbeats", || async {
        let beats = registrations(Some("status"))?;
        anyhow::ensure!(beats >= 3, "{beats} so far");
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(registrations(None).unwrap(), 1, "the spec applied once");
    // Deleted, it is registered again at the next heartbeat.
    let configs: Api<InferenceProviderConfig> = Api::all(client.clone());
    configs
        .delete("kernelcache", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually("registered again", || async {
        let ipc = configs.get_opt("kernelcache").await?;
        let caps = ipc.and_then(|c| c.spec.capabilities);
        anyhow::ensure!(
            caps.is_some_and(|c| c.features == ["kernelCache"]),
            "not yet"
        );
        Ok(())
    })
    .await
    .unwrap();

    let _ = stop.send(());
    task.await.unwrap().unwrap();

    // Its chart grants it its own InferenceProviderConfig only: another provider's, and a
    // new one under another name, are refused (403) to its service account.
    if let Some(identity) = identity {
        identity.assert_none_refused();
        let config = |name: &str| {
            json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "InferenceProviderConfig",
                   "metadata": {"name": name},
                   "spec": {"capabilities": {"features": ["kernelCache"]}}})
        };
        configs
            .patch(
                "kaito",
                &PatchParams::apply("test"),
                &Patch::Apply(&config("kaito")),
            )
            .await
            .unwrap();
        let as_controller: Api<InferenceProviderConfig> = Api::all(controller_client.clone());
        let pp =
            PatchParams::apply(kubeairunway_kernelcache_api::names::PROVIDER_FIELD_MANAGER).force();
        let forbidden = |r: kube::Result<InferenceProviderConfig>| {
            assert!(
                matches!(&r, Err(kube::Error::Api(s)) if s.code == 403),
                "{r:?}"
            );
        };
        forbidden(
            as_controller
                .patch("kaito", &pp, &Patch::Apply(&config("kaito")))
                .await,
        );
        forbidden(
            as_controller
                .patch_status(
                    "kaito",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"ready": false}})),
                )
                .await,
        );
        forbidden(
            as_controller
                .patch("impostor", &pp, &Patch::Apply(&config("impostor")))
                .await,
        );
        identity.expect_refusals();
    }
}

/// The kernel-cache chart: lints, ships the generated CRDs, and gives the controller, the
/// agent and the webhook least-privilege RBAC of their own.
#[test]
fn chart_lints_and_renders_the_controller_the_agent_and_the_webhook() {
    use kubeairunway_e2e::helm;
    let Some(helm_bin) = helm::require() else {
        return;
    };
    let chart = helm::chart("kernelcache-provider");
    helm::lint(&helm_bin, &chart).unwrap();
    let objects = helm::template(&helm_bin, &chart, &[("image.tag", "v1")]).unwrap();
    let crds: Vec<&str> = helm::of_kind(&objects, "CustomResourceDefinition")
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        crds.len(),
        kubeairunway_kernelcache_api::crds().len(),
        "{crds:?}"
    );
    let deployment = helm::of_kind(&objects, "Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "release-kernelcache-provider-controller")
        .expect("the controller Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "ghcr.io/kubeairunway/kubeairunway:v1");
    assert_eq!(container["command"], json!(["/kernelcache-controller"]));
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--policy=default"), "{args:?}");
    assert!(args.contains(&"--leader-elect=true"), "{args:?}");
    assert_eq!(helm::of_kind(&objects, "DaemonSet").len(), 1);

    // The agent parses untrusted layers and JSON as a non-root user with nothing extra;
    // the only root part of its pod is an init container that may chown and nothing else,
    // run on the two cache roots.
    let agent_pod = &helm::of_kind(&objects, "DaemonSet")[0]["spec"]["template"]["spec"];
    assert_eq!(
        agent_pod["securityContext"],
        json!({"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": true,
               "seccompProfile": {"type": "RuntimeDefault"}})
    );
    assert_eq!(
        agent_pod["containers"][0]["securityContext"],
        json!({"privileged": false, "allowPrivilegeEscalation": false,
               "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}})
    );
    let init = agent_pod["initContainers"].as_array().unwrap();
    assert_eq!(init.len(), 1);
    assert_eq!(init[0]["command"], json!(["/kernelcache-own-roots"]));
    assert_eq!(
        init[0]["args"],
        json!([
            "--uid=65532",
            "--gid=65532",
            "/var/lib/kubeairunway/kernel-caches",
            "/var/lib/kubeairunway/model-caches"
        ])
    );
    assert_eq!(
        init[0]["securityContext"],
        json!({"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false, "privileged": false,
               "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
               "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}})
    );
    let mounts: Vec<&Value> = init[0]["volumeMounts"].as_array().unwrap().iter().collect();
    assert_eq!(
        mounts,
        agent_pod["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["name"] != "gpu-inventory")
            .collect::<Vec<_>>(),
        "the cache roots, nothing else"
    );
    // An operator who runs the agent as root gets no init container.
    let as_root = helm::template(
        &helm_bin,
        &chart,
        &[
            ("agent.podSecurityContext.runAsUser", "0"),
            ("agent.podSecurityContext.runAsNonRoot", "false"),
        ],
    )
    .unwrap();
    assert!(
        helm::of_kind(&as_root, "DaemonSet")[0]["spec"]["template"]["spec"]["initContainers"]
            .is_null()
    );

    let role = |name: &str| {
        helm::of_kind(&objects, "ClusterRole")
            .into_iter()
            .find(|r| r["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("ClusterRole {name}"))
            .clone()
    };
    let controller = role("release-kernelcache-provider-controller");
    let text = serde_json::to_string(&controller).unwrap();
    assert!(!text.contains('*'), "no wildcards: {text}");
    // Only the controller writes KernelCache status; it never writes nodes or specs.
    let writes =
        |rules: &Value, resource: &str| {
            rules
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| {
                    r["resources"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|x| x == resource)
                })
                .any(|r| {
                    r["verbs"].as_array().unwrap().iter().any(|v| {
                        ["create", "update", "patch", "delete"].contains(&v.as_str().unwrap())
                    })
                })
        };
    assert!(writes(&controller["rules"], "kernelcaches/status"));
    assert!(!writes(&controller["rules"], "kernelcaches"));
    // Of the agents' reports, only spec.inUse and spec.modelDownloads (the chart's policy
    // below), never status.
    assert!(writes(&controller["rules"], "kernelcachenodes"));
    assert!(!writes(&controller["rules"], "kernelcachenodes/status"));
    assert!(
        helm::of_kind(&objects, "ValidatingAdmissionPolicy")
            .iter()
            .any(|p| p["metadata"]["name"] == "release-kernelcache-provider-node-reports"),
        "a policy keeps the controller's report writes to spec.inUse and spec.modelDownloads"
    );
    assert!(writes(&controller["rules"], "modeldeployments/status"));
    assert!(!writes(&controller["rules"], "modeldeployments"));
    // The webhook: never in the way of a pod, only for serving pods, only its own CA.
    let hooks = helm::of_kind(&objects, "MutatingWebhookConfiguration");
    assert_eq!(hooks.len(), 1);
    let hook = &hooks[0]["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["clientConfig"]["service"]["path"], "/mutate-pod");
    assert_eq!(
        hook["objectSelector"]["matchExpressions"][0],
        json!({"key": "kubeairunway.ai/model-deployment", "operator": "Exists"})
    );
    assert_eq!(hook["rules"][0]["operations"], json!(["CREATE"]));
    let webhook = role("release-kernelcache-provider-webhook");
    assert!(!writes(&webhook["rules"], "modeldeployments"));
    assert!(!writes(&webhook["rules"], "kernelcaches"));
    assert!(
        webhook["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resourceNames"] == json!(["release-kernelcache-provider-webhook"]))
    );
    let seed_image = helm::of_kind(&objects, "Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "release-kernelcache-provider-webhook")
        .expect("the webhook Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "--seed-image=ghcr.io/kubeairunway/kubeairunway:v1");
    assert!(seed_image, "the seed image defaults to the chart's image");
    assert_eq!(helm::of_kind(&objects, "PodDisruptionBudget").len(), 1);
    let agent = role("release-kernelcache-provider-agent");
    assert!(!writes(&agent["rules"], "kernelcaches/status"));
    assert!(writes(&agent["rules"], "kernelcachenodes/status"));
}
