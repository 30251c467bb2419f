//! The dashboard's HTTP server: its page, a JSON API and a live stream.
//!
//! Every request acts as one identity: the kubeconfig's (the local dashboard), or the
//! signed-in user's in the cluster ([`super::session`]). Reads come from that identity's
//! watch cache of ModelDeployments ([`View`]: the list and the live stream make no request
//! of their own); a Deployment page reads what `explain` reads; changes are the user's own
//! requests (create, a server-side dry run first, delete, scale).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kubeairunway_sdk::ModelDeployment;
use serde::Deserialize;
use serde_json::{Value, json};

use super::rows::rows;
use super::session::{self, SignInError, User};
use super::view::{Feed, Unseen, View};
use super::{guard, session::Sessions};
use crate::builtin::{BuiltIns, ProviderFlags};
use crate::crds::UpstreamCrds;

/// The field manager of what the dashboard creates and changes.
pub const FIELD_MANAGER: &str = "kubeairunway-dashboard";

/// The page's files, embedded.
const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");
const ICON: &str = include_str!("assets/favicon.svg");

struct Inner {
    /// Whom requests act as.
    access: Access,
    /// The Hugging Face hub the Models page searches (`None`: the catalogue only).
    hub: Option<kubeairunway_modelcache_hub::Hub>,
    port: u16,
    /// Host names served besides this port's loopback addresses.
    hosts: Vec<String>,
    builtins: BuiltIns,
    crds: UpstreamCrds,
}

/// Whom the dashboard's requests to the API server act as.
enum Access {
    /// The kubeconfig's identity, for everyone who reaches the (loopback) server.
    Kubeconfig(User),
    /// Each signed-in user, with their own token ([`session`]).
    SignIn(Box<Sessions>),
}

type Shared = Arc<Inner>;

/// In the cluster, a session's watch of ModelDeployments stops this long after its last
/// use with no live list open (sessions of users elsewhere hold no copy of the cluster).
const FEED_IDLE: Duration = Duration::from_secs(120);

/// Serve the dashboard on `listener` as `client`'s identity until `shutdown` completes,
/// searching the Hugging Face hub `HF_ENDPOINT` names (else huggingface.co).
pub async fn serve(
    listener: tokio::net::TcpListener,
    client: Client,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with(
        listener,
        client,
        Some(kubeairunway_modelcache_hub::HubOptions::from_env()),
        shutdown,
    )
    .await
}

/// [`serve`], searching the hub `hub` reaches (`None`: the built-in catalogue only).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    client: Client,
    hub: Option<kubeairunway_modelcache_hub::HubOptions>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let user = User {
        view: Arc::new(View::start(client)),
        name: None,
    };
    serve_as(
        listener,
        Access::Kubeconfig(user),
        Vec::new(),
        hub,
        shutdown,
    )
    .await
}

/// Serve the dashboard in the cluster: every user signs in ([`session`]) and acts as
/// themselves; requests may name this server by the `hosts` given (its Service or
/// Ingress names) as well as by its loopback addresses.
pub async fn serve_signed_in(
    listener: tokio::net::TcpListener,
    sessions: Sessions,
    hosts: Vec<String>,
    hub: Option<kubeairunway_modelcache_hub::HubOptions>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_as(
        listener,
        Access::SignIn(Box::new(sessions)),
        hosts,
        hub,
        shutdown,
    )
    .await
}

async fn serve_as(
    listener: tokio::net::TcpListener,
    access: Access,
    hosts: Vec<String>,
    hub: Option<kubeairunway_modelcache_hub::HubOptions>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let hub = hub
        .map(|o| kubeairunway_modelcache_hub::Hub::new(&o))
        .transpose()?;
    let port = listener.local_addr()?.port();
    let crds = UpstreamCrds::default();
    let builtins = BuiltIns::for_crds(&ProviderFlags::default(), &crds)?;
    let state = Arc::new(Inner {
        access,
        hub,
        port,
        hosts,
        builtins,
        crds,
    });
    // Ended sessions stop their watches even when nobody comes back for them.
    let sweeper = tokio::spawn({
        let state = state.clone();
        async move {
            let mut every = tokio::time::interval(Duration::from_secs(60));
            loop {
                every.tick().await;
                if let Access::SignIn(sessions) = &state.access {
                    sessions.sweep(FEED_IDLE);
                }
            }
        }
    });
    let served = axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await;
    sweeper.abort();
    Ok(served?)
}

fn router(state: Shared) -> Router {
    // What needs an identity: a signed-in user's, or the kubeconfig's.
    let private = Router::new()
        .route("/api/deployments", get(list).post(create))
        .route("/api/deployments/stream", get(stream))
        .route(
            "/api/deployments/{namespace}/{name}",
            get(detail).delete(delete),
        )
        .route("/api/deployments/{namespace}/{name}/scale", put(scale))
        .route("/api/deployments/{namespace}/{name}/pods", get(pods))
        .route(
            "/api/deployments/{namespace}/{name}/pods/{pod}/logs",
            get(logs),
        )
        .route(
            "/api/deployments/{namespace}/{name}/chat",
            axum::routing::post(chat),
        )
        .route("/api/preview", axum::routing::post(preview))
        .route("/api/providers", get(providers))
        .route("/api/hub/search", get(hub_search))
        .route("/api/hub/fit", get(hub_fit))
        .route(
            "/api/gpus",
            get(|Extension(user): Extension<User>| async move {
                Json(super::models::gpus(&user.view.client).await)
            }),
        )
        .route(
            "/api/caches",
            get(|Extension(user): Extension<User>| async move {
                Json(super::caches::overview(&user.view.client).await)
            }),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), identified));
    Router::new()
        .route(
            "/",
            get(|| async { page(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/app.js",
            get(|| async { page(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/app.css",
            get(|| async { page(STYLE, "text/css; charset=utf-8") }),
        )
        .route(
            "/favicon.svg",
            get(|| async { page(ICON, "image/svg+xml") }),
        )
        .route(
            "/api/session",
            get(session_info).post(sign_in).delete(sign_out),
        )
        .route("/api/models", get(models))
        .merge(private)
        .layer(middleware::from_fn_with_state(state.clone(), guarded))
        // The kubelet's probes name the pod's address as Host: this answers anyone, with
        // nothing but that the server is up.
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

/// The user a request acts as, or 401 (the page then asks for a token).
async fn identified(State(state): State<Shared>, mut request: Request, next: Next) -> Response {
    let user = match &state.access {
        Access::Kubeconfig(user) => Ok(user.clone()),
        Access::SignIn(sessions) => match session::bearer_token(request.headers()) {
            Some(token) => sessions.bearer(token).await.map_err(|e| e.to_string()),
            None => session::session_id(request.headers())
                .and_then(|id| sessions.get(id))
                .ok_or_else(|| "sign in with a Kubernetes bearer token".to_string()),
        },
    };
    match user {
        Ok(user) => {
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        Err(message) => (
            StatusCode::UNAUTHORIZED,
            Json(json!({ "message": message, "signIn": true })),
        )
            .into_response(),
    }
}

/// How the page signs in: the mode, and the user when signed in.
async fn session_info(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let (mode, user) = match &state.access {
        Access::Kubeconfig(_) => ("kubeconfig", None),
        Access::SignIn(sessions) => (
            "sign-in",
            session::session_id(&headers).and_then(|id| sessions.get(id)),
        ),
    };
    Json(json!({
        "mode": mode,
        "signedIn": mode == "kubeconfig" || user.is_some(),
        "user": user.and_then(|u| u.name),
    }))
    .into_response()
}

#[derive(Deserialize)]
struct Token {
    token: String,
}

/// Sign in with a bearer token: checked by the API server, then a session cookie.
async fn sign_in(State(state): State<Shared>, Json(body): Json<Token>) -> Response {
    let Access::SignIn(sessions) = &state.access else {
        return bad_request("this dashboard acts as its kubeconfig's identity: no sign-in");
    };
    match sessions.sign_in(&body.token).await {
        Ok((id, user)) => (
            [(
                header::SET_COOKIE,
                session::cookie(&id, sessions.settings()),
            )],
            Json(json!({ "user": user.name })),
        )
            .into_response(),
        Err(e @ (SignInError::Refused | SignInError::Empty)) => (
            StatusCode::UNAUTHORIZED,
            Json(json!({ "message": e.to_string(), "signIn": true })),
        )
            .into_response(),
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            Json(json!({ "message": e.to_string() })),
        )
            .into_response(),
    }
}

/// End the session (its watch stops) and clear the cookie.
async fn sign_out(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let Access::SignIn(sessions) = &state.access else {
        return StatusCode::NO_CONTENT.into_response();
    };
    if let Some(id) = session::session_id(&headers) {
        sessions.sign_out(id);
    }
    (
        StatusCode::NO_CONTENT,
        [(
            header::SET_COOKIE,
            session::cleared_cookie(sessions.settings()),
        )],
    )
        .into_response()
}

fn page(body: &'static str, content_type: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// [`guard::refusal`] on every request, and headers that keep the page to itself: its
/// own scripts only, never framed, no referrer.
async fn guarded(State(state): State<Shared>, request: Request, next: Next) -> Response {
    if let Some(why) = guard::refusal(
        request.method(),
        request.headers(),
        state.port,
        &state.hosts,
    ) {
        return (StatusCode::FORBIDDEN, why).into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// An error as the page shows it: the API server's own message and code where it gave one.
fn failure(e: &kube::Error) -> Response {
    let (code, message) = match e {
        kube::Error::Api(s) => (
            StatusCode::from_u16(s.code).unwrap_or(StatusCode::BAD_GATEWAY),
            s.message.clone(),
        ),
        other => (StatusCode::BAD_GATEWAY, other.to_string()),
    };
    (code, Json(json!({ "message": message }))).into_response()
}

/// A read that failed: with the API server's code when it refused (403 to a user without
/// the right), else 502; the whole message either way.
fn reading_failed(e: &anyhow::Error) -> Response {
    let code = match e.downcast_ref::<kube::Error>() {
        Some(kube::Error::Api(s)) => {
            StatusCode::from_u16(s.code).unwrap_or(StatusCode::BAD_GATEWAY)
        }
        _ => StatusCode::BAD_GATEWAY,
    };
    (code, Json(json!({ "message": format!("{e:#}") }))).into_response()
}

fn bad_request(message: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "message": message }))).into_response()
}

#[derive(Deserialize)]
struct Filter {
    namespace: Option<String>,
}

fn current_rows(feed: &Feed, namespace: Option<&str>) -> Vec<super::rows::Row> {
    let cached = feed.mds.store.state();
    rows(
        cached.iter().map(AsRef::as_ref),
        namespace,
        Timestamp::now(),
    )
}

/// The API server's refusal of a watch: 403 with its words; `namespaceNeeded` when every
/// namespace was refused and the page should ask for one.
fn unseen(why: &Unseen) -> Response {
    (
        StatusCode::FORBIDDEN,
        Json(json!({
            "message": why.to_string(),
            "namespaceNeeded": matches!(why, Unseen::NamespaceNeeded(_)),
        })),
    )
        .into_response()
}

async fn list(Extension(user): Extension<User>, Query(filter): Query<Filter>) -> Response {
    let namespace = filter.namespace.as_deref();
    match user.view.feed(namespace).await {
        Ok(feed) => Json(current_rows(&feed, namespace)).into_response(),
        Err(why) => unseen(&why),
    }
}

/// The rows once the cache is filled, then again after each change (at most every
/// 250 ms), as `deployments` events; 403 (as [`list`]) when the watch is refused.
async fn stream(Extension(user): Extension<User>, Query(filter): Query<Filter>) -> Response {
    let feed = match user.view.feed(filter.namespace.as_deref()).await {
        Ok(feed) => feed,
        Err(why) => return unseen(&why),
    };
    let changes = feed.changes.clone();
    let events = futures::stream::unfold(
        (feed, changes, filter.namespace, true),
        |(feed, mut changes, namespace, first)| async move {
            if first {
                feed.mds.synced().await;
            } else {
                changes.changed().await.ok()?;
                tokio::time::sleep(Duration::from_millis(250)).await;
                changes.borrow_and_update();
            }
            let rows = current_rows(&feed, namespace.as_deref());
            let event = Event::default()
                .event("deployments")
                .json_data(rows)
                .unwrap_or_else(|_| Event::default().comment("unserializable"));
            Some((
                Ok::<_, Infallible>(event),
                (feed, changes, namespace, false),
            ))
        },
    );
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn detail(
    Extension(user): Extension<User>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let Some(md) = user.view.get(&namespace, &name).await else {
        return not_found(&namespace, &name);
    };
    match crate::explain::describe(&user.view.client, &md).await {
        Ok(explanation) => Json(json!({
            "explanation": explanation,
            "manifest": crate::output::yaml(md.as_ref()).unwrap_or_default(),
            "spec": md.spec,
        }))
        .into_response(),
        Err(e) => reading_failed(&e),
    }
}

fn not_found(namespace: &str, name: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "message": format!("modeldeployment {namespace}/{name} not found") })),
    )
        .into_response()
}

async fn pods(
    Extension(user): Extension<User>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let Some(md) = user.view.get(&namespace, &name).await else {
        return not_found(&namespace, &name);
    };
    match super::serving::pods(&user.view.client, &md).await {
        Ok(rows) => Json(rows).into_response(),
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize)]
struct Container {
    container: Option<String>,
}

/// A pod's log, or why there is none: an API server that serves no logs (no kubelet, or
/// not allowed) is an answer, not a failure of the page.
async fn logs(
    Extension(user): Extension<User>,
    Path((namespace, _name, pod)): Path<(String, String, String)>,
    Query(q): Query<Container>,
) -> Response {
    match super::serving::logs(&user.view.client, &namespace, &pod, q.container).await {
        Ok(text) => Json(json!({ "text": text })).into_response(),
        Err(kube::Error::Api(s)) => Json(json!({ "error": s.message })).into_response(),
        Err(e) => Json(json!({ "error": e.to_string() })).into_response(),
    }
}

#[derive(Deserialize)]
struct Conversation {
    messages: Value,
}

/// The chat through the API server's service proxy, the engine's stream passed through;
/// the API server's (or engine's) refusal with its code and message.
async fn chat(
    Extension(user): Extension<User>,
    Path((namespace, name)): Path<(String, String)>,
    Json(body): Json<Conversation>,
) -> Response {
    let Some(md) = user.view.get(&namespace, &name).await else {
        return not_found(&namespace, &name);
    };
    let response = match super::serving::chat(&user.view.client, &md, &body.messages).await {
        Ok(r) => r,
        Err(message) => {
            return (StatusCode::CONFLICT, Json(json!({ "message": message }))).into_response();
        }
    };
    let status = response.status();
    if !status.is_success() {
        let bytes = response
            .into_body()
            .collect_bytes()
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes).to_string();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or(text);
        return (
            StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY),
            Json(json!({ "message": format!("through the service proxy: {message}") })),
        )
            .into_response();
    }
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(axum::body::Body::new(response.into_body()))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn delete(
    Extension(user): Extension<User>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let api: Api<ModelDeployment> = Api::namespaced(user.view.client.clone(), &namespace);
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => StatusCode::ACCEPTED.into_response(),
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize)]
struct Replicas {
    replicas: i32,
}

async fn scale(
    Extension(user): Extension<User>,
    Path((namespace, name)): Path<(String, String)>,
    Json(body): Json<Replicas>,
) -> Response {
    let api: Api<ModelDeployment> = Api::namespaced(user.view.client.clone(), &namespace);
    let patch = Patch::Merge(json!({ "spec": { "replicas": body.replicas } }));
    match api
        .patch_scale(&name, &PatchParams::default(), &patch)
        .await
    {
        Ok(scale) => Json(scale).into_response(),
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize)]
struct Manifest {
    /// A ModelDeployment as YAML (or JSON).
    manifest: String,
}

/// The ModelDeployment in `text`, in the client's default namespace unless it names one.
fn parse(text: &str, default_namespace: &str) -> Result<ModelDeployment, String> {
    let value: Value =
        serde_saphyr::from_str(text).map_err(|e| format!("the manifest is not YAML: {e}"))?;
    let kind = value["kind"].as_str().unwrap_or_default();
    if kind != "ModelDeployment" {
        return Err(format!("the manifest is a {kind:?}, not a ModelDeployment"));
    }
    let mut md: ModelDeployment = serde_path_to_error::deserialize(value).map_err(|e| {
        format!(
            "the manifest is not a ModelDeployment: {}: {}",
            e.path(),
            e.inner()
        )
    })?;
    if md.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        md.metadata.namespace = Some(default_namespace.to_string());
    }
    Ok(md)
}

/// Before anything is applied: the API server's verdict (a dry-run create, through its
/// schema, rules and admission webhooks), then what `render` previews: the engine, the
/// provider and why, and the exact objects it would apply.
async fn preview(
    State(state): State<Shared>,
    Extension(user): Extension<User>,
    Json(body): Json<Manifest>,
) -> Response {
    let md = match parse(&body.manifest, user.view.client.default_namespace()) {
        Ok(md) => md,
        Err(message) => return bad_request(&message),
    };
    let api: Api<ModelDeployment> = Api::namespaced(
        user.view.client.clone(),
        &md.namespace().unwrap_or_default(),
    );
    let params = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    let dry_run = match api.create(&params, &md).await {
        Ok(_) => json!({ "ok": true, "message": "the API server accepts it (dry run)" }),
        Err(kube::Error::Api(s)) => json!({ "ok": false, "message": s.message }),
        Err(e) => json!({ "ok": false, "message": e.to_string() }),
    };
    let render = match crate::render::preview(
        &md,
        None,
        &state.builtins,
        &state.crds,
        Timestamp::now(),
    ) {
        Ok(p) => json!({
            "engine": p.engine,
            "provider": p.provider,
            "reason": p.reason,
            "warnings": p.warnings,
            "objects": p.objects.iter().map(|o| crate::output::yaml(o).unwrap_or_default()).collect::<Vec<_>>(),
        }),
        Err(message) => json!({ "error": message }),
    };
    Json(json!({
        "manifest": crate::output::yaml(&md).unwrap_or_default(),
        "modelDeployment": md,
        "dryRun": dry_run,
        "render": render,
    }))
    .into_response()
}

async fn create(Extension(user): Extension<User>, Json(body): Json<Manifest>) -> Response {
    let md = match parse(&body.manifest, user.view.client.default_namespace()) {
        Ok(md) => md,
        Err(message) => return bad_request(&message),
    };
    let namespace = md.namespace().unwrap_or_default();
    let api: Api<ModelDeployment> = Api::namespaced(user.view.client.clone(), &namespace);
    let params = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    match api.create(&params, &md).await {
        Ok(created) => (
            StatusCode::CREATED,
            Json(json!({ "namespace": namespace, "name": created.name_any() })),
        )
            .into_response(),
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FitQuery {
    context: Option<u64>,
    dtype: Option<String>,
    gpu_memory_gb: Option<u64>,
}

/// The catalogue with each model's fit at the context length, dtype and GPU memory asked.
async fn models(Query(q): Query<FitQuery>) -> Response {
    let dtype = q.dtype.unwrap_or_else(|| "bf16".into());
    let Some(eighths) = super::models::eighths(&dtype) else {
        return bad_request(&format!(
            "dtype {dtype:?}: one of fp32, bf16, fp16, fp8, int8, int4"
        ));
    };
    let context = q.context.unwrap_or(8192);
    let gpu_mb = q.gpu_memory_gb.unwrap_or(80).max(1) * 1000;
    let fits: Vec<_> = super::models::CATALOGUE
        .iter()
        .map(|m| super::models::fit(m, context, eighths, gpu_mb))
        .collect();
    Json(fits).into_response()
}

#[derive(Deserialize)]
struct SearchQuery {
    q: String,
}

/// Text-generation models of the hub whose id contains `q`; when the hub cannot be
/// reached, an empty list and why (the catalogue works offline).
async fn hub_search(State(state): State<Shared>, Query(q): Query<SearchQuery>) -> Response {
    let Some(hub) = &state.hub else {
        return Json(json!({ "models": [], "note": "Hugging Face search is off" })).into_response();
    };
    match hub.search(q.q.trim(), 20).await {
        Ok(found) => Json(json!({ "models": found })).into_response(),
        Err(e) => Json(json!({ "models": [], "note": e.to_string() })).into_response(),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HubFitQuery {
    id: String,
    context: Option<u64>,
    dtype: Option<String>,
    gpu_memory_gb: Option<u64>,
}

/// The fit of a hub model, from its parameter count (safetensors) and its `config.json`.
async fn hub_fit(State(state): State<Shared>, Query(q): Query<HubFitQuery>) -> Response {
    let Some(hub) = &state.hub else {
        return bad_request("Hugging Face search is off");
    };
    let dtype = q.dtype.unwrap_or_else(|| "bf16".into());
    let Some(eighths) = super::models::eighths(&dtype) else {
        return bad_request(&format!(
            "dtype {dtype:?}: one of fp32, bf16, fp16, fp8, int8, int4"
        ));
    };
    let repo = match kubeairunway_modelcache_hub::RepoId::parse(&q.id) {
        Ok(r) => r,
        Err(e) => return bad_request(&e.to_string()),
    };
    let unreachable = |e: kubeairunway_modelcache_hub::Error| {
        (
            StatusCode::BAD_GATEWAY,
            Json(json!({ "message": e.to_string() })),
        )
            .into_response()
    };
    let (params, config) = match tokio::try_join!(hub.parameters(&repo), hub.config(&repo)) {
        Ok(both) => both,
        Err(e) => return unreachable(e),
    };
    let Some(params) = params else {
        return bad_request(&format!(
            "{repo}: the hub reports no parameter count (no safetensors files)"
        ));
    };
    match super::models::from_config(repo.as_str(), params, &config) {
        Ok(model) => Json(super::models::fit(
            &model,
            q.context.unwrap_or(8192),
            eighths,
            q.gpu_memory_gb.unwrap_or(80).max(1) * 1000,
        ))
        .into_response(),
        Err(message) => bad_request(&format!("{repo}: {message}")),
    }
}

async fn providers(Extension(user): Extension<User>) -> Response {
    match crate::providers::list(&user.view.client).await {
        Ok(configs) => Json(crate::providers::entries(&configs, Timestamp::now())).into_response(),
        Err(e) => reading_failed(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_is_read_as_the_cluster_would_and_gets_a_namespace() {
        let md = parse(
            "apiVersion: kubeairunway.ai/v1alpha1\nkind: ModelDeployment\nmetadata: {name: a}\nspec: {model: {id: m}}\n",
            "team",
        )
        .unwrap();
        assert_eq!(md.namespace().as_deref(), Some("team"));
        assert_eq!(
            parse("kind: ConfigMap\n", "team").unwrap_err(),
            "the manifest is a \"ConfigMap\", not a ModelDeployment"
        );
        let err = parse(
            "apiVersion: kubeairunway.ai/v1alpha1\nkind: ModelDeployment\nmetadata: {name: a}\nspec: {scaling: {replicas: many}}\n",
            "team",
        )
        .unwrap_err();
        assert!(
            err.starts_with("the manifest is not a ModelDeployment: spec.scaling.replicas"),
            "{err}"
        );
        assert!(
            parse("{", "team")
                .unwrap_err()
                .starts_with("the manifest is not YAML")
        );
    }
}
