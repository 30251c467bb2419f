//! The objects the gateway makes for one ModelDeployment (pure): the InferencePool, its
//! endpoint picker (EPP: ServiceAccount, Role, RoleBinding, plugin ConfigMap, Deployment,
//! Service) and the HTTPRoute. Shapes follow GAIE v1.5.0's own chart
//! (kubernetes-sigs/gateway-api-inference-extension@v1.5.0 config/charts/epplib/templates/
//! and config/charts/inferencepool/templates/) and Gateway API v1.5.1's HTTPRoute.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The InferencePool API (GAIE v1.5.0 `api/v1/inferencepool_types.go`).
pub const POOL_GROUP: &str = "inference.networking.k8s.io";
/// Its version.
pub const POOL_VERSION: &str = "v1";
/// The Gateway API group (Gateway, HTTPRoute).
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// Its version.
pub const GATEWAY_VERSION: &str = "v1";
/// The EPP image of GAIE v1.5.0 (config/charts/inferencepool/values.yaml:4-6).
pub const EPP_IMAGE: &str = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0";
/// The EPP's ext-proc gRPC port (`--grpc-port`, pkg/epp/server/options.go@v1.5.0).
pub const EPP_PORT: i32 = 9002;
/// Its gRPC health port.
pub const EPP_HEALTH_PORT: i32 = 9003;
/// Its metrics port.
pub const EPP_METRICS_PORT: i32 = 9090;
/// The plugin config file the EPP reads, in its ConfigMap.
pub const EPP_CONFIG_FILE: &str = "default-plugins.yaml";
/// The header the route matches the model on: what body-based routing (BBR) sets from the
/// request's `model` (config/charts/body-based-routing/values.yaml@v1.5.0), and what
/// clients may send themselves.
pub const MODEL_HEADER: &str = "X-Gateway-Model-Name";
/// Request timeout of the route: long generations outlast the Gateway's default.
pub const REQUEST_TIMEOUT: &str = "300s";
/// Label on every object the gateway makes, naming its ModelDeployment: the watch caches
/// select by it. Not `kubeairunway.ai/model-deployment`, which selects serving pods.
pub const GATEWAY_FOR: &str = "kubeairunway.ai/gateway-for";
/// Label on the EPP's pods (its Deployment and Service select by it).
pub const EPP_POD_LABEL: &str = "kubeairunway.ai/endpoint-picker";
/// Annotation holding a hash of what was applied: an unchanged object is not applied again.
pub const HASH: &str = "kubeairunway.ai/gateway-hash";

/// What the objects are made from: decided from the ModelDeployment and its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The ModelDeployment's name (the pool's and the route's name; the EPP's stem).
    pub name: String,
    /// Its namespace (every object's).
    pub namespace: String,
    /// The serving pods' labels (`status.selector`).
    pub selector: BTreeMap<String, String>,
    /// Their port (`status.endpoint.targetPort`).
    pub port: i32,
}

/// The name of the EPP's objects.
pub fn epp_name(md: &str) -> String {
    format!("{md}-epp")
}

fn meta(name: &str, target: &Target) -> Value {
    json!({"name": name, "namespace": target.namespace, "labels": {GATEWAY_FOR: target.name}})
}

/// The InferencePool over the serving pods, picked by the EPP (`failureMode: FailOpen`,
/// the chart's default: requests still flow while the picker is down).
pub fn inference_pool(target: &Target) -> Value {
    json!({
        "apiVersion": format!("{POOL_GROUP}/{POOL_VERSION}"),
        "kind": "InferencePool",
        "metadata": meta(&target.name, target),
        "spec": {
            "selector": {"matchLabels": target.selector},
            "targetPorts": [{"number": target.port}],
            "endpointPickerRef": {
                "name": epp_name(&target.name),
                "port": {"number": EPP_PORT},
                "failureMode": "FailOpen",
            },
        },
    })
}

/// The EPP's objects, in the order to apply them: ServiceAccount, Role, RoleBinding,
/// ConfigMap, Deployment, Service.
pub fn endpoint_picker(target: &Target) -> Vec<Value> {
    let name = epp_name(&target.name);
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(&name, target)}),
        role(&name, target),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(&name, target),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": target.namespace}],
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(&name, target),
            // The EPP's defaults (its scorers and picker) apply to an empty config.
            "data": {EPP_CONFIG_FILE:
                "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"},
        }),
        epp_deployment(&name, target),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(&name, target),
            "spec": {
                "type": "ClusterIP",
                "selector": {EPP_POD_LABEL: target.name},
                "ports": [
                    // h2c: the Gateway speaks ext-proc (gRPC) to it in clear text.
                    {"name": "grpc-ext-proc", "protocol": "TCP", "port": EPP_PORT,
                     "appProtocol": "kubernetes.io/h2c"},
                    {"name": "http-metrics", "protocol": "TCP", "port": EPP_METRICS_PORT},
                ],
            },
        }),
    ]
}

/// Exactly what the EPP reads in its namespace: pods, its InferencePool, and the optional
/// InferenceObjectives and InferenceModelRewrites (config/charts/epplib/templates/
/// _rbac.yaml and config/charts/inferencepool/templates/rbac.yaml@v1.5.0; the leases of
/// leader election only with more than one replica, which this EPP is not).
fn role(name: &str, target: &Target) -> Value {
    let read = json!(["get", "watch", "list"]);
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(name, target),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": read},
            {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read},
            {"apiGroups": ["inference.networking.x-k8s.io"],
             "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": read},
        ],
    })
}

/// One EPP replica, `Recreate` (the chart's single active replica), with the chart's flags,
/// ports, gRPC probes and environment (config/charts/epplib/templates/_deployment.yaml
/// @v1.5.0); tracing and metrics auth off (no collector, no Prometheus RBAC here); and
/// serving in clear text (`--secure-serving` defaults to true, pkg/epp/server/options.go
/// :115,188@v1.5.0), as its Service's `appProtocol: kubernetes.io/h2c` says (KAITO's
/// InferenceSet integration does the same).
fn epp_deployment(name: &str, target: &Target) -> Value {
    let probe = |period: i32| {
        json!({"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"},
               "periodSeconds": period})
    };
    let mut liveness = probe(10);
    liveness["initialDelaySeconds"] = json!(5);
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(name, target),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {EPP_POD_LABEL: target.name}},
            "template": {
                "metadata": {"labels": {EPP_POD_LABEL: target.name}},
                "spec": {
                    "serviceAccountName": name,
                    "terminationGracePeriodSeconds": 130,
                    "containers": [{
                        "name": "epp",
                        "image": EPP_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "args": [
                            "--pool-name", target.name,
                            "--pool-namespace", target.namespace,
                            "--pool-group", POOL_GROUP,
                            "--zap-encoder", "json",
                            "--config-file", format!("/config/{EPP_CONFIG_FILE}"),
                            "--tracing=false",
                            "--metrics-endpoint-auth=false",
                            "--secure-serving=false",
                        ],
                        "ports": [
                            {"name": "grpc", "containerPort": EPP_PORT},
                            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT},
                            {"name": "metrics", "containerPort": EPP_METRICS_PORT},
                        ],
                        "livenessProbe": liveness,
                        "readinessProbe": probe(2),
                        "env": [
                            {"name": "NAMESPACE", "valueFrom": field("metadata.namespace")},
                            {"name": "POD_NAME", "valueFrom": field("metadata.name")},
                        ],
                        "volumeMounts": [{"name": "plugins-config", "mountPath": "/config"}],
                    }],
                    "volumes": [{"name": "plugins-config", "configMap": {"name": name}}],
                },
            },
        },
    })
}

/// The HTTPRoute from `gateway` (namespace, name) to `pool`, for requests whose
/// [`MODEL_HEADER`] is `model`.
pub fn http_route(target: &Target, gateway: (&str, &str), pool: &str, model: &str) -> Value {
    json!({
        "apiVersion": format!("{GATEWAY_GROUP}/{GATEWAY_VERSION}"),
        "kind": "HTTPRoute",
        "metadata": meta(&target.name, target),
        "spec": {
            "parentRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway",
                            "namespace": gateway.0, "name": gateway.1}],
            "rules": [{
                "matches": [{
                    "path": {"type": "PathPrefix", "value": "/"},
                    "headers": [{"type": "Exact", "name": MODEL_HEADER, "value": model}],
                }],
                "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool", "name": pool}],
                "timeouts": {"request": REQUEST_TIMEOUT},
            }],
        },
    })
}

/// Whether `route` (an HTTPRoute) sends to the InferencePool `pool` of its own namespace.
pub fn routes_to_pool(route: &Value, pool: &str) -> bool {
    let route_ns = route["metadata"]["namespace"].as_str();
    route["spec"]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["backendRefs"].as_array().into_iter().flatten())
        .any(|b| {
            b["group"] == POOL_GROUP
                && b["kind"] == "InferencePool"
                && b["name"] == pool
                && (b["namespace"].is_null() || b["namespace"].as_str() == route_ns)
        })
}

/// The Gateways `route` attaches to, as (namespace, name); a parentRef without a namespace
/// means the route's own.
pub fn parent_gateways(route: &Value) -> Vec<(String, String)> {
    let route_ns = route["metadata"]["namespace"].as_str().unwrap_or_default();
    route["spec"]["parentRefs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            (p["group"].is_null() || p["group"] == GATEWAY_GROUP)
                && (p["kind"].is_null() || p["kind"] == "Gateway")
        })
        .filter_map(|p| {
            let name = p["name"].as_str()?;
            let ns = p["namespace"].as_str().unwrap_or(route_ns);
            Some((ns.to_string(), name.to_string()))
        })
        .collect()
}
