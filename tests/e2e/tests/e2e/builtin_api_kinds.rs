//! The built-in kinds the test server serves for the next features (`tests/cluster`),
//! each checked against what kube-apiserver does with it: StatefulSets and ReplicaSets,
//! PersistentVolumeClaims and PersistentVolumes, the four RBAC kinds, autoscaling/v2
//! HorizontalPodAutoscalers and policy/v1 PodDisruptionBudgets. For each: create (the
//! status sent is dropped where kube's strategy drops it, `metadata.generation` where kube
//! counts it), the status subresource (it writes the status and nothing else; a write of
//! the main resource never changes the status), server-side apply by two field managers
//! (lists merge by their real keys or are atomic, as the k8s.io/api types declare), and a
//! watch that sees each change.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::discovery::ApiResource;
use kubeairunway_testcluster::{TestCluster, shared};
use serde_json::{Value, json};

/// One served kind and how to exercise it.
struct Served {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    /// The object's content beside `metadata` (its spec, or rules, subjects, ...).
    body: Value,
    /// A status to send on create and to write through the status subresource; `None`
    /// for a kind without status.
    status: Option<Value>,
    /// Whether kube counts spec changes in `metadata.generation`.
    generation: bool,
    /// Two managers' server-side applies (content beside `metadata`) and a check of the
    /// merged object.
    first: Value,
    second: Value,
    merged: fn(&Value),
    /// A field path of `first` that `second` takes over only with force (a conflict).
    conflicting: Value,
}

impl Served {
    fn resource(&self) -> ApiResource {
        let api_version = if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        };
        ApiResource {
            group: self.group.into(),
            version: self.version.into(),
            api_version,
            kind: self.kind.into(),
            plural: self.plural.into(),
        }
    }

    fn api(&self, client: &Client, ns: &str) -> Api<DynamicObject> {
        if self.namespaced {
            Api::namespaced_with(client.clone(), ns, &self.resource())
        } else {
            Api::all_with(client.clone(), &self.resource())
        }
    }

    fn manifest(&self, name: &str, ns: &str, content: &Value) -> Value {
        let mut m = json!({"apiVersion": self.resource().api_version, "kind": self.kind,
            "metadata": {"name": name, "labels": {"test-run": ns}}});
        if self.namespaced {
            m["metadata"]["namespace"] = json!(ns);
        }
        merge(&mut m, content);
        m
    }
}

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(e) => *e,
        other => panic!("expected an API error, got {other}"),
    }
}

fn pod_template(container: &str) -> Value {
    json!({"metadata": {"labels": {"app": "w"}},
        "spec": {"containers": [{"name": container, "image": "busybox:1"}]}})
}

/// Container names of a workload's pod template.
fn containers(o: &Value) -> Vec<String> {
    o["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect()
}

async fn next_event(
    watch: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<DynamicObject>>> + Unpin),
    name: &str,
) -> WatchEvent<DynamicObject> {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(20), watch.try_next())
            .await
            .expect("a watch event in time")
            .expect("a watch event")
            .expect("the watch open");
        let of = match &event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                o.metadata.name.clone()
            }
            _ => None,
        };
        if of.as_deref() == Some(name) {
            return event;
        }
    }
}

/// Create, status, apply and watch of `kind` on the shared cluster.
async fn exercise(kind: Served) {
    let cluster: &TestCluster = shared();
    let client = cluster.client().await.unwrap();
    let ns = cluster.namespace(&format!("kinds-{}", kind.plural));
    let api = kind.api(&client, &ns);
    let name = if kind.namespaced {
        "obj".to_string()
    } else {
        format!("{ns}-obj")
    };
    let pp = PostParams::default();

    // A watch opened before the object exists (a cluster-scoped kind: by this test's label).
    let lp = ListParams::default().labels(&format!("test-run={ns}"));
    let rv = api
        .list_metadata(&lp)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watch = api
        .watch(
            &WatchParams::default().labels(&format!("test-run={ns}")),
            &rv,
        )
        .await
        .unwrap()
        .boxed();

    // Create: the status sent is dropped (a PersistentVolume starts Pending).
    let mut body = kind.manifest(&name, &ns, &kind.body);
    if let Some(status) = &kind.status {
        body["status"] = status.clone();
    }
    let created = api
        .create(&pp, &serde_json::from_value(body).unwrap())
        .await
        .unwrap();
    let status = created.data.get("status").cloned().unwrap_or(Value::Null);
    if kind.kind == "PersistentVolume" {
        assert_eq!(status["phase"], "Pending", "{status}");
        assert!(status["lastPhaseTransitionTime"].is_string(), "{status}");
    } else if let Some(sent) = &kind.status {
        // Dropped: the zero status (whose fields without omitempty still show, as zeros).
        for (field, value) in sent.as_object().unwrap() {
            assert_ne!(
                status.get(field),
                Some(value),
                "{}: the status sent on create is dropped, got {status}",
                kind.kind
            );
        }
    }
    assert_eq!(
        created.metadata.generation,
        kind.generation.then_some(1),
        "{}: metadata.generation on create",
        kind.kind
    );
    assert!(matches!(
        next_event(&mut watch, &name).await,
        WatchEvent::Added(_)
    ));

    // The status subresource writes the status and nothing else; the main resource never
    // writes the status.
    if let Some(status) = &kind.status {
        // With a spec change beside it, which the subresource drops.
        let mut write = json!({"status": status});
        merge(&mut write, &kind.conflicting);
        let written = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&write))
            .await
            .unwrap();
        assert!(
            contains(&written.data["status"], status),
            "{}: the status written: {} in {}",
            kind.kind,
            status,
            written.data["status"]
        );
        assert_eq!(
            written.data.get("spec"),
            created.data.get("spec"),
            "{}: the status subresource must not change the spec",
            kind.kind
        );
        assert_eq!(written.metadata.generation, created.metadata.generation);
        match next_event(&mut watch, &name).await {
            WatchEvent::Modified(o) => assert_eq!(o.data["status"], written.data["status"]),
            other => panic!("{}: expected Modified, got {other:?}", kind.kind),
        }
        let relabelled = api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}, "status": {}})),
            )
            .await
            .unwrap();
        assert_eq!(
            relabelled.data["status"], written.data["status"],
            "{}: a write of the main resource keeps the status",
            kind.kind
        );
        assert!(matches!(
            next_event(&mut watch, &name).await,
            WatchEvent::Modified(_)
        ));
    }

    // Server-side apply by two managers onto an object of their own.
    let applied = format!("{name}-applied");
    let first = kind.manifest(&applied, &ns, &kind.first);
    let second = kind.manifest(&applied, &ns, &kind.second);
    api.patch(
        &applied,
        &PatchParams::apply("first"),
        &Patch::Apply(&first),
    )
    .await
    .unwrap();
    let merged = api
        .patch(
            &applied,
            &PatchParams::apply("second"),
            &Patch::Apply(&second),
        )
        .await
        .unwrap();
    (kind.merged)(&serde_json::to_value(&merged).unwrap());
    let managers: Vec<_> = merged
        .metadata
        .managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.contains(&"first".to_string()) && managers.contains(&"second".to_string()),
        "{}: {managers:?}",
        kind.kind
    );
    let mut conflicting = second.clone();
    merge(&mut conflicting, &kind.conflicting);
    let err = api
        .patch(
            &applied,
            &PatchParams::apply("second"),
            &Patch::Apply(&conflicting),
        )
        .await
        .unwrap_err();
    assert_eq!(
        api_error(err).code,
        409,
        "{}: {} is owned by `first`",
        kind.kind,
        kind.conflicting
    );
    // Forced, it takes the field over; a spec change counts in the generation.
    let changed = api
        .patch(
            &applied,
            &PatchParams::apply("second").force(),
            &Patch::Apply(&conflicting),
        )
        .await
        .unwrap();
    assert!(
        contains(&serde_json::to_value(&changed).unwrap(), &kind.conflicting),
        "{}: {} taken over: {:?}",
        kind.kind,
        kind.conflicting,
        changed.data
    );
    assert_eq!(
        changed.metadata.generation,
        merged
            .metadata
            .generation
            .map(|g| g + i64::from(kind.conflicting.get("spec").is_some())),
        "{}: a spec change bumps the generation",
        kind.kind
    );

    // Deletion, as the watch sees it.
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    loop {
        if let WatchEvent::Deleted(_) = next_event(&mut watch, &name).await {
            break;
        }
    }
    if !kind.namespaced {
        api.delete(&applied, &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// Whether every field of `expected` is in `actual` with the same value (lists element by
/// element), whatever else `actual` holds.
fn contains(actual: &Value, expected: &Value) -> bool {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => e
            .iter()
            .all(|(k, v)| a.get(k).is_some_and(|av| contains(av, v))),
        (Value::Array(a), Value::Array(e)) => {
            a.len() == e.len() && a.iter().zip(e).all(|(av, ev)| contains(av, ev))
        }
        (a, e) => a == e,
    }
}

/// Merge the object `patch` into `into` (JSON merge patch semantics, without deletion).
fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

fn labels(o: &Value) -> Vec<String> {
    let mut l: Vec<String> = o["metadata"]["labels"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    l.sort();
    l
}

fn workload(kind: &'static str, plural: &'static str, extra: &Value) -> Served {
    let spec = |container: &str| {
        let mut s =
            json!({"selector": {"matchLabels": {"app": "w"}}, "template": pod_template(container)});
        merge(&mut s, extra);
        s
    };
    Served {
        group: "apps",
        version: "v1",
        kind,
        plural,
        namespaced: true,
        body: json!({"spec": spec("main")}),
        status: Some(json!({"replicas": 2, "readyReplicas": 1, "observedGeneration": 1})),
        generation: true,
        // Containers merge by name: each manager owns its own.
        first: json!({"spec": spec("main")}),
        second: json!({"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "busybox:1"}]}}}}),
        merged: |o| assert_eq!(containers(o), ["main", "sidecar"], "{o}"),
        conflicting: json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}}}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulsets() {
    exercise(workload(
        "StatefulSet",
        "statefulsets",
        &json!({"serviceName": "w"}),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicasets() {
    exercise(workload("ReplicaSet", "replicasets", &json!({}))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistentvolumeclaims() {
    let spec =
        json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}});
    exercise(Served {
        group: "",
        version: "v1",
        kind: "PersistentVolumeClaim",
        plural: "persistentvolumeclaims",
        namespaced: true,
        body: json!({"spec": spec}),
        status: Some(json!({"phase": "Bound", "capacity": {"storage": "1Gi"}})),
        generation: false,
        // The resource maps are granular: each manager owns its own key.
        first: json!({"spec": spec}),
        second: json!({"spec": {"resources": {"limits": {"storage": "2Gi"}}}}),
        merged: |o| {
            assert_eq!(o["spec"]["resources"]["requests"]["storage"], "1Gi", "{o}");
            assert_eq!(o["spec"]["resources"]["limits"]["storage"], "2Gi", "{o}");
        },
        conflicting: json!({"spec": {"resources": {"requests": {"storage": "5Gi"}}}}),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistentvolumes() {
    let spec = json!({"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
        "hostPath": {"path": "/mnt/models"}, "storageClassName": "local"});
    exercise(Served {
        group: "",
        version: "v1",
        kind: "PersistentVolume",
        plural: "persistentvolumes",
        namespaced: false,
        body: json!({"spec": spec}),
        status: Some(json!({"phase": "Available"})),
        generation: false,
        first: json!({"spec": spec}),
        // mountOptions is atomic, the node affinity a separate field: both kept.
        second: json!({"spec": {"mountOptions": ["ro"]}}),
        merged: |o| {
            assert_eq!(o["spec"]["mountOptions"], json!(["ro"]), "{o}");
            assert_eq!(o["spec"]["hostPath"]["path"], "/mnt/models", "{o}");
        },
        conflicting: json!({"spec": {"storageClassName": "other"}}),
    })
    .await;
}

fn rbac_kind(kind: &'static str, plural: &'static str, namespaced: bool, body: Value) -> Served {
    let conflicting = if body.get("rules").is_some() {
        json!({"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]})
    } else {
        json!({"subjects": [{"kind": "Group", "name": "others", "apiGroup": "rbac.authorization.k8s.io"}]})
    };
    let mut second = json!({"metadata": {"labels": {"second": "yes"}}});
    if let Some(role_ref) = body.get("roleRef") {
        second["roleRef"] = role_ref.clone();
    }
    Served {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind,
        plural,
        namespaced,
        body: body.clone(),
        status: None,
        generation: false,
        first: body,
        second,
        merged: |o| {
            assert_eq!(labels(o), ["second", "test-run"], "{o}");
            assert!(
                o.get("rules").is_some() || o.get("subjects").is_some(),
                "first's list kept: {o}"
            );
        },
        // rules and subjects are atomic lists: owned whole by `first`.
        conflicting,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles() {
    exercise(rbac_kind(
        "Role",
        "roles",
        true,
        json!({"rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterroles() {
    exercise(rbac_kind(
        "ClusterRole",
        "clusterroles",
        false,
        json!({"rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]}),
    ))
    .await;
}

fn binding(role_kind: &str) -> Value {
    json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": "nothing"},
        "subjects": [{"kind": "ServiceAccount", "name": "someone", "namespace": "elsewhere"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolebindings() {
    exercise(rbac_kind(
        "RoleBinding",
        "rolebindings",
        true,
        binding("Role"),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterrolebindings() {
    exercise(rbac_kind(
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
        binding("ClusterRole"),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn horizontalpodautoscalers() {
    let spec = json!({"scaleTargetRef": {"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "name": "m"},
        "minReplicas": 1, "maxReplicas": 4,
        "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]});
    exercise(Served {
        group: "autoscaling",
        version: "v2",
        kind: "HorizontalPodAutoscaler",
        plural: "horizontalpodautoscalers",
        namespaced: true,
        body: json!({"spec": spec}),
        status: Some(json!({"currentReplicas": 2, "desiredReplicas": 3,
            "conditions": [{"type": "AbleToScale", "status": "True"}]})),
        generation: false,
        first: json!({"spec": spec}),
        // A scaling behavior beside first's spec.
        second: json!({"spec": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}}}),
        merged: |o| {
            assert_eq!(o["spec"]["maxReplicas"], 4, "{o}");
            assert_eq!(
                o["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"], 60,
                "{o}"
            );
        },
        // metrics is atomic.
        conflicting: json!({"spec": {"metrics": [{"type": "Resource", "resource": {"name": "memory",
            "target": {"type": "Utilization", "averageUtilization": 50}}}]}}),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poddisruptionbudgets() {
    let spec = json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "w"}}});
    exercise(Served {
        group: "policy",
        version: "v1",
        kind: "PodDisruptionBudget",
        plural: "poddisruptionbudgets",
        namespaced: true,
        body: json!({"spec": spec}),
        status: Some(json!({"currentHealthy": 2, "desiredHealthy": 1, "disruptionsAllowed": 1,
            "expectedPods": 2, "conditions": [{"type": "DisruptionAllowed", "status": "True",
            "reason": "SufficientPods", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})),
        generation: true,
        first: json!({"spec": spec}),
        second: json!({"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}}),
        merged: |o| {
            assert_eq!(o["spec"]["minAvailable"], 1, "{o}");
            assert_eq!(o["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow", "{o}");
        },
        conflicting: json!({"spec": {"minAvailable": 2}}),
    })
    .await;
}
