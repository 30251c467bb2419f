//! What the gateway does for one ModelDeployment (pure): which objects it wants, which
//! Gateway it routes from, and the status it reports.

use kube::ResourceExt;
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::api::{GatewaySpec, GatewayStatus};
use kubeairunway_sdk::serving::parse_selector;
use serde_json::Value;

use super::reasons;
use super::render::{self, Target};

/// Which of the APIs the gateway needs the API server serves (by discovery).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Apis {
    /// `inference.networking.k8s.io/v1` InferencePool.
    pub inference_pool: bool,
    /// `gateway.networking.k8s.io/v1` HTTPRoute (and Gateway).
    pub http_route: bool,
}

impl Apis {
    /// Both are served.
    pub fn all(self) -> bool {
        self.inference_pool && self.http_route
    }
}

/// A Gateway by namespace and name.
pub type GatewayRef = (String, String);

/// What the gateway sees for one ModelDeployment, from watch caches.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The ModelDeployment.
    pub md: &'a ModelDeployment,
    /// The APIs served.
    pub apis: Apis,
    /// Every Gateway (as JSON).
    pub gateways: &'a [Value],
    /// The HTTPRoute `spec.gateway.httpRouteRef` names, if it exists.
    pub user_route: Option<&'a Value>,
    /// The Gateway named by `--gateway`, if set.
    pub flag: Option<&'a GatewayRef>,
    /// The live HTTPRoute (ours or the user's) and our InferencePool of this
    /// ModelDeployment, as cached: their `status.parents` say whether the Gateway's
    /// implementation accepted them.
    pub live: &'a [Value],
}

/// The `GatewayReady` condition: status, reason, message.
pub type Ready = (bool, &'static str, String);

/// The decision for one ModelDeployment.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The objects to apply, in order.
    pub objects: Vec<Value>,
    /// Delete the gateway's other objects of this ModelDeployment (`false` while waiting
    /// for something that will come back, so nothing is torn down meanwhile).
    pub prune: bool,
    /// `status.gateway` (`None`: cleared).
    pub status: Option<GatewayStatus>,
    /// `GatewayReady` (`None`: removed).
    pub ready: Option<Ready>,
}

impl Decision {
    fn disabled() -> Self {
        Self {
            objects: Vec::new(),
            prune: true,
            status: None,
            ready: None,
        }
    }
}

/// Whether a ModelDeployment with this `spec.gateway` asks for the gateway
/// (`enabled: true`).
pub fn enabled(gateway: Option<&GatewaySpec>) -> bool {
    GatewaySpec::asked(gateway)
}

/// The user's HTTPRoute (`spec.gateway.httpRouteRef`), if named.
pub fn http_route_ref(gateway: Option<&GatewaySpec>) -> Option<&str> {
    gateway
        .and_then(|g| g.http_route_ref.as_deref())
        .filter(|r| !r.is_empty())
}

/// The model name clients send: `spec.gateway.modelName`, else the served name.
pub fn model_name(md: &ModelDeployment) -> String {
    md.spec
        .gateway
        .as_ref()
        .and_then(|g| g.model_name.as_deref())
        .filter(|n| !n.is_empty())
        .or_else(|| md.spec.served_model_name())
        .map_or_else(|| md.name_any(), str::to_string)
}

/// Decide, in phases: asked at all, APIs served, which pool, which route and Gateway,
/// which URL.
pub fn decide(inputs: &Inputs<'_>) -> Decision {
    let md = inputs.md;
    if !enabled(md.spec.gateway.as_ref()) {
        return Decision::disabled();
    }
    let mut status = GatewayStatus {
        model_name: Some(model_name(md)),
        ..GatewayStatus::default()
    };
    if !inputs.apis.all() {
        let missing: Vec<&str> = [
            (!inputs.apis.inference_pool)
                .then_some("inferencepools.inference.networking.k8s.io/v1"),
            (!inputs.apis.http_route).then_some("httproutes.gateway.networking.k8s.io/v1"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let message = format!(
            "the API server does not serve {}: install the Gateway API and its Inference Extension CRDs",
            missing.join(" and ")
        );
        return waiting(status, true, reasons::CRDS_NOT_AVAILABLE, message);
    }
    let (pool, mut objects) = match pool(md) {
        Ok(p) => p,
        Err(message) => return waiting(status, false, reasons::AWAITING_SERVING_PODS, message),
    };
    let gateway = match route(inputs, &pool, &mut objects, &mut status) {
        Ok(g) => g,
        Err((reason, message)) => {
            return Decision {
                objects,
                prune: true,
                status: Some(status),
                ready: Some((false, reason, message)),
            };
        }
    };
    let mut ready = address(gateway, &md.namespace().unwrap_or_default(), &mut status);
    if ready.0
        && let Some(refused) = refusal(inputs.live, gateway)
    {
        ready = refused;
    }
    Decision {
        objects,
        prune: true,
        status: Some(status),
        ready: Some(ready),
    }
}

fn waiting(status: GatewayStatus, prune: bool, reason: &'static str, message: String) -> Decision {
    Decision {
        objects: Vec::new(),
        prune,
        status: Some(status),
        ready: Some((false, reason, message)),
    }
}

/// The pool to route to and the objects it needs: the provider's own (nothing to make),
/// else an InferencePool and its EPP over the serving pods the provider reports.
fn pool(md: &ModelDeployment) -> Result<(String, Vec<Value>), String> {
    let status = md.status.as_ref();
    let endpoint = status.and_then(|s| s.endpoint.as_ref());
    if let Some(pool) = endpoint
        .and_then(|e| e.inference_pool.as_deref())
        .filter(|p| !p.is_empty())
    {
        return Ok((pool.to_string(), Vec::new()));
    }
    let port = endpoint.and_then(|e| e.target_port);
    let selector = status
        .and_then(|s| s.selector.as_deref())
        .and_then(parse_selector);
    let (Some(port), Some(selector)) = (port, selector) else {
        return Err(
            "waiting for the provider to report its serving pods (status.selector as labels, \
             status.endpoint.targetPort); a provider whose pods serve no HTTP port of their own \
             reports none"
                .to_string(),
        );
    };
    let target = Target {
        name: md.name_any(),
        namespace: md.namespace().unwrap_or_default(),
        selector,
        port,
    };
    let mut objects = vec![render::inference_pool(&target)];
    objects.extend(render::endpoint_picker(&target));
    Ok((target.name, objects))
}

/// The route: the user's (`httpRouteRef`, checked) or one of ours from the chosen Gateway.
/// Returns the Gateway the model is reached through.
fn route<'a>(
    inputs: &Inputs<'a>,
    pool: &str,
    objects: &mut Vec<Value>,
    status: &mut GatewayStatus,
) -> Result<&'a Value, (&'static str, String)> {
    let md = inputs.md;
    let namespace = md.namespace().unwrap_or_default();
    if let Some(name) = http_route_ref(md.spec.gateway.as_ref()) {
        status.http_route = Some(name.to_string());
        let Some(route) = inputs.user_route else {
            return Err((
                reasons::HTTP_ROUTE_NOT_FOUND,
                format!("HTTPRoute {namespace}/{name} (spec.gateway.httpRouteRef) does not exist"),
            ));
        };
        if !render::routes_to_pool(route, pool) {
            return Err((
                reasons::HTTP_ROUTE_NOT_TO_POOL,
                format!(
                    "HTTPRoute {namespace}/{name} (spec.gateway.httpRouteRef) has no backendRef to InferencePool {pool}"
                ),
            ));
        }
        let parents = render::parent_gateways(route);
        let found = parents.iter().find_map(|r| find(inputs.gateways, r));
        return found.ok_or_else(|| {
            (
                reasons::NO_GATEWAY,
                format!("no Gateway HTTPRoute {namespace}/{name} attaches to exists"),
            )
        });
    }
    let gateway = choose_gateway(inputs.gateways, inputs.flag)?;
    let (gw_ns, gw_name) = (namespace_of(gateway), name_of(gateway));
    let target = Target {
        name: md.name_any(),
        namespace,
        selector: std::collections::BTreeMap::new(),
        port: 0,
    };
    let model = status.model_name.clone().unwrap_or_default();
    objects.push(render::http_route(&target, (gw_ns, gw_name), pool, &model));
    status.http_route = Some(target.name);
    Ok(gateway)
}

fn find<'a>(gateways: &'a [Value], (ns, name): &GatewayRef) -> Option<&'a Value> {
    gateways
        .iter()
        .find(|g| namespace_of(g) == ns && name_of(g) == name)
}

fn namespace_of(object: &Value) -> &str {
    object["metadata"]["namespace"].as_str().unwrap_or_default()
}

fn name_of(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

/// The label that marks a Gateway for inference when there are several; AI Runway's own
/// (`airunway.ai/inference-gateway`, ai-runway/airunway@b0d3fb7 controller/internal/
/// controller/gateway_reconciler.go) is read too.
pub const INFERENCE_GATEWAY_LABELS: [&str; 2] = [
    "kubeairunway.ai/inference-gateway",
    "airunway.ai/inference-gateway",
];

/// The Gateway to route from: the one `--gateway` names, else the only one, else the first
/// (by namespace and name) labelled for inference. A shared Gateway is never changed.
pub fn choose_gateway<'a>(
    gateways: &'a [Value],
    flag: Option<&GatewayRef>,
) -> Result<&'a Value, (&'static str, String)> {
    if let Some(r) = flag {
        return find(gateways, r).ok_or_else(|| {
            (
                reasons::NO_GATEWAY,
                format!("Gateway {}/{} (--gateway) does not exist", r.0, r.1),
            )
        });
    }
    if let [only] = gateways {
        return Ok(only);
    }
    let mut labelled: Vec<&Value> = gateways
        .iter()
        .filter(|g| {
            INFERENCE_GATEWAY_LABELS
                .iter()
                .any(|l| g["metadata"]["labels"][*l] == "true")
        })
        .collect();
    labelled.sort_by_key(|g| (namespace_of(g), name_of(g)));
    labelled.first().copied().ok_or_else(|| {
        let message = if gateways.is_empty() {
            "no Gateway exists".to_string()
        } else {
            format!(
                "{} Gateways exist and none is labelled {}=true; label one or start core with --gateway",
                gateways.len(),
                INFERENCE_GATEWAY_LABELS[0]
            )
        };
        (reasons::NO_GATEWAY, message)
    })
}

/// Fill the Gateway's name, address and URL into `status`; `GatewayReady` is true once
/// one of the Gateway's HTTP(S) listeners admits routes from `route_namespace` and the
/// Gateway has an address.
fn address(gateway: &Value, route_namespace: &str, status: &mut GatewayStatus) -> Ready {
    let name = format!("{}/{}", namespace_of(gateway), name_of(gateway));
    status.gateway = Some(name.clone());
    let http = http_listeners(gateway).count();
    if http > 0 && admitting(gateway, route_namespace).next().is_none() {
        return (
            false,
            reasons::ROUTE_NOT_ALLOWED,
            format!(
                "no HTTP(S) listener of Gateway {name} admits HTTPRoutes from namespace \
                 {route_namespace} (spec.listeners[].allowedRoutes); its owner must allow them: \
                 core never changes a Gateway"
            ),
        );
    }
    match gateway_url(gateway, route_namespace) {
        Some((host, url)) => {
            status.endpoint = Some(host);
            status.url = Some(url.clone());
            (
                true,
                reasons::GATEWAY_CONFIGURED,
                format!("routed through Gateway {name} at {url}"),
            )
        }
        None => (
            false,
            reasons::GATEWAY_ADDRESS_PENDING,
            format!("Gateway {name} has no address (status.addresses) or no HTTP(S) listener yet"),
        ),
    }
}

/// The first refusal the Gateway's implementation reports on one of `objects` (an
/// HTTPRoute or InferencePool, each with `status.parents[]` per parent Gateway, Gateway
/// API v1.5.1 `RouteParentStatus`, GAIE v1.5.0 `ParentStatus`): `Accepted` or
/// `ResolvedRefs` false for this Gateway at the object's current generation.
fn refusal(objects: &[Value], gateway: &Value) -> Option<Ready> {
    let (gw_ns, gw_name) = (namespace_of(gateway), name_of(gateway));
    objects.iter().find_map(|object| {
        let ns = namespace_of(object);
        let generation = object["metadata"]["generation"].as_i64();
        let parent = object["status"]["parents"].as_array()?.iter().find(|p| {
            let r = &p["parentRef"];
            r["name"] == gw_name
                && r["namespace"].as_str().unwrap_or(ns) == gw_ns
                && r["kind"].as_str().is_none_or(|k| k == "Gateway")
        })?;
        let conditions = parent["conditions"].as_array()?;
        [
            ("Accepted", reasons::NOT_ACCEPTED),
            ("ResolvedRefs", reasons::REFS_NOT_RESOLVED),
        ]
        .into_iter()
        .find_map(|(type_, reason)| {
            let c = conditions.iter().find(|c| c["type"] == type_)?;
            let current = c["observedGeneration"]
                .as_i64()
                .is_none_or(|g| Some(g) >= generation);
            (c["status"] == "False" && current).then(|| {
                (
                    false,
                    reason,
                    format!(
                        "Gateway {gw_ns}/{gw_name} reports {} {ns}/{} {type_}=False: {}: {}",
                        object["kind"].as_str().unwrap_or_default(),
                        name_of(object),
                        c["reason"].as_str().unwrap_or_default(),
                        c["message"].as_str().unwrap_or_default()
                    ),
                )
            })
        })
    })
}

fn http_listeners(gateway: &Value) -> impl Iterator<Item = &Value> {
    gateway["spec"]["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| matches!(l["protocol"].as_str(), Some("HTTP" | "HTTPS")))
}

/// The HTTP(S) listeners that admit HTTPRoutes from `namespace`, by their `allowedRoutes`
/// (Gateway API v1.5.1 apis/v1/gateway_types.go): `namespaces.from` `All`, `Same` (the
/// default) when the Gateway is in that namespace, or `Selector`, taken as admitting
/// (core reads no Namespace labels); `kinds`, when set, must name HTTPRoute.
fn admitting<'a>(gateway: &'a Value, namespace: &'a str) -> impl Iterator<Item = &'a Value> {
    let same = namespace_of(gateway) == namespace;
    http_listeners(gateway).filter(move |l| {
        let allowed = &l["allowedRoutes"];
        let from = match allowed["namespaces"]["from"].as_str().unwrap_or("Same") {
            "All" | "Selector" => true,
            "Same" => same,
            _ => false,
        };
        let kinds = allowed["kinds"].as_array().filter(|k| !k.is_empty());
        let kind = kinds.is_none_or(|k| k.iter().any(|k| k["kind"] == "HTTPRoute"));
        from && kind
    })
}

/// The Gateway's first address (`status.addresses[].value`, not empty) and the URL of the
/// OpenAI-compatible API through its first HTTP or HTTPS listener that admits routes from
/// `route_namespace`: `<scheme>://<host>[:<port>]/v1` (the port left out when it is the
/// scheme's default).
pub fn gateway_url(gateway: &Value, route_namespace: &str) -> Option<(String, String)> {
    let host = gateway
        .pointer("/status/addresses")?
        .as_array()?
        .iter()
        .filter_map(|a| a["value"].as_str())
        .find(|v| !v.is_empty())?;
    let listener = admitting(gateway, route_namespace).next()?;
    let scheme = if listener["protocol"] == "HTTPS" {
        "https"
    } else {
        "http"
    };
    let port = listener["port"].as_i64()?;
    let default = if scheme == "https" { 443 } else { 80 };
    let authority = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let port = if port == default {
        String::new()
    } else {
        format!(":{port}")
    };
    Some((host.to_string(), format!("{scheme}://{authority}{port}/v1")))
}
