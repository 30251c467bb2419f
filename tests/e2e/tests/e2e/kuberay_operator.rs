//! Unit tests of the KubeRay stand-in (`kubeairunway_e2e::operators::kuberay`): each rule
//! as the upstream source cited there has it. No cluster is needed.

use kubeairunway_e2e::operators::kuberay::{
    self as ray, Action, App, Clusters, FINALIZER, KubeRay, Refusal, is_dns1035_label,
    ray_cluster_name, reconcile, serve_service_name, validate, webhook,
};
use serde_json::{Value, json};

const NOW: &str = "2026-01-01T00:00:00Z";

/// A RayService as the KubeRay provider renders it, trimmed to what the rules read.
fn rayservice(name: &str) -> Value {
    json!({
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": name, "namespace": "ns", "generation": 1},
        "spec": {
            "serveConfigV2": "applications: []\n",
            "rayClusterConfig": {
                "rayVersion": "2.52.0",
                "headGroupSpec": {
                    "rayStartParams": {"num-gpus": "0"},
                    "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray-llm:2.52.0-py311-cu128"}]}},
                },
                "workerGroupSpecs": [{
                    "groupName": "gpu-workers", "replicas": 2, "minReplicas": 2, "maxReplicas": 2,
                    "rayStartParams": {"num-gpus": "1"},
                    "template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray-llm:2.52.0-py311-cu128"}]}},
                }],
            },
        },
    })
}

/// Apply what one reconcile did, as the API server would.
fn apply(rs: &mut Value, action: &Action) {
    match action {
        Action::AddFinalizer => rs["metadata"]["finalizers"] = json!([FINALIZER]),
        Action::RemoveFinalizer => rs["metadata"]["finalizers"] = json!([]),
        Action::WriteStatus(status) => rs["status"] = status.clone(),
        Action::Nothing => {}
    }
}

/// Reconcile until nothing changes; the last reconcile's events.
fn settle(version: KubeRay, rs: &mut Value, clusters: &mut Clusters) -> Vec<String> {
    let mut events = Vec::new();
    for _ in 0..10 {
        let r = reconcile(version, rs, clusters, NOW);
        events.extend(r.events);
        if r.action == Action::Nothing {
            return events;
        }
        apply(rs, &r.action);
    }
    panic!("the stand-in does not settle: {rs}");
}

fn report(clusters: &mut Clusters, status: &str, message: &str, ready_workers: i64) {
    let cluster = clusters.newest_mut().expect("a cluster to report on");
    cluster.serve = Some([("llm".to_string(), App::new(status, message))].into());
    cluster.ready_workers = ready_workers;
}

fn condition<'a>(rs: &'a Value, type_: &str) -> &'a Value {
    rs["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

fn reason(rs: &Value, type_: &str) -> (String, String) {
    let c = condition(rs, type_);
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["reason"].as_str().unwrap_or_default().to_string(),
    )
}

fn pair(status: &str, reason: &str) -> (String, String) {
    (status.to_string(), reason.to_string())
}

#[test]
fn operator_cluster_and_serve_service_names_follow_each_release() {
    // util.go:312-314@v1.3.0, util.go:369-371@v1.7.0
    assert_eq!(
        ray_cluster_name(KubeRay::V1_3_0, "llama", "ab1cd"),
        "llama-raycluster-ab1cd"
    );
    assert_eq!(
        ray_cluster_name(KubeRay::V1_7_0, "llama", "ab1cd"),
        "llama-ab1cd"
    );
    // util.go:292-294 + CheckName util.go:184-206@v1.3.0: the front is cut beyond 50.
    assert_eq!(
        serve_service_name(KubeRay::V1_3_0, "llama"),
        "llama-serve-svc"
    );
    let long = "a-model-deployment-name-of-forty-seven-chars-xy";
    assert_eq!(long.len(), 47);
    let full = format!("{long}-serve-svc");
    let cut = serve_service_name(KubeRay::V1_3_0, long);
    assert_eq!(cut.len(), 50);
    // The last 50 characters start with '-' here, which becomes 'r'.
    assert!(full[full.len() - 50..].starts_with('-'));
    assert_eq!(cut, format!("r{}", &full[full.len() - 49..]));
    // So does a leading digit.
    let digit = format!("abcdefg1{}", "y".repeat(39));
    assert_eq!(
        serve_service_name(KubeRay::V1_3_0, &digit),
        format!("r{}-serve-svc", "y".repeat(39))
    );
    assert_eq!(
        serve_service_name(KubeRay::V1_7_0, long),
        format!("{long}-serve-svc")
    );
}

#[test]
fn operator_webhook_checks_only_the_name_and_only_in_1_7() {
    // rayservice_webhook.go:49-63@v1.7.0 -> ValidateRayServiceMetadata validation.go:632-646
    let ok = rayservice(&"a".repeat(47));
    assert_eq!(webhook(KubeRay::V1_7_0, &ok), Ok(()));
    let long = rayservice(&"a".repeat(48));
    let refused = webhook(KubeRay::V1_7_0, &long).unwrap_err();
    assert!(refused.contains("no more than 47 characters"), "{refused}");
    for bad in ["1llama", "llama.v2", "llama-"] {
        assert!(webhook(KubeRay::V1_7_0, &rayservice(bad)).is_err(), "{bad}");
        assert!(!is_dns1035_label(bad));
    }
    // v1.3.0 has no RayService webhook.
    assert_eq!(webhook(KubeRay::V1_3_0, &long), Ok(()));
}

#[test]
fn operator_validation_surfaces_where_each_release_reports_it() {
    let mut labels = rayservice("llama");
    labels["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["labels"] = json!("a=b");
    // validation.go:72-75@v1.7.0, reported as Ready=False ValidationFailed.
    assert_eq!(
        validate(KubeRay::V1_7_0, &labels),
        Err(Refusal::ValidationFailed(
            "The RayService spec is invalid: rayStartParams['labels'] is not supported for Head group; please use the top-level Labels field instead".into()
        ))
    );
    // v1.3.0 has no such rule.
    assert_eq!(validate(KubeRay::V1_3_0, &labels), Ok(()));

    let mut redis_user = rayservice("llama");
    redis_user["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        ["env"] = json!([{"name": "REDIS_USERNAME", "value": "u"}]);
    // validation.go:69-72@v1.3.0: the RayCluster controller refuses the cluster.
    let refusal = validate(KubeRay::V1_3_0, &redis_user).unwrap_err();
    assert!(matches!(refusal, Refusal::ClusterEvent(_)), "{refusal:?}");
    assert!(refusal.message().starts_with("cannot set redis username"));
    assert!(matches!(
        validate(KubeRay::V1_7_0, &redis_user),
        Err(Refusal::ValidationFailed(_))
    ));

    let mut redis_address = rayservice("llama");
    redis_address["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
        [0]["env"] = json!([{"name": "RAY_REDIS_ADDRESS", "value": "redis:6379"}]);
    for version in [KubeRay::V1_3_0, KubeRay::V1_7_0] {
        assert!(
            validate(version, &redis_address)
                .unwrap_err()
                .message()
                .contains("RAY_REDIS_ADDRESS is set"),
            "{version:?}"
        );
    }

    let mut strategy = rayservice("llama");
    strategy["spec"]["upgradeStrategy"] = json!({"type": "Rolling"});
    // validation.go:158-164@v1.3.0: a RayService rule, an event only.
    assert!(matches!(
        validate(KubeRay::V1_3_0, &strategy),
        Err(Refusal::ServiceEvent(_))
    ));

    let mut bounds = rayservice("llama");
    bounds["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["minReplicas"] = json!(3);
    // validation.go:134-137@v1.7.0
    assert!(
        validate(KubeRay::V1_7_0, &bounds)
            .unwrap_err()
            .message()
            .contains("has minReplicas 3 greater than maxReplicas 2")
    );
    let mut unbounded = rayservice("llama");
    unbounded["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
        .as_object_mut()
        .unwrap()
        .remove("maxReplicas");
    assert!(
        validate(KubeRay::V1_7_0, &unbounded)
            .unwrap_err()
            .message()
            .contains("must set both minReplicas and maxReplicas")
    );
    unbounded["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] = json!(true);
    assert_eq!(validate(KubeRay::V1_7_0, &unbounded), Ok(()));

    let mut autoscaler_v2 = rayservice("llama");
    autoscaler_v2["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
        [0]["env"] = json!([{"name": "RAY_enable_autoscaler_v2", "value": "1"}]);
    // validation.go:205-212@v1.7.0
    assert!(validate(KubeRay::V1_7_0, &autoscaler_v2).is_err());
    assert_eq!(validate(KubeRay::V1_3_0, &autoscaler_v2), Ok(()));

    // A name v1.7.0 refuses fails the RayService there (validateRayService checks the
    // metadata first).
    assert!(matches!(
        validate(KubeRay::V1_7_0, &rayservice(&"a".repeat(48))),
        Err(Refusal::ValidationFailed(m)) if m.contains("no more than 47")
    ));
}

/// As upstream has it, a first deployment keeps its application
/// statuses in `pendingServiceStatus` (rayservice_controller.go:243-244 and 151-156@v1.3.0,
/// :666-668@v1.7.0); the Services never switch to a cluster whose applications are not
/// all RUNNING (:168-187@v1.3.0), so nothing is promoted to `activeServiceStatus`.
#[test]
fn operator_first_deployment_failure_stays_in_the_pending_slot() {
    for version in [KubeRay::V1_3_0, KubeRay::V1_7_0] {
        let mut rs = rayservice("llama");
        let mut clusters = Clusters::default();
        settle(version, &mut rs, &mut clusters);
        if version == KubeRay::V1_7_0 {
            assert_eq!(rs["metadata"]["finalizers"], json!([FINALIZER]));
        }
        let pending = rs["status"]["pendingServiceStatus"]["rayClusterName"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            pending.starts_with(&ray_cluster_name(version, "llama", "")),
            "{pending}"
        );
        assert_eq!(reason(&rs, "Ready"), pair("False", "Initializing"));
        assert_eq!(
            reason(&rs, "UpgradeInProgress"),
            pair("False", "Initializing")
        );

        report(&mut clusters, "DEPLOYING", "", 0);
        settle(version, &mut rs, &mut clusters);
        report(&mut clusters, "DEPLOY_FAILED", "CUDA out of memory", 2);
        settle(version, &mut rs, &mut clusters);
        let status = &rs["status"];
        assert_eq!(
            status["pendingServiceStatus"]["applicationStatuses"]["llm"],
            json!({"status": "DEPLOY_FAILED", "message": "CUDA out of memory"}),
            "{version:?}"
        );
        assert!(status["activeServiceStatus"]["applicationStatuses"].is_null());
        assert!(
            status["activeServiceStatus"]
                .get("rayClusterName")
                .is_none()
        );
        assert_eq!(reason(&rs, "Ready"), pair("False", "Initializing"));
        assert!(status.get("serviceStatus").is_none());
        assert_eq!(
            status["pendingServiceStatus"]["rayClusterStatus"]["readyWorkerReplicas"],
            2
        );
    }
}

#[test]
fn operator_first_deployment_success_is_promoted_to_the_active_slot() {
    for version in [KubeRay::V1_3_0, KubeRay::V1_7_0] {
        let mut rs = rayservice("llama");
        let mut clusters = Clusters::default();
        settle(version, &mut rs, &mut clusters);
        let cluster = rs["status"]["pendingServiceStatus"]["rayClusterName"].clone();
        report(&mut clusters, "RUNNING", "", 2);
        settle(version, &mut rs, &mut clusters);
        let status = &rs["status"];
        assert_eq!(status["activeServiceStatus"]["rayClusterName"], cluster);
        assert_eq!(
            status["activeServiceStatus"]["applicationStatuses"]["llm"]["status"],
            "RUNNING"
        );
        assert_eq!(
            status["pendingServiceStatus"],
            json!({"rayClusterStatus": {}})
        );
        assert_eq!(reason(&rs, "Ready"), pair("True", "NonZeroServeEndpoints"));
        assert_eq!(
            reason(&rs, "UpgradeInProgress"),
            pair("False", "NoPendingCluster")
        );
        assert_eq!(status["serviceStatus"], "Running");
        assert_eq!(status["numServeEndpoints"], 3);
        assert_eq!(status["observedGeneration"], 1);
    }
}

#[test]
fn operator_cluster_changes_are_zero_downtime_upgrades_and_replica_counts_never_reach_the_cluster()
{
    let version = KubeRay::V1_7_0;
    let mut rs = rayservice("llama");
    let mut clusters = Clusters::default();
    settle(version, &mut rs, &mut clusters);
    report(&mut clusters, "RUNNING", "", 2);
    settle(version, &mut rs, &mut clusters);
    let first = rs["status"]["activeServiceStatus"]["rayClusterName"].clone();

    // Replica counts alone: no new cluster, and the cluster keeps its size
    // (generateHashWithoutReplicasAndWorkersToDelete, rayservice_controller.go:1098-1111@v1.3.0).
    for key in ["replicas", "minReplicas", "maxReplicas"] {
        rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0][key] = json!(4);
    }
    rs["metadata"]["generation"] = json!(2);
    settle(version, &mut rs, &mut clusters);
    assert_eq!(rs["status"]["activeServiceStatus"]["rayClusterName"], first);
    assert_eq!(
        reason(&rs, "UpgradeInProgress"),
        pair("False", "NoPendingCluster")
    );
    assert_eq!(clusters.active.as_ref().unwrap().desired_workers, 2);

    // Anything else in the cluster spec: a pending cluster beside the active one.
    rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] =
        json!("rayproject/ray-llm:2.53.0-py311-cu128");
    rs["metadata"]["generation"] = json!(3);
    settle(version, &mut rs, &mut clusters);
    assert_eq!(
        reason(&rs, "UpgradeInProgress"),
        pair("True", "BothActivePendingClustersExist")
    );
    assert_eq!(reason(&rs, "Ready"), pair("True", "NonZeroServeEndpoints"));
    // The active cluster's applications are not reported while a pending one exists.
    assert!(rs["status"]["activeServiceStatus"]["applicationStatuses"].is_null());
    report(&mut clusters, "DEPLOY_FAILED", "bad image", 0);
    settle(version, &mut rs, &mut clusters);
    assert_eq!(
        rs["status"]["pendingServiceStatus"]["applicationStatuses"]["llm"]["status"],
        "DEPLOY_FAILED"
    );
    assert_eq!(rs["status"]["activeServiceStatus"]["rayClusterName"], first);
    assert_eq!(rs["status"]["serviceStatus"], "Running");
    report(&mut clusters, "RUNNING", "", 4);
    settle(version, &mut rs, &mut clusters);
    assert_ne!(rs["status"]["activeServiceStatus"]["rayClusterName"], first);
    assert_eq!(
        reason(&rs, "UpgradeInProgress"),
        pair("False", "NoPendingCluster")
    );
    assert_eq!(clusters.active.as_ref().unwrap().desired_workers, 4);
}

#[test]
fn operator_1_3_refused_cluster_never_starts_and_1_7_fails_the_service() {
    let mut bad = rayservice("llama");
    bad["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["redis-username"] =
        json!("u");

    let mut rs = bad.clone();
    let mut clusters = Clusters::default();
    let events = settle(KubeRay::V1_3_0, &mut rs, &mut clusters);
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("InvalidRayClusterSpec:")),
        "{events:?}"
    );
    report(&mut clusters, "RUNNING", "", 2);
    settle(KubeRay::V1_3_0, &mut rs, &mut clusters);
    assert_eq!(reason(&rs, "Ready"), pair("False", "Initializing"));
    assert!(rs["status"]["pendingServiceStatus"]["applicationStatuses"].is_null());

    let mut rs = bad;
    let mut clusters = Clusters::default();
    settle(KubeRay::V1_7_0, &mut rs, &mut clusters);
    assert_eq!(reason(&rs, "Ready"), pair("False", "ValidationFailed"));
    assert!(
        condition(&rs, "Ready")["message"]
            .as_str()
            .unwrap()
            .starts_with("The RayService spec is invalid: cannot set redis username")
    );
    assert!(clusters.pending.is_none() && clusters.active.is_none());
}

#[test]
fn operator_1_7_releases_its_finalizer_on_deletion() {
    let mut rs = rayservice("llama");
    let mut clusters = Clusters::default();
    settle(KubeRay::V1_7_0, &mut rs, &mut clusters);
    rs["metadata"]["deletionTimestamp"] = json!(NOW);
    let r = reconcile(KubeRay::V1_7_0, &rs, &mut clusters, NOW);
    assert_eq!(r.action, Action::RemoveFinalizer);
    assert_eq!(clusters, Clusters::default());
    let mut old = rayservice("llama");
    old["metadata"]["deletionTimestamp"] = json!(NOW);
    assert_eq!(
        reconcile(KubeRay::V1_3_0, &old, &mut Clusters::default(), NOW).action,
        Action::Nothing
    );
}

#[test]
fn operator_1_7_checks_the_initializing_timeout_annotation() {
    // validateInitializingTimeout, validation.go:648-678@v1.7.0
    let with = |value: &str| {
        let mut rs = rayservice("llama");
        rs["metadata"]["annotations"] = json!({ray::INITIALIZING_TIMEOUT: value});
        rs
    };
    for ok in ["5m", "1h30m", "90", "1.5h", ""] {
        assert_eq!(webhook(KubeRay::V1_7_0, &with(ok)), Ok(()), "{ok}");
    }
    for bad in ["soon", "0", "-5m", "5 m", "-3"] {
        assert!(webhook(KubeRay::V1_7_0, &with(bad)).is_err(), "{bad}");
        assert!(
            matches!(
                validate(KubeRay::V1_7_0, &with(bad)),
                Err(Refusal::ValidationFailed(_))
            ),
            "{bad}"
        );
        assert_eq!(validate(KubeRay::V1_3_0, &with(bad)), Ok(()), "{bad}");
    }
}
