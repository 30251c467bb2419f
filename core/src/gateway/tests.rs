//! The gateway's decisions and objects, pure.
#![allow(clippy::needless_pass_by_value)] // helpers take JSON literals

use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::api::{EndpointStatus, ModelDeploymentStatus};
use serde_json::{Value, json};

use super::decide::{Apis, Decision, Inputs, choose_gateway, decide, gateway_url};
use super::reasons;
use super::render::{EPP_PORT, GATEWAY_FOR, MODEL_HEADER};

const ALL: Apis = Apis {
    inference_pool: true,
    http_route: true,
};

/// A ModelDeployment `llama` in `ml` with `spec.gateway` as given, whose provider reported
/// serving pods `app=llama` on 8000.
fn md(gateway: Value) -> ModelDeployment {
    let mut md: ModelDeployment = serde_json::from_value(json!({
        "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "llama", "namespace": "ml", "uid": "u"},
        "spec": {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": {"type": "vllm"},
                 "gateway": gateway},
    }))
    .unwrap();
    md.status = Some(ModelDeploymentStatus {
        selector: Some("app=llama".into()),
        endpoint: Some(EndpointStatus {
            service: Some("llama".into()),
            port: Some(80),
            target_port: Some(8000),
            inference_pool: None,
        }),
        ..ModelDeploymentStatus::default()
    });
    md
}

fn endpoint(md: &mut ModelDeployment) -> &mut EndpointStatus {
    md.status.as_mut().unwrap().endpoint.as_mut().unwrap()
}

fn gateway(ns: &str, name: &str, labels: Value, status: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"namespace": ns, "name": name, "labels": labels},
        "spec": {"gatewayClassName": "c", "listeners": [
            {"name": "tls", "protocol": "TLS", "port": 8443},
            {"name": "web", "protocol": "HTTP", "port": 8080,
             "allowedRoutes": {"namespaces": {"from": "All"}}},
        ]},
        "status": status,
    })
}

fn addressed() -> Value {
    json!({"addresses": [{"type": "IPAddress", "value": ""}, {"value": "10.0.0.7"}]})
}

fn run(md: &ModelDeployment, gateways: &[Value], user_route: Option<&Value>) -> Decision {
    decide(&Inputs {
        md,
        apis: ALL,
        gateways,
        user_route,
        live: &[],
        flag: None,
    })
}

fn kinds(d: &Decision) -> Vec<&str> {
    d.objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect()
}

#[test]
fn enabled_makes_pool_picker_and_route_and_reports_the_url() {
    let gw = [gateway("infra", "inference", json!({}), addressed())];
    let d = run(
        &md(json!({"enabled": true, "modelName": "llama-8b"})),
        &gw,
        None,
    );
    assert_eq!(
        kinds(&d),
        [
            "InferencePool",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ConfigMap",
            "Deployment",
            "Service",
            "HTTPRoute"
        ]
    );
    let pool = &d.objects[0];
    assert_eq!(
        pool["spec"]["selector"]["matchLabels"],
        json!({"app": "llama"})
    );
    assert_eq!(pool["spec"]["targetPorts"], json!([{"number": 8000}]));
    assert_eq!(pool["spec"]["endpointPickerRef"]["name"], "llama-epp");
    assert_eq!(
        pool["spec"]["endpointPickerRef"]["port"]["number"],
        EPP_PORT
    );
    let service = &d.objects[6];
    assert_eq!(
        service["spec"]["ports"][0]["appProtocol"],
        "kubernetes.io/h2c"
    );
    assert_eq!(service["spec"]["ports"][0]["port"], EPP_PORT);
    let route = &d.objects[7];
    assert_eq!(
        route["spec"]["parentRefs"][0],
        json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "infra", "name": "inference"})
    );
    let rule = &route["spec"]["rules"][0];
    assert_eq!(
        rule["backendRefs"],
        json!([{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llama"}])
    );
    assert_eq!(rule["matches"][0]["headers"][0]["name"], MODEL_HEADER);
    assert_eq!(rule["matches"][0]["headers"][0]["value"], "llama-8b");
    for o in &d.objects {
        assert_eq!(o["metadata"]["namespace"], "ml");
        assert_eq!(o["metadata"]["labels"][GATEWAY_FOR], "llama");
    }
    let status = d.status.unwrap();
    assert_eq!(status.url.as_deref(), Some("http://10.0.0.7:8080/v1"));
    assert_eq!(status.endpoint.as_deref(), Some("10.0.0.7"));
    assert_eq!(status.model_name.as_deref(), Some("llama-8b"));
    assert_eq!(status.gateway.as_deref(), Some("infra/inference"));
    assert_eq!(status.http_route.as_deref(), Some("llama"));
    assert_eq!(d.ready.unwrap().1, reasons::GATEWAY_CONFIGURED);
}

/// The EPP's pods must not be serving pods: they carry none of the serving labels.
#[test]
fn the_picker_is_not_one_of_the_serving_pods() {
    let gw = [gateway("infra", "g", json!({}), addressed())];
    let d = run(&md(json!({"enabled": true})), &gw, None);
    let deployment = d
        .objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .contains(&json!("--secure-serving=false")),
        "the h2c Service speaks clear text: {args}"
    );
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert!(labels.get("app").is_none(), "{labels}");
    assert!(labels.get("kubeairunway.ai/model-deployment").is_none());
    let role = d.objects.iter().find(|o| o["kind"] == "Role").unwrap();
    let resources: Vec<&str> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resources"].as_array().unwrap())
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(
        resources,
        [
            "pods",
            "inferencepools",
            "inferenceobjectives",
            "inferencemodelrewrites"
        ]
    );
    for rule in role["rules"].as_array().unwrap() {
        assert_eq!(rule["verbs"], json!(["get", "watch", "list"]));
    }
}

#[test]
fn disabled_or_absent_removes_everything() {
    for gateway in [
        json!({"enabled": false}),
        json!(null),
        json!({"modelName": "x"}),
    ] {
        let d = run(&md(gateway.clone()), &[], None);
        assert_eq!(
            (d.objects.len(), d.prune, d.status, d.ready),
            (0, true, None, None),
            "{gateway}"
        );
    }
}

#[test]
fn missing_apis_say_which() {
    let d = decide(&Inputs {
        md: &md(json!({"enabled": true})),
        apis: Apis {
            inference_pool: true,
            http_route: false,
        },
        gateways: &[],
        user_route: None,
        live: &[],
        flag: None,
    });
    let (ok, reason, message) = d.ready.unwrap();
    assert!(!ok);
    assert_eq!(reason, reasons::CRDS_NOT_AVAILABLE);
    assert!(
        message.contains("httproutes.gateway.networking.k8s.io/v1"),
        "{message}"
    );
    assert!(!message.contains("inferencepools"), "{message}");
    assert!(d.objects.is_empty() && d.prune);
}

#[test]
fn without_serving_pods_it_waits_and_keeps_what_exists() {
    let mut m = md(json!({"enabled": true}));
    endpoint(&mut m).target_port = None;
    let d = run(&m, &[], None);
    assert_eq!(d.ready.unwrap().1, reasons::AWAITING_SERVING_PODS);
    assert!(d.objects.is_empty() && !d.prune);
}

/// The operator's own pool: no pool or picker, the route goes to it.
#[test]
fn a_provider_pool_is_routed_to_and_not_made() {
    let mut m = md(json!({"enabled": true}));
    endpoint(&mut m).inference_pool = Some("llama-pool".into());
    let gw = [gateway("ml", "g", json!({}), json!({}))];
    let d = run(&m, &gw, None);
    assert_eq!(kinds(&d), ["HTTPRoute"]);
    assert_eq!(
        d.objects[0]["spec"]["rules"][0]["backendRefs"][0]["name"],
        "llama-pool"
    );
    assert_eq!(d.ready.unwrap().1, reasons::GATEWAY_ADDRESS_PENDING);
}

#[test]
fn the_users_route_is_checked_and_its_gateway_used() {
    let m = md(json!({"enabled": true, "httpRouteRef": "mine"}));
    let gw = [
        gateway("infra", "a", json!({}), addressed()),
        gateway("infra", "b", json!({}), addressed()),
    ];
    let d = run(&m, &gw, None);
    assert_eq!(d.ready.clone().unwrap().1, reasons::HTTP_ROUTE_NOT_FOUND);
    assert!(!kinds(&d).contains(&"HTTPRoute"), "{:?}", kinds(&d));
    let mut route = json!({"metadata": {"namespace": "ml", "name": "mine"}, "spec": {
        "parentRefs": [{"name": "b", "namespace": "infra"}],
        "rules": [{"backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "other"}]}]}});
    let d = run(&m, &gw, Some(&route));
    assert_eq!(d.ready.clone().unwrap().1, reasons::HTTP_ROUTE_NOT_TO_POOL);
    route["spec"]["rules"][0]["backendRefs"][0]["name"] = json!("llama");
    let d = run(&m, &gw, Some(&route));
    assert_eq!(d.ready.clone().unwrap().1, reasons::GATEWAY_CONFIGURED);
    let status = d.status.unwrap();
    assert_eq!(status.gateway.as_deref(), Some("infra/b"));
    assert_eq!(status.http_route.as_deref(), Some("mine"));
}

#[test]
fn the_gateway_is_the_named_the_only_or_the_labelled_one() {
    let a = gateway("infra", "a", json!({}), json!({}));
    let b = gateway(
        "infra",
        "b",
        json!({"kubeairunway.ai/inference-gateway": "true"}),
        json!({}),
    );
    let name = |g: &Value| g["metadata"]["name"].as_str().unwrap().to_string();
    assert_eq!(
        name(choose_gateway(std::slice::from_ref(&a), None).unwrap()),
        "a"
    );
    assert_eq!(
        name(choose_gateway(&[a.clone(), b.clone()], None).unwrap()),
        "b"
    );
    let flag = ("infra".to_string(), "a".to_string());
    assert_eq!(
        name(choose_gateway(&[a.clone(), b.clone()], Some(&flag)).unwrap()),
        "a"
    );
    let missing = ("infra".to_string(), "c".to_string());
    let err = choose_gateway(&[a.clone(), b], Some(&missing)).unwrap_err();
    assert_eq!(err.0, reasons::NO_GATEWAY);
    assert!(err.1.contains("infra/c"), "{}", err.1);
    let err = choose_gateway(&[a.clone(), a], None).unwrap_err();
    assert!(err.1.contains("none is labelled"), "{}", err.1);
    assert!(
        choose_gateway(&[], None)
            .unwrap_err()
            .1
            .contains("no Gateway")
    );
}

#[test]
fn the_url_has_the_listeners_scheme_and_port_and_the_first_address() {
    let mut g = gateway("n", "g", json!({}), addressed());
    assert_eq!(
        gateway_url(&g, "n").unwrap().1,
        "http://10.0.0.7:8080/v1".to_string()
    );
    g["spec"]["listeners"] = json!([{"name": "s", "protocol": "HTTPS", "port": 443}]);
    g["status"]["addresses"] = json!([{"type": "Hostname", "value": "ai.example.com"}]);
    assert_eq!(gateway_url(&g, "n").unwrap().1, "https://ai.example.com/v1");
    g["status"]["addresses"] = json!([{"value": "fd00::1"}]);
    assert_eq!(gateway_url(&g, "n").unwrap().1, "https://[fd00::1]/v1");
    g["status"] = json!({});
    assert_eq!(gateway_url(&g, "n"), None);
}

/// A route from another namespace attaches only where a listener admits it; core says
/// so rather than change the Gateway.
#[test]
fn a_gateway_elsewhere_must_admit_the_route() {
    let m = md(json!({"enabled": true}));
    let mut gw = gateway("infra", "g", json!({}), addressed());
    // The default: routes from the Gateway's own namespace only.
    gw["spec"]["listeners"][1]["allowedRoutes"] = json!({});
    let d = run(&m, std::slice::from_ref(&gw), None);
    let (ok, reason, message) = d.ready.clone().unwrap();
    assert_eq!((ok, reason), (false, reasons::ROUTE_NOT_ALLOWED));
    assert!(message.contains("namespace ml"), "{message}");
    assert!(
        kinds(&d).contains(&"HTTPRoute"),
        "the route is made all the same"
    );
    gw["spec"]["listeners"][1]["allowedRoutes"] = json!({"namespaces": {"from": "All"}});
    let d = run(&m, std::slice::from_ref(&gw), None);
    assert_eq!(d.ready.unwrap().1, reasons::GATEWAY_CONFIGURED);
    gw["spec"]["listeners"][1]["allowedRoutes"]["kinds"] = json!([{"kind": "GRPCRoute"}]);
    let d = run(&m, std::slice::from_ref(&gw), None);
    assert_eq!(d.ready.unwrap().1, reasons::ROUTE_NOT_ALLOWED);
    gw["spec"]["listeners"][1]["allowedRoutes"] = json!({"namespaces": {"from": "Selector",
        "selector": {"matchLabels": {"team": "ml"}}}});
    let d = run(&m, std::slice::from_ref(&gw), None);
    assert_eq!(d.ready.unwrap().1, reasons::GATEWAY_CONFIGURED);
}

#[test]
fn the_model_name_defaults_to_the_served_name() {
    let m = md(json!({"enabled": true}));
    let gw = [gateway("ml", "g", json!({}), addressed())];
    let d = run(&m, &gw, None);
    assert_eq!(
        d.status.unwrap().model_name.as_deref(),
        m.spec.served_model_name()
    );
}

/// Every field of the pool and the route is in the real CRDs' schemas (GAIE v1.5.0,
/// Gateway API v1.5.1, tests/fixtures/crds/upstream/SOURCES.md).
#[test]
fn the_pool_and_the_route_fit_the_real_crds() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kubeairunway_sdk::{UpstreamApi, UpstreamRef};
    let api = |file: &str, wanted: UpstreamRef| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/crds/upstream")
            .join(file);
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        UpstreamApi::detect(&crd, &wanted).unwrap()
    };
    let pools = api(
        "inference.networking.k8s.io_inferencepools.yaml",
        UpstreamRef::new(
            "inference.networking.k8s.io",
            "InferencePool",
            "inferencepools",
            &["v1"],
        ),
    );
    let routes = api(
        "gateway.networking.k8s.io_httproutes.yaml",
        UpstreamRef::new(
            "gateway.networking.k8s.io",
            "HTTPRoute",
            "httproutes",
            &["v1"],
        ),
    );
    let gw = [gateway("infra", "g", json!({}), addressed())];
    let d = run(&md(json!({"enabled": true})), &gw, None);
    let pool = &d.objects[0];
    assert!(
        pools.missing_paths(pool).is_empty(),
        "{:?}",
        pools.missing_paths(pool)
    );
    let route = d.objects.last().unwrap();
    assert!(
        routes.missing_paths(route).is_empty(),
        "{:?}",
        routes.missing_paths(route)
    );
    // Deterministic: the same input gives byte-identical objects.
    let again = run(&md(json!({"enabled": true})), &gw, None);
    assert_eq!(
        serde_json::to_string(&again.objects).unwrap(),
        serde_json::to_string(&d.objects).unwrap()
    );
}

/// What the Gateway's implementation reports on the route and the pool (their
/// `status.parents`) for the chosen Gateway turns `GatewayReady` false, with its reason and
/// message; a report for another Gateway, or for an older generation, does not.
#[test]
fn a_refusal_by_the_gateways_implementation_is_reported() {
    let m = md(json!({"enabled": true}));
    let gw = [gateway("infra", "inference", json!({}), addressed())];
    let parent = |name: &str, type_: &str, status: &str, generation: i64| {
        json!({"parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
            "namespace": "infra", "name": name},
            "controllerName": "example.com/gateway",
            "conditions": [{"type": type_, "status": status, "reason": "NoMatchingListener",
                "message": "no listener matched", "observedGeneration": generation,
                "lastTransitionTime": "2026-11-27T00:00:00Z"}]})
    };
    let object = |kind: &str, parents: Value| {
        json!({"kind": kind, "metadata": {"namespace": "ml", "name": "llama", "generation": 2},
            "status": {"parents": parents}})
    };
    let decide_with = |live: &[Value]| {
        decide(&Inputs {
            md: &m,
            apis: ALL,
            gateways: &gw,
            user_route: None,
            live,
            flag: None,
        })
        .ready
        .unwrap()
    };
    assert_eq!(decide_with(&[]).1, reasons::GATEWAY_CONFIGURED);
    let refused = object(
        "HTTPRoute",
        json!([parent("inference", "Accepted", "False", 2)]),
    );
    let (ok, reason, message) = decide_with(std::slice::from_ref(&refused));
    assert!(!ok);
    assert_eq!(reason, reasons::NOT_ACCEPTED);
    assert_eq!(
        message,
        "Gateway infra/inference reports HTTPRoute ml/llama Accepted=False: NoMatchingListener: no listener matched"
    );
    let other_gateway = object(
        "HTTPRoute",
        json!([parent("other", "Accepted", "False", 2)]),
    );
    let stale = object(
        "HTTPRoute",
        json!([parent("inference", "Accepted", "False", 1)]),
    );
    let accepted = object(
        "HTTPRoute",
        json!([parent("inference", "Accepted", "True", 2)]),
    );
    for live in [other_gateway, stale, accepted.clone()] {
        assert_eq!(decide_with(&[live]).1, reasons::GATEWAY_CONFIGURED);
    }
    let pool = object(
        "InferencePool",
        json!([parent("inference", "ResolvedRefs", "False", 2)]),
    );
    let (ok, reason, message) = decide_with(&[accepted, pool]);
    assert!(!ok);
    assert_eq!(reason, reasons::REFS_NOT_RESOLVED);
    assert!(
        message.starts_with(
            "Gateway infra/inference reports InferencePool ml/llama ResolvedRefs=False"
        ),
        "{message}"
    );
}
