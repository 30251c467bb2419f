//! The gateway's I/O: which APIs the server serves (discovery, again whenever one of their
//! CRDs changes), watch caches of Gateways, HTTPRoutes and the gateway's own objects, and
//! per ModelDeployment the [`decide`](super::decide) decision carried out by server-side
//! apply. A reconcile in steady state makes no request: it reads caches, skips objects
//! whose applied hash is unchanged and a status that is current.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use kubeairunway_sdk::compact::Compact;
use kubeairunway_sdk::conditions::{self, GATEWAY_READY};
use kubeairunway_sdk::{ModelDeployment, reflect};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::decide::{self, Apis, Decision, GatewayRef, Inputs};
use super::render::{GATEWAY_FOR, GATEWAY_GROUP, GATEWAY_VERSION, HASH, POOL_GROUP, POOL_VERSION};
use super::{FIELD_MANAGER, reasons};

/// A cached ModelDeployment.
type Cached = Compact<ModelDeployment>;

/// The gateway's settings.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// The Gateway to route from (`--gateway <namespace>/<name>`); else the only one, else
    /// the one labelled for inference.
    pub gateway: Option<GatewayRef>,
    /// Only this namespace's ModelDeployments (all when `None`).
    pub namespace: Option<String>,
}

/// Read `--gateway`: `<namespace>/<name>`.
pub fn parse_gateway(value: &str) -> Result<GatewayRef, String> {
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{value:?} is not <namespace>/<name>")),
    }
}

/// The CRDs whose arrival or removal changes what the gateway can do.
pub const CRDS: [&str; 3] = [
    "inferencepools.inference.networking.k8s.io",
    "httproutes.gateway.networking.k8s.io",
    "gateways.gateway.networking.k8s.io",
];

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// The Gateway kind.
pub fn gateways() -> ApiResource {
    resource(GATEWAY_GROUP, GATEWAY_VERSION, "Gateway", "gateways")
}

/// The kinds the gateway makes, in the order it applies them (what the pool and route
/// refer to first).
pub fn owned_kinds(apis: Apis) -> Vec<ApiResource> {
    let mut kinds = vec![
        resource("", "v1", "ServiceAccount", "serviceaccounts"),
        resource("rbac.authorization.k8s.io", "v1", "Role", "roles"),
        resource(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
        ),
        resource("", "v1", "ConfigMap", "configmaps"),
        resource("apps", "v1", "Deployment", "deployments"),
        resource("", "v1", "Service", "services"),
    ];
    if apis.inference_pool {
        kinds.push(resource(
            POOL_GROUP,
            POOL_VERSION,
            "InferencePool",
            "inferencepools",
        ));
    }
    if apis.http_route {
        kinds.push(resource(
            GATEWAY_GROUP,
            GATEWAY_VERSION,
            "HTTPRoute",
            "httproutes",
        ));
    }
    kinds
}

/// Which of the APIs the gateway needs the server serves, by discovery.
pub async fn detect(client: &Client) -> Apis {
    let serves = |group_version: &'static str, plurals: &'static [&'static str]| async move {
        client
            .list_api_group_resources(group_version)
            .await
            .is_ok_and(|list| {
                plurals
                    .iter()
                    .all(|p| list.resources.iter().any(|r| r.name == *p))
            })
    };
    Apis {
        inference_pool: serves("inference.networking.k8s.io/v1", &["inferencepools"]).await,
        http_route: serves("gateway.networking.k8s.io/v1", &["httproutes", "gateways"]).await,
    }
}

/// Returns once the APIs served differ from `current`: discovery runs again once the
/// CRD watch has listed (a CRD may have come between the first discovery and the watch)
/// and whenever one of [`CRDS`] changes (a new CRD is served a moment after it is
/// created, so a few more times while it is not).
async fn changed(client: Client, current: Apis) {
    let crds: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client.clone());
    let mut events = watcher(crds, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let attempts = match &event {
            Ok(watcher::Event::InitDone) => 1,
            Ok(watcher::Event::Apply(m) | watcher::Event::Delete(m))
                if CRDS.contains(&m.name_any().as_str()) =>
            {
                5
            }
            _ => continue,
        };
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            if detect(&client).await != current {
                return;
            }
        }
    }
    futures::future::pending::<()>().await;
}

/// Run the gateway over `mds` (core's ModelDeployment cache, see
/// `reconciler::model_deployments`) until `shutdown` completes, with the controller started
/// anew whenever the APIs served change.
pub async fn run(
    client: Client,
    settings: Settings,
    mds: reflect::Shared<Cached>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let apis = detect(&client).await;
        info!(?apis, "gateway: APIs detected");
        tokio::select! {
            () = controller(client.clone(), settings.clone(), &mds, apis) => return,
            () = changed(client.clone(), apis) => info!("gateway: the APIs served changed"),
            () = &mut shutdown => return,
        }
    }
}

/// Shared state of the gateway's reconciles.
struct Context {
    client: Client,
    settings: Settings,
    apis: Apis,
    /// Every Gateway (empty without the Gateway API).
    gateways: Option<Store<DynamicObject>>,
    /// The gateway's objects by kind (label [`GATEWAY_FOR`]), and every HTTPRoute.
    owned: Vec<(ApiResource, Store<DynamicObject>)>,
    /// Every cache above, to tell whether all have been filled.
    caches: Vec<reflect::Cache<DynamicObject>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .field("apis", &self.apis)
            .finish_non_exhaustive()
    }
}

/// The ModelDeployments an object of the gateway's (by its label), or a user's HTTPRoute
/// (by `httpRouteRef`), belongs to.
fn owners(object: &DynamicObject, mds: &Store<Cached>) -> Vec<ObjectRef<Cached>> {
    let namespace = object.namespace().unwrap_or_default();
    if let Some(md) = object.labels().get(GATEWAY_FOR) {
        return vec![ObjectRef::new(md).within(&namespace)];
    }
    let name = object.name_any();
    mds.state()
        .iter()
        .filter(|md| {
            md.namespace().as_deref() == Some(namespace.as_str())
                && decide::http_route_ref(md.gateway().as_ref()) == Some(name.as_str())
        })
        .map(|md| ObjectRef::from_obj(md.as_ref()))
        .collect()
}

/// The controller over ModelDeployments with the caches `apis` allows.
async fn controller(client: Client, settings: Settings, mds: &reflect::Shared<Cached>, apis: Apis) {
    let md_store = mds.cache().store.clone();
    let mut ctl = Controller::for_shared_stream(mds.subscribe(), md_store.clone())
        .with_config(kubeairunway_sdk::process::controller_config());
    let mut owned = Vec::new();
    let mut caches = Vec::new();
    for kind in owned_kinds(apis) {
        let api: Api<DynamicObject> = match &settings.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &kind),
            None => Api::all_with(client.clone(), &kind),
        };
        // Every HTTPRoute: a user's named by httpRouteRef is checked too.
        let config = if kind.kind == "HTTPRoute" {
            watcher::Config::default()
        } else {
            watcher::Config::default().labels(GATEWAY_FOR)
        };
        let (cache, stream) = reflect::cache(api, config, kind.clone(), reflect::strip);
        owned.push((kind.clone(), cache.store.clone()));
        caches.push(cache);
        let store = md_store.clone();
        ctl = ctl.watches_stream_with(stream.applied_objects(), move |o| owners(&o, &store), kind);
    }
    let mut gateway_store = None;
    if apis.http_route {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &gateways());
        let (cache, stream) =
            reflect::cache(api, watcher::Config::default(), gateways(), reflect::strip);
        gateway_store = Some(cache.store.clone());
        caches.push(cache);
        let store = md_store.clone();
        // A Gateway's change (its address) may change every enabled deployment's status.
        ctl = ctl.watches_stream_with(
            stream.applied_objects(),
            move |_| {
                store
                    .state()
                    .iter()
                    .filter(|md| decide::enabled(md.gateway().as_ref()))
                    .map(|md| ObjectRef::from_obj(md.as_ref()))
                    .collect::<Vec<_>>()
            },
            gateways(),
        );
    }
    let ctx = Arc::new(Context {
        client,
        settings,
        apis,
        gateways: gateway_store,
        owned,
        caches,
    });
    ctl.run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                debug!(error = %e, "gateway: reconcile failed");
            }
        })
        .await;
}

/// What a reconcile fails with.
#[derive(Debug, thiserror::Error)]
enum Error {
    /// A request failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The cached ModelDeployment did not read back.
    #[error(transparent)]
    Cache(#[from] kubeairunway_sdk::compact::Error),
}

#[allow(clippy::needless_pass_by_value)] // the signature kube-runtime wants
fn error_policy(md: Arc<Cached>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(name = %md.name_any(), namespace = ?md.namespace(), %error, "gateway: reconcile failed");
    Action::requeue(Duration::from_secs(30))
}

/// Reconcile one ModelDeployment: decide from the caches, apply, prune, report.
async fn reconcile(cached: Arc<Cached>, ctx: Arc<Context>) -> Result<Action, Error> {
    let md = cached.object()?;
    if md.metadata.deletion_timestamp.is_some() {
        // Owner references remove the objects with it.
        return Ok(Action::await_change());
    }
    if !ctx.caches.iter().all(reflect::Cache::is_synced) {
        // Decide only from full caches: an object not yet seen would be applied again,
        // and one of ours would not be pruned.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let decision = decide_for(&md, &ctx);
    let applied = apply_objects(&md, &ctx, &decision).await;
    let mut decision = decision;
    if let Err(e) = &applied {
        let message = match e {
            kube::Error::Api(status) => status.message.clone(),
            other => other.to_string(),
        };
        decision.ready = Some((false, reasons::APPLY_FAILED, message));
    }
    apply_status(&md, &ctx, &decision).await?;
    Ok(applied.map(|()| Action::await_change())?)
}

fn decide_for(md: &ModelDeployment, ctx: &Context) -> Decision {
    let gateways: Vec<Value> = ctx
        .gateways
        .iter()
        .flat_map(Store::state)
        .filter_map(|g| serde_json::to_value(g.as_ref()).ok())
        .collect();
    let namespace = md.namespace().unwrap_or_default();
    let user_route = decide::http_route_ref(md.spec.gateway.as_ref())
        .and_then(|name| cached(ctx, "HTTPRoute", &namespace, name))
        .and_then(|r| serde_json::to_value(r.as_ref()).ok());
    let name = md.name_any();
    let ours = |kind| {
        cached(ctx, kind, &namespace, &name)
            .filter(|o| o.labels().get(GATEWAY_FOR) == Some(&name))
            .and_then(|o| serde_json::to_value(o.as_ref()).ok())
    };
    let live: Vec<Value> = user_route
        .clone()
        .or_else(|| ours("HTTPRoute"))
        .into_iter()
        .chain(ours("InferencePool"))
        .collect();
    decide::decide(&Inputs {
        md,
        apis: ctx.apis,
        gateways: &gateways,
        user_route: user_route.as_ref(),
        flag: ctx.settings.gateway.as_ref(),
        live: &live,
    })
}

fn cached(ctx: &Context, kind: &str, namespace: &str, name: &str) -> Option<Arc<DynamicObject>> {
    let (ar, store) = ctx.owned.iter().find(|(ar, _)| ar.kind == kind)?;
    store.get(&ObjectRef::new_with(name, ar.clone()).within(namespace))
}

/// Apply each wanted object whose hash differs from the cached one's, then delete the
/// gateway's other objects of `md` (when the decision prunes).
async fn apply_objects(
    md: &ModelDeployment,
    ctx: &Context,
    decision: &Decision,
) -> Result<(), kube::Error> {
    let namespace = md.namespace().unwrap_or_default();
    let owner = kubeairunway_sdk::render::owner_reference(md);
    let mut wanted = BTreeSet::new();
    for object in &decision.objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        wanted.insert((kind.to_string(), name.to_string()));
        let Some((ar, _)) = ctx.owned.iter().find(|(ar, _)| ar.kind == kind) else {
            continue;
        };
        let hash = kubeairunway_sdk::upstream::short_hash(object.to_string().as_bytes());
        let current = cached(ctx, kind, &namespace, name);
        if current.is_some_and(|c| c.annotations().get(HASH) == Some(&hash)) {
            continue;
        }
        let mut object = object.clone();
        object["metadata"]["annotations"] = json!({ HASH: hash });
        object["metadata"]["ownerReferences"] = json!(owner.iter().collect::<Vec<_>>());
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, ar);
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await?;
    }
    if decision.prune {
        prune(md, ctx, &wanted).await?;
    }
    Ok(())
}

/// Delete the gateway's objects of `md` that are not `wanted` (kind, name).
async fn prune(
    md: &ModelDeployment,
    ctx: &Context,
    wanted: &BTreeSet<(String, String)>,
) -> Result<(), kube::Error> {
    let namespace = md.namespace().unwrap_or_default();
    let name = md.name_any();
    for (ar, store) in &ctx.owned {
        for object in store.state() {
            let ours = object.labels().get(GATEWAY_FOR) == Some(&name)
                && object.namespace().as_deref() == Some(namespace.as_str());
            if !ours || wanted.contains(&(ar.kind.clone(), object.name_any())) {
                continue;
            }
            let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, ar);
            match api
                .delete(&object.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Apply `status.gateway` and `GatewayReady` under the gateway's field manager, unless
/// current; a decision without them releases both.
async fn apply_status(
    md: &ModelDeployment,
    ctx: &Context,
    decision: &Decision,
) -> Result<(), kube::Error> {
    let status = md.status.as_ref();
    let current_ready = status.and_then(|s| conditions::find(&s.conditions, GATEWAY_READY));
    let ready_current = match (&decision.ready, current_ready) {
        (None, None) => true,
        (Some((ok, reason, message)), Some(c)) => {
            c.status == conditions::Status::from(*ok).as_str()
                && c.reason == *reason
                && &c.message == message
                && c.observed_generation == md.metadata.generation
        }
        _ => false,
    };
    let status_current = status.and_then(|s| s.gateway.as_ref()) == decision.status.as_ref();
    if ready_current && status_current {
        return Ok(());
    }
    let mut body = serde_json::Map::new();
    if let Some(gateway) = &decision.status {
        let value = serde_json::to_value(gateway).map_err(kube::Error::SerdeError)?;
        body.insert("gateway".into(), value);
    }
    if let Some((ok, reason, message)) = &decision.ready {
        let condition = conditions::new(
            current_ready,
            GATEWAY_READY,
            *ok,
            reason,
            message.clone(),
            md.metadata.generation,
            Timestamp::now(),
        );
        body.insert("conditions".into(), json!([condition]));
    }
    let patch = json!({
        "apiVersion": kubeairunway_sdk::API_VERSION,
        "kind": "ModelDeployment",
        "status": body,
    });
    let api: Api<ModelDeployment> =
        Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default());
    api.patch_status(
        &md.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
}
