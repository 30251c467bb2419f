//! The objects a provider owns, read from watch caches instead of the API server.
//!
//! One reflector per kind the provider renders (the upstream kind and every other kind,
//! started on first use), cluster-wide, filtered by the server on the label
//! `kubeairunway.ai/provider=<name>`, with `managedFields` and the last-applied annotation
//! dropped before anything is stored, and each object's body kept as JSON text
//! ([`Compact`]), its labels in that text too. Beside each store, an index from a ModelDeployment
//! (namespace and name, from the label `kubeairunway.ai/model-deployment`) to the names of
//! its objects of that kind, kept from the same event stream (relists swap it whole, as
//! the store does).
//!
//! Every change of an owned object asks for its ModelDeployment to be reconciled, except
//! the change this provider just wrote itself (recognised by the resourceVersion its
//! apply returned): a reconcile never wakes itself up. The watch event of a write can
//! arrive before the write's response; an event for an object being written is held
//! until the response tells whether it was ours.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, ObjectMeta};
use kube::core::DynamicResourceScope;
use kube::discovery::ApiResource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::api::ModelDeployment;
use crate::compact::Compact;
use crate::{labels, reflect};

/// How long a reconcile waits for a kind's cache to fill when it first needs it.
const SYNC_WAIT: Duration = Duration::from_secs(30);

/// An owned object as the caches keep it: a [`DynamicObject`] whose kind, the dynamic
/// type kube's store keys every object by (`ObjectRef`), is one `Arc<ApiResource>` shared
/// by the whole cache instead of a copy of its five strings per object (about 200 bytes
/// each, in the store's key).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
struct Owned(DynamicObject);

impl Resource for Owned {
    type DynamicType = Arc<ApiResource>;
    type Scope = DynamicResourceScope;

    fn group(dt: &Arc<ApiResource>) -> Cow<'_, str> {
        DynamicObject::group(dt)
    }

    fn version(dt: &Arc<ApiResource>) -> Cow<'_, str> {
        DynamicObject::version(dt)
    }

    fn kind(dt: &Arc<ApiResource>) -> Cow<'_, str> {
        DynamicObject::kind(dt)
    }

    fn api_version(dt: &Arc<ApiResource>) -> Cow<'_, str> {
        DynamicObject::api_version(dt)
    }

    fn plural(dt: &Arc<ApiResource>) -> Cow<'_, str> {
        DynamicObject::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// `(namespace, ModelDeployment name)`.
type MdKey = (String, String);

/// The names of a ModelDeployment's objects of one kind, sorted: usually one, and a
/// B-tree set would allocate a node of eleven for it.
type Names = Vec<String>;

#[derive(Default)]
struct Index {
    current: HashMap<MdKey, Names>,
    /// Being rebuilt by a relist; swapped in at its end.
    pending: Option<HashMap<MdKey, Names>>,
}

/// The top-level field of a cached owned object's text that holds its labels (no
/// Kubernetes object has a field of that name), so that its parsed metadata holds no
/// label map: a B-tree node of about 540 bytes per object, whatever few labels it holds.
/// [`OwnedCache::get`] puts them back.
const LABELS_IN_TEXT: &str = "kubeairunway.ai/labels";

/// Shape an owned object before it is kept: [`reflect::strip`], and its labels moved
/// into its text.
fn keep(object: &mut Owned) {
    reflect::strip(object);
    let Some(labels) = object.0.metadata.labels.take() else {
        return;
    };
    if object.0.data.is_null() {
        object.0.data = serde_json::Value::Object(serde_json::Map::new());
    }
    if let Some(fields) = object.0.data.as_object_mut() {
        fields.insert(LABELS_IN_TEXT.into(), serde_json::json!(labels));
    }
}

/// The object as it was before [`keep`] (but for what [`reflect::strip`] drops).
fn restored(Owned(mut object): Owned) -> DynamicObject {
    if let Some(labels) = object
        .data
        .as_object_mut()
        .and_then(|fields| fields.remove(LABELS_IN_TEXT))
    {
        object.metadata.labels = serde_json::from_value(labels).ok();
    }
    object
}

/// An owned object as it is kept.
fn kept(object: DynamicObject) -> Option<Compact<Owned>> {
    let mut object = Owned(object);
    keep(&mut object);
    Compact::new(object).ok()
}

/// The ModelDeployment a kept object is labelled for, read from its text.
fn md_key(object: &Compact<Owned>) -> Option<MdKey> {
    #[derive(Deserialize)]
    struct Labelled {
        #[serde(rename = "kubeairunway.ai/labels")]
        labels: Option<std::collections::BTreeMap<String, String>>,
    }
    let mut labelled = object.peek::<Labelled>()?.labels?;
    Some((
        object.namespace()?,
        labelled.remove(labels::MODEL_DEPLOYMENT)?,
    ))
}

/// The ModelDeployment the object of `event` is labelled for (`None` for the events that
/// carry no object): read once per event, for the index and the wake-up both.
fn event_md(event: &watcher::Event<Compact<Owned>>) -> Option<MdKey> {
    match event {
        watcher::Event::InitApply(o) | watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
            md_key(o)
        }
        watcher::Event::Init | watcher::Event::InitDone => None,
    }
}

impl Index {
    fn insert(map: &mut HashMap<MdKey, Names>, key: MdKey, name: String) {
        let names = map.entry(key).or_default();
        if let Err(at) = names.binary_search(&name) {
            names.insert(at, name);
        }
    }

    /// Follow `event`, whose object is labelled for the ModelDeployment `md`
    /// ([`event_md`]).
    fn event(&mut self, event: &watcher::Event<Compact<Owned>>, md: Option<&MdKey>) {
        match (event, md) {
            (watcher::Event::Init, _) => self.pending = Some(HashMap::new()),
            (watcher::Event::InitApply(o), Some(key)) => {
                if let Some(p) = self.pending.as_mut() {
                    Self::insert(p, key.clone(), o.name_any());
                }
            }
            (watcher::Event::InitDone, _) => {
                if let Some(p) = self.pending.take() {
                    self.current = p;
                }
            }
            (watcher::Event::Apply(o), Some(key)) => {
                Self::insert(&mut self.current, key.clone(), o.name_any());
            }
            (watcher::Event::Delete(o), Some(key)) => {
                if let Some(names) = self.current.get_mut(key) {
                    let gone = o.name_any();
                    names.retain(|n| *n != gone);
                    if names.is_empty() {
                        self.current.remove(key);
                    }
                }
            }
            // An object labelled for no ModelDeployment is not indexed.
            (_, None) => {}
        }
    }
}

struct KindCache {
    resource: Arc<ApiResource>,
    cache: reflect::Cache<Compact<Owned>>,
    index: Arc<RwLock<Index>>,
    task: tokio::task::AbortHandle,
}

/// Key of a kind: `apiVersion` and kind.
fn kind_key(r: &ApiResource) -> (String, String) {
    (r.api_version.clone(), r.kind.clone())
}

/// Key of one object for the own-writes filter.
type ObjectKey = (String, String, String, String);

fn object_key(r: &ApiResource, ns: &str, name: &str) -> ObjectKey {
    (
        r.api_version.clone(),
        r.kind.clone(),
        ns.to_string(),
        name.to_string(),
    )
}

/// What this provider knows of its own writes of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
enum OwnWrite {
    /// A write is under way; the resourceVersion of any watch event seen meanwhile.
    InFlight(Option<String>),
    /// The resourceVersion the last write returned.
    Written(String),
}

/// Whether a watch event of an object at `rv` wakes its ModelDeployment, given what we
/// know of our own writes of it (`own`, updated when the event is held because a write is
/// under way). What is known is forgotten once it has served: at the event of our own
/// write (a later event wakes as it would with nothing known) and at a deletion, so that
/// in steady state nothing is held per object.
fn wakes(own: &mut Option<OwnWrite>, rv: Option<&str>, deleted: bool) -> bool {
    match (own.as_mut(), deleted) {
        (_, true) => {
            *own = None;
            true
        }
        (None, false) => true,
        (Some(OwnWrite::Written(ours)), false) => {
            let wake = rv != Some(ours.as_str());
            if !wake {
                *own = None;
            }
            wake
        }
        (Some(OwnWrite::InFlight(seen)), false) => {
            *seen = rv.map(str::to_string);
            false
        }
    }
}

/// The owned-object caches of one provider, for one term of leadership.
pub(crate) struct OwnedCache {
    client: Client,
    selector: String,
    kinds: Mutex<HashMap<(String, String), KindCache>>,
    /// This provider's own writes, by object.
    own_writes: Arc<Mutex<HashMap<ObjectKey, OwnWrite>>>,
    /// Reconcile requests for ModelDeployments whose objects changed.
    trigger: Option<mpsc::UnboundedSender<ObjectRef<ModelDeployment>>>,
}

impl std::fmt::Debug for OwnedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedCache")
            .field("selector", &self.selector)
            .finish_non_exhaustive()
    }
}

impl OwnedCache {
    /// Caches of the objects labelled for `provider`; changes are reported on `trigger`
    /// (`None`: caches that never watch, for single reconcile steps in unit tests).
    pub(crate) fn new(
        client: Client,
        provider: &str,
        trigger: Option<mpsc::UnboundedSender<ObjectRef<ModelDeployment>>>,
    ) -> Self {
        Self {
            client,
            selector: format!("{}={provider}", labels::PROVIDER),
            kinds: Mutex::default(),
            own_writes: Arc::default(),
            trigger,
        }
    }

    /// Start watching `resource` unless it is watched already (or held fixed).
    pub(crate) fn watch(&self, resource: &ApiResource) {
        let Ok(mut kinds) = self.kinds.lock() else {
            return;
        };
        if kinds.contains_key(&kind_key(resource)) {
            return;
        }
        let Some(trigger) = self.trigger.clone() else {
            return;
        };
        let index = Arc::new(RwLock::new(Index::default()));
        let shared = Arc::new(resource.clone());
        let api: Api<Owned> = Api::all_with(self.client.clone(), &shared);
        let (cache, stream) = reflect::compact_cache(
            api,
            watcher::Config::default().labels(&self.selector),
            shared.clone(),
            keep,
        );
        let (idx, own, res) = (index.clone(), self.own_writes.clone(), resource.clone());
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                let md = event_md(&event);
                if let Ok(mut i) = idx.write() {
                    i.event(&event, md.as_ref());
                }
                let (watcher::Event::Apply(o) | watcher::Event::Delete(o)) = &event else {
                    continue;
                };
                let Some((ns, md)) = md else {
                    continue;
                };
                let deleted = matches!(&event, watcher::Event::Delete(_));
                let wake = own.lock().map_or(true, |mut w| {
                    let key = object_key(&res, &ns, &o.name_any());
                    let mut entry = w.get(&key).cloned();
                    let wake = wakes(&mut entry, o.resource_version().as_deref(), deleted);
                    match entry {
                        Some(entry) => w.insert(key, entry),
                        None => w.remove(&key),
                    };
                    wake
                });
                if wake {
                    let _ = trigger.send(ObjectRef::new(&md).within(&ns));
                }
            }
        })
        .abort_handle();
        kinds.insert(
            kind_key(resource),
            KindCache {
                resource: shared,
                cache,
                index,
                task,
            },
        );
    }

    /// Hold exactly `objects` of `resource`, with no watch behind them (single reconcile
    /// steps in unit tests).
    pub(crate) fn fixed(&self, resource: &ApiResource, objects: Vec<DynamicObject>) {
        let objects: Vec<_> = objects.into_iter().filter_map(kept).collect();
        let mut index = Index::default();
        for o in &objects {
            if let Some(key) = md_key(o) {
                Index::insert(&mut index.current, key, o.name_any());
            }
        }
        let task = tokio::spawn(async {}).abort_handle();
        let shared = Arc::new(resource.clone());
        if let Ok(mut kinds) = self.kinds.lock() {
            kinds.insert(
                kind_key(resource),
                KindCache {
                    resource: shared.clone(),
                    cache: reflect::Cache::fixed(objects, shared),
                    index: Arc::new(RwLock::new(index)),
                    task,
                },
            );
        }
    }

    /// The cache of `resource`, and its shared kind.
    fn cache(
        &self,
        resource: &ApiResource,
    ) -> Option<(Arc<ApiResource>, reflect::Cache<Compact<Owned>>)> {
        self.kinds
            .lock()
            .ok()?
            .get(&kind_key(resource))
            .map(|k| (k.resource.clone(), k.cache.clone()))
    }

    /// Wait (bounded) until the cache of `resource` has been filled once.
    pub(crate) async fn synced(&self, resource: &ApiResource) -> bool {
        self.watch(resource);
        match self.cache(resource) {
            Some((_, cache)) => cache.synced_within(SYNC_WAIT).await,
            None => false,
        }
    }

    /// The cached object, if any.
    pub(crate) fn get(
        &self,
        resource: &ApiResource,
        ns: &str,
        name: &str,
    ) -> Option<Arc<DynamicObject>> {
        let (kind, cache) = self.cache(resource)?;
        cache
            .store
            .get(&ObjectRef::new_with(name, kind).within(ns))
            .and_then(|c| match c.object() {
                Ok(object) => Some(Arc::new(restored(object))),
                // Cannot happen: the text was written from a DynamicObject.
                Err(e) => {
                    tracing::error!(error = %e, "a cached object does not read back");
                    None
                }
            })
    }

    /// Names of the objects of `resource` labelled for the ModelDeployment `ns/md`.
    pub(crate) fn names_for(&self, resource: &ApiResource, ns: &str, md: &str) -> Vec<String> {
        let Ok(kinds) = self.kinds.lock() else {
            return Vec::new();
        };
        let Some(kind) = kinds.get(&kind_key(resource)) else {
            return Vec::new();
        };
        kind.index
            .read()
            .ok()
            .and_then(|i| i.current.get(&(ns.to_string(), md.to_string())).cloned())
            .unwrap_or_default()
    }

    /// Every kind watched so far.
    pub(crate) fn kinds(&self) -> Vec<ApiResource> {
        self.kinds
            .lock()
            .map(|k| k.values().map(|c| (*c.resource).clone()).collect())
            .unwrap_or_default()
    }

    /// ModelDeployments (`namespace`, name) that own objects of any watched kind.
    pub(crate) fn model_deployments(&self) -> BTreeSet<MdKey> {
        let Ok(kinds) = self.kinds.lock() else {
            return BTreeSet::new();
        };
        kinds
            .values()
            .filter_map(|k| {
                k.index
                    .read()
                    .ok()
                    .map(|i| i.current.keys().cloned().collect::<Vec<_>>())
            })
            .flatten()
            .collect()
    }

    /// A write of `name` starts: its watch events are held until [`Self::wrote`] or
    /// [`Self::write_failed`].
    pub(crate) fn writing(&self, resource: &ApiResource, ns: &str, name: &str) {
        if let Ok(mut w) = self.own_writes.lock() {
            w.insert(object_key(resource, ns, name), OwnWrite::InFlight(None));
        }
    }

    /// Remember that this provider wrote `object` (as the API server returned it), so
    /// that its watch event does not wake the reconciler; an event held meanwhile that
    /// was not this write wakes it now.
    pub(crate) fn wrote(&self, resource: &ApiResource, object: &DynamicObject) {
        let (Some(ns), Some(rv)) = (object.namespace(), object.resource_version()) else {
            return;
        };
        let key = object_key(resource, &ns, &object.name_any());
        let held = self.own_writes.lock().ok().and_then(|mut w| {
            match w.insert(key, OwnWrite::Written(rv.clone())) {
                Some(OwnWrite::InFlight(Some(seen))) if seen != rv => Some(()),
                _ => None,
            }
        });
        if held.is_some() {
            self.wake(object);
        }
    }

    /// A write of `name` for the ModelDeployment `ns/md` failed: an event held meanwhile
    /// wakes the reconciler.
    pub(crate) fn write_failed(&self, resource: &ApiResource, ns: &str, name: &str, md: &str) {
        let key = object_key(resource, ns, name);
        let held = self
            .own_writes
            .lock()
            .ok()
            .is_some_and(|mut w| matches!(w.remove(&key), Some(OwnWrite::InFlight(Some(_)))));
        if held && let Some(trigger) = &self.trigger {
            let _ = trigger.send(ObjectRef::new(md).within(ns));
        }
    }

    fn wake(&self, object: &DynamicObject) {
        if let (Some(trigger), Some(ns), Some(md)) = (
            &self.trigger,
            object.namespace(),
            object.labels().get(labels::MODEL_DEPLOYMENT),
        ) {
            let _ = trigger.send(ObjectRef::new(md).within(&ns));
        }
    }

    /// Forget the own write of an object that is gone.
    pub(crate) fn forget(&self, resource: &ApiResource, ns: &str, name: &str) {
        if let Ok(mut w) = self.own_writes.lock() {
            w.remove(&object_key(resource, ns, name));
        }
    }
}

impl Drop for OwnedCache {
    fn drop(&mut self) {
        if let Ok(kinds) = self.kinds.lock() {
            kinds.values().for_each(|k| k.task.abort());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(name: &str, md: &str) -> Compact<Owned> {
        kept(serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "labels": {labels::MODEL_DEPLOYMENT: md}}}))
        .unwrap())
        .unwrap()
    }

    /// Follow `event` as the cache's watch task does.
    fn follow(index: &mut Index, event: &watcher::Event<Compact<Owned>>) {
        index.event(event, event_md(event).as_ref());
    }

    #[test]
    fn the_index_follows_events_and_swaps_on_relist() {
        let mut i = Index::default();
        follow(&mut i, &watcher::Event::Apply(obj("a-config", "a")));
        follow(&mut i, &watcher::Event::Apply(obj("a-other", "a")));
        follow(&mut i, &watcher::Event::Apply(obj("b-config", "b")));
        assert_eq!(i.current[&("ns".into(), "a".into())].len(), 2);
        follow(&mut i, &watcher::Event::Delete(obj("a-other", "a")));
        assert_eq!(i.current[&("ns".into(), "a".into())].len(), 1);
        // A relist that no longer holds `b`.
        follow(&mut i, &watcher::Event::Init);
        follow(&mut i, &watcher::Event::InitApply(obj("a-config", "a")));
        assert!(
            i.current.contains_key(&("ns".into(), "b".into())),
            "until done"
        );
        follow(&mut i, &watcher::Event::InitDone);
        assert!(!i.current.contains_key(&("ns".into(), "b".into())));
        assert!(i.current.contains_key(&("ns".into(), "a".into())));
    }

    #[tokio::test]
    async fn the_cache_keeps_no_managed_fields_nor_last_applied_annotation() {
        let (service, mut server) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let (tx, _rx) = mpsc::unbounded_channel();
        let cache = OwnedCache::new(Client::new(service, "ns"), "p", Some(tx));
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        cache.watch(&resource);
        // The watch's first list; the watch that follows it is left unanswered.
        let (request, send) = server.next_request().await.unwrap();
        assert_eq!(request.uri().path(), "/api/v1/configmaps");
        let list = json!({"apiVersion": "v1", "kind": "ConfigMapList",
            "metadata": {"resourceVersion": "5"},
            "items": [{"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "x", "namespace": "ns", "resourceVersion": "4",
                    "labels": {labels::MODEL_DEPLOYMENT: "a"},
                    "managedFields": [{"manager": "m", "operation": "Apply"}],
                    "annotations": {reflect::LAST_APPLIED: "{}", "keep": "1"}},
                "data": {"k": "v"}}]});
        send.send_response(
            http::Response::builder()
                .body(kube::client::Body::from(serde_json::to_vec(&list).unwrap()))
                .unwrap(),
        );
        assert!(cache.synced(&resource).await);
        let o = cache.get(&resource, "ns", "x").unwrap();
        assert!(o.metadata.managed_fields.is_none());
        assert_eq!(o.annotations().keys().collect::<Vec<_>>(), ["keep"]);
        assert_eq!(o.data["data"]["k"], "v");
        assert_eq!(cache.names_for(&resource, "ns", "a"), ["x"]);
        // The labels are kept in the text, not as a parsed map, and come back whole.
        assert_eq!(o.labels()[labels::MODEL_DEPLOYMENT], "a");
        assert!(!o.data.as_object().unwrap().contains_key(LABELS_IN_TEXT));
        let (_, kept) = cache.cache(&resource).unwrap();
        assert!(kept.store.state().iter().all(|c| c.meta().labels.is_none()));
    }

    #[test]
    fn our_own_writes_wake_nothing_and_events_during_a_write_wait_for_its_answer() {
        let written = |rv: &str| Some(OwnWrite::Written(rv.into()));
        // Nothing known of the object: every event wakes.
        assert!(wakes(&mut None, Some("5"), false));
        // The event of our own write does not, and what was known of the write is
        // forgotten with it; a later change by someone else wakes.
        let mut own = written("5");
        assert!(!wakes(&mut own, Some("5"), false));
        assert_eq!(own, None);
        let mut own = written("5");
        assert!(wakes(&mut own, Some("6"), false));
        assert_eq!(own, written("5"));
        // Deletion always wakes, and forgets.
        let mut own = written("5");
        assert!(wakes(&mut own, Some("5"), true));
        assert_eq!(own, None);
        // During a write, the event is held with its resourceVersion.
        let mut own = Some(OwnWrite::InFlight(None));
        assert!(!wakes(&mut own, Some("7"), false));
        assert_eq!(own, Some(OwnWrite::InFlight(Some("7".into()))));
    }

    #[tokio::test]
    async fn a_held_event_wakes_only_when_it_was_not_our_write() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        // No request is made: a mock API that answers nothing.
        let (service, _api) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let cache = OwnedCache::new(Client::new(service, "ns"), "p", Some(tx));
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let mut written = restored(obj("a-config", "a").object().unwrap());
        written.metadata.resource_version = Some("7".into());
        let key = object_key(&resource, "ns", "a-config");
        // The watch event of our write arrived before the write's answer.
        cache.writing(&resource, "ns", "a-config");
        cache
            .own_writes
            .lock()
            .unwrap()
            .insert(key.clone(), OwnWrite::InFlight(Some("7".into())));
        cache.wrote(&resource, &written);
        assert!(rx.try_recv().is_err(), "our own write woke the reconciler");
        // Someone else's change arrived during our write: woken once the answer is in.
        cache.writing(&resource, "ns", "a-config");
        cache
            .own_writes
            .lock()
            .unwrap()
            .insert(key.clone(), OwnWrite::InFlight(Some("6".into())));
        written.metadata.resource_version = Some("8".into());
        cache.wrote(&resource, &written);
        assert_eq!(rx.try_recv().unwrap(), ObjectRef::new("a").within("ns"));
        // A failed write releases a held event too.
        cache.writing(&resource, "ns", "a-config");
        cache
            .own_writes
            .lock()
            .unwrap()
            .insert(key, OwnWrite::InFlight(Some("9".into())));
        cache.write_failed(&resource, "ns", "a-config", "a");
        assert_eq!(rx.try_recv().unwrap(), ObjectRef::new("a").within("ns"));
    }
}
