//! The dashboard as it runs in the cluster (`kubeairunway dashboard --in-cluster`): no
//! credentials of its own, every user signs in with their own bearer token, and every
//! request reaches the API server as that user. Tokens are the test API server's bound
//! service-account tokens; rights are the core chart's own `view` and `edit` roles. Plain
//! requests check the guards, the cookie and who the API server saw (its audit log); a real
//! browser signs in, is refused a wrong token, lists and signs out.

use std::path::PathBuf;
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubeairunway_cli::crds;
use kubeairunway_cli::dashboard::{self, session};
use kubeairunway_e2e::helm;
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::testing;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

const CSRF: &str = "x-kubeairunway-dashboard";

/// A bearer token of service account `name` in `ns`, bound to a ClusterRole of the core
/// chart ending in `-{role}`: in every namespace, or in `ns` only when `only_ns`.
async fn user_token(
    cluster: &kubeairunway_testcluster::TestCluster,
    admin: &kube::Client,
    chart_roles: &[Value],
    (ns, name): (&str, &str),
    role: &str,
    only_ns: bool,
) -> String {
    let role = chart_roles
        .iter()
        .find(|r| {
            r["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with(&format!("-{role}")))
        })
        .expect("the core chart's role");
    let role_name = role["metadata"]["name"].as_str().unwrap();
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(admin.clone())
        .patch(
            role_name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(role),
        )
        .await
        .unwrap();
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": if only_ns { "RoleBinding" } else { "ClusterRoleBinding" },
        "metadata": {"name": format!("{ns}-{name}"), "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
    });
    let params = PatchParams::apply("test").force();
    if only_ns {
        Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(admin.clone(), ns)
            .patch(&format!("{ns}-{name}"), &params, &Patch::Apply(&binding))
            .await
            .unwrap();
    } else {
        Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone())
            .patch(&format!("{ns}-{name}"), &params, &Patch::Apply(&binding))
            .await
            .unwrap();
    }
    let pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-shell"), "namespace": ns, "uid": format!("uid-{name}")},
        "spec": {"serviceAccountName": name, "containers": []}}))
    .unwrap();
    cluster.token_for_pod(&pod).await.unwrap()
}

/// The core chart's dashboard (enabled, reached as `dashboard.example`): the flags of its
/// container as the CLI parses them, and its pod spec. Checked on the way: the image's
/// CLI, its ServiceAccount bound to nothing and given no token, and the CA it mounts.
fn chart_dashboard(helm_bin: &std::path::Path) -> (dashboard::InCluster, Value) {
    use clap::Parser;
    let objects = helm::template(
        helm_bin,
        &helm::chart("kubeairunway"),
        &[
            ("dashboard.enabled", "true"),
            ("dashboard.allowedHosts[0]", "dashboard.example"),
        ],
    )
    .unwrap();
    let deployment = helm::of_kind(&objects, "Deployment")
        .into_iter()
        .find(|d| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("-dashboard"))
        })
        .expect("the dashboard's Deployment");
    let pod = deployment["spec"]["template"]["spec"].clone();
    let account = pod["serviceAccountName"].as_str().unwrap();
    let sa = helm::of_kind(&objects, "ServiceAccount")
        .into_iter()
        .find(|s| s["metadata"]["name"] == account)
        .expect("its ServiceAccount");
    assert_eq!(sa["automountServiceAccountToken"], false);
    for binding in helm::of_kind(&objects, "ClusterRoleBinding")
        .into_iter()
        .chain(helm::of_kind(&objects, "RoleBinding"))
    {
        assert!(
            !binding["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["name"] == account),
            "the dashboard is granted nothing: {binding}"
        );
    }
    let container = &pod["containers"][0];
    assert_eq!(container["command"], json!(["/kubeairunway"]));
    assert_eq!(
        container["volumeMounts"][0]["mountPath"],
        "/var/run/kubeairunway"
    );
    assert_eq!(pod["volumes"][0]["configMap"]["name"], "kube-root-ca.crt");
    let mut args = vec!["kubeairunway".to_string()];
    args.extend(helm::args_with(container, &[]));
    let cli = kubeairunway_cli::Cli::try_parse_from(&args).unwrap();
    let kubeairunway_cli::Command::Dashboard(parsed) = cli.command else {
        panic!("not the dashboard: {args:?}");
    };
    assert!(parsed.in_cluster.in_cluster);
    assert_eq!(
        parsed.in_cluster.api_ca_file,
        PathBuf::from("/var/run/kubeairunway/kube-root-ca.crt"),
        "the CA the pod mounts"
    );
    (parsed.in_cluster, pod)
}

fn model(name: &str, ns: &str) -> String {
    format!(
        "apiVersion: kubeairunway.ai/v1alpha1\nkind: ModelDeployment\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{model: {{id: Qwen/Qwen3-0.6B}}, engine: {{type: vllm}}, resources: {{gpu: {{count: 1}}}}}}\n"
    )
}

/// The dashboard's answer: status, the `Set-Cookie` value, the JSON body.
async fn send(request: reqwest::RequestBuilder) -> (u16, Option<String>, Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let cookie = response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = response.text().await.unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, cookie, body)
}

#[tokio::test]
async fn in_the_cluster_every_user_signs_in_and_acts_as_themselves() {
    let Some(helm_bin) = helm::require() else {
        return;
    };
    let upstream = crds::all_bundled().unwrap();
    let (cluster, admin) = testing::private_cluster("dashboard-signin", &upstream)
        .await
        .unwrap();
    let ns = cluster.namespace("signin");
    let objects = helm::template(&helm_bin, &helm::chart("kubeairunway"), &[]).unwrap();
    let roles: Vec<Value> = helm::of_kind(&objects, "ClusterRole")
        .into_iter()
        .cloned()
        .collect();
    let viewer = user_token(&cluster, &admin, &roles, (&ns, "viewer"), "view", false).await;
    let editor = user_token(&cluster, &admin, &roles, (&ns, "editor"), "edit", false).await;
    // A tenant: may edit ModelDeployments in this namespace only.
    let tenant = user_token(&cluster, &admin, &roles, (&ns, "tenant"), "edit", true).await;
    // One the admin made: the users' lists show it.
    let mds: Api<ModelDeployment> = Api::namespaced(admin.clone(), &ns);
    let existing: ModelDeployment = serde_saphyr::from_str(&model("existing", &ns)).unwrap();
    mds.create(&PostParams::default(), &existing).await.unwrap();

    // The dashboard as the core chart runs it: its flags parsed by the CLI's own parser;
    // only the pod's addresses (the API server, the mounted CA) are this cluster's.
    let (flags, pod) = chart_dashboard(&helm_bin);
    let flags = dashboard::InCluster {
        api_server: Some(cluster.server().to_string()),
        api_ca_file: cluster.ca_file(),
        ..flags
    };
    assert_eq!(flags.allowed_hosts, ["dashboard.example"]);
    assert_eq!(
        pod["automountServiceAccountToken"], false,
        "no token of its own"
    );
    let sessions = session::Sessions::new(
        dashboard::api_server(&flags).unwrap(),
        flags.session_settings(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(dashboard::api::serve_signed_in(
        listener,
        sessions,
        flags.allowed_hosts.clone(),
        None,
        std::future::pending(),
    ));
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let marked = || {
        let mut h = HeaderMap::new();
        h.insert(CSRF, HeaderValue::from_static("1"));
        h
    };

    // Nobody signed in: asked to sign in, nothing read.
    let (code, _, body) = send(http.get(format!("{base}/api/deployments"))).await;
    assert_eq!((code, &body["signIn"]), (401, &json!(true)), "{body}");
    let (_, _, body) = send(http.get(format!("{base}/api/session"))).await;
    assert_eq!(
        body,
        json!({"mode": "sign-in", "signedIn": false, "user": null})
    );
    // The guards: a sign-in without the page's header, another Host; the allowed host is served.
    let (code, _, _) = send(
        http.post(format!("{base}/api/session"))
            .json(&json!({"token": viewer})),
    )
    .await;
    assert_eq!(code, 403);
    let (code, _, _) = send(
        http.get(format!("{base}/api/session"))
            .header("host", "evil.example"),
    )
    .await;
    assert_eq!(code, 403);
    let (code, _, _) = send(
        http.get(format!("{base}/api/session"))
            .header("host", "dashboard.example:443"),
    )
    .await;
    assert_eq!(code, 200);
    // A token the API server does not accept.
    let (code, cookie, body) = send(
        http.post(format!("{base}/api/session"))
            .headers(marked())
            .json(&json!({"token": "not-a-token"})),
    )
    .await;
    assert_eq!(code, 401, "{body}");
    assert!(cookie.is_none());
    assert_eq!(body["message"], "the API server does not accept this token");

    // The viewer signs in: a cookie scripts and other sites never see.
    let (code, cookie, body) = send(
        http.post(format!("{base}/api/session"))
            .headers(marked())
            .json(&json!({"token": viewer})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    // Who signed in, as the API server says (SelfSubjectReview).
    assert_eq!(body["user"], format!("system:serviceaccount:{ns}:viewer"));
    let cookie = cookie.expect("a session cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    assert!(
        !cookie.contains(&viewer),
        "the token never reaches the browser"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    let (code, _, rows) = send(
        http.get(format!("{base}/api/deployments?namespace={ns}"))
            .header("cookie", &session),
    )
    .await;
    assert_eq!(code, 200);
    let names: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(names, ["existing"], "{rows}");
    // The viewer may not deploy: the API server's refusal, naming the viewer.
    let (code, _, preview) = send(
        http.post(format!("{base}/api/preview"))
            .headers(marked())
            .header("cookie", &session)
            .json(&json!({"manifest": model("by-viewer", &ns)})),
    )
    .await;
    assert_eq!(code, 200);
    let refusal = preview["dryRun"]["message"].as_str().unwrap();
    assert!(
        refusal.contains("forbidden")
            && refusal.contains(&format!("system:serviceaccount:{ns}:viewer")),
        "{refusal}"
    );

    // The editor, through an authenticating proxy's `Authorization` header: deploys.
    let (code, _, body) = send(
        http.post(format!("{base}/api/deployments"))
            .headers(marked())
            .bearer_auth(&editor)
            .json(&json!({"manifest": model("by-editor", &ns)})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    // The API server saw the editor make it, and nobody else make anything for it.
    let creates: Vec<String> = cluster
        .audit_events()
        .unwrap()
        .into_iter()
        .filter(|e| {
            e.verb == "create"
                && e.object_ref.as_ref().is_some_and(|o| {
                    o.resource == "modeldeployments" && o.namespace.as_deref() == Some(&ns)
                })
                && e.response_status.as_ref().is_some_and(|s| s.code == 201)
        })
        .map(|e| e.user.username)
        .collect();
    assert_eq!(
        creates,
        [
            "testcluster-admin".to_string(),
            format!("system:serviceaccount:{ns}:editor")
        ],
        "the admin's ModelDeployment, then the editor's"
    );

    // The tenant may not list every namespace: asked to choose one, then served its own
    // namespace's watch.
    let (code, _, body) = send(
        http.get(format!("{base}/api/deployments"))
            .bearer_auth(&tenant),
    )
    .await;
    assert_eq!(
        (code, &body["namespaceNeeded"]),
        (403, &json!(true)),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(&format!("system:serviceaccount:{ns}:tenant")),
        "{body}"
    );
    let (code, _, rows) = send(
        http.get(format!("{base}/api/deployments?namespace={ns}"))
            .bearer_auth(&tenant),
    )
    .await;
    assert_eq!(code, 200, "{rows}");
    let mut names: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["by-editor", "existing"], "{rows}");
    let (code, _, body) = send(
        http.get(format!("{base}/api/deployments?namespace=default"))
            .bearer_auth(&tenant),
    )
    .await;
    assert_eq!(
        (code, &body["namespaceNeeded"]),
        (403, &json!(false)),
        "{body}"
    );
    let (code, _, body) = send(
        http.get(format!("{base}/api/deployments/{ns}/existing"))
            .bearer_auth(&tenant),
    )
    .await;
    assert_eq!(code, 200, "its Deployment page: {body}");
    // Provider configs are cluster-scoped, out of a tenant's reach: the page says so.
    let selection = body["explanation"]["selectionNow"].as_str().unwrap();
    assert!(
        selection.starts_with("not shown: ") && selection.contains("inferenceproviderconfigs"),
        "{selection}"
    );

    // Signing out ends the session: the cookie is cleared and no longer works.
    let (code, cleared, _) = send(
        http.delete(format!("{base}/api/session"))
            .headers(marked())
            .header("cookie", &session),
    )
    .await;
    assert_eq!(code, 204);
    assert!(cleared.unwrap().contains("Max-Age=0"));
    let (code, _, _) = send(
        http.get(format!("{base}/api/deployments"))
            .header("cookie", &session),
    )
    .await;
    assert_eq!(code, 401);

    // In a real browser: refused a wrong token, signed in, the list, signed out.
    let findings = kubeairunway_e2e::browser::run(
        "dashboard-sign-in.mjs",
        &[&base, &ns, &viewer, &tenant],
        Duration::from_secs(300),
    )
    .await;
    assert_eq!(findings["consoleErrors"], json!([]), "{findings:#}");
    assert_eq!(findings["first"], "Sign in");
    assert_eq!(
        findings["wrongToken"],
        "the API server does not accept this token"
    );
    assert_eq!(findings["after"], "Deployments");
    assert_eq!(
        findings["who"],
        format!("Signed in as system:serviceaccount:{ns}:viewerSign out"),
        "{findings:#}"
    );
    assert!(
        findings["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "existing"),
        "{findings:#}"
    );
    assert_eq!(
        findings["httpOnly"], true,
        "the page's script cannot read it"
    );
    assert_eq!(findings["signedOut"], "Sign in");
    // The tenant is asked for a namespace, then sees its ModelDeployments live.
    assert!(
        findings["tenantAsked"]
            .as_str()
            .unwrap()
            .ends_with("choose a namespace"),
        "{findings:#}"
    );
    let mut tenant_rows: Vec<&str> = findings["tenantRows"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    tenant_rows.sort_unstable();
    assert_eq!(tenant_rows, ["by-editor", "existing"], "{findings:#}");
    assert_eq!(
        findings["tenantBack"],
        format!("#/deployments?namespace={ns}"),
        "back on the list, the namespace chosen before"
    );
    let providers = findings["tenantProviders"].as_str().unwrap();
    assert!(
        providers.contains("forbidden") && providers.contains("inferenceproviderconfigs"),
        "the API server's refusal: {providers}"
    );
    server.abort();
}
