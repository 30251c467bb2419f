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

use super::error::Error;
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

/// The index's key of a ModelDeployment: a hash of its namespace and name, not the two
/// strings (with the names, an entry per owned object cost about 260 bytes, a third of
/// what the provider kept per object at 10,000 ModelDeployments; the scale benchmark's
/// heap profile, docs/benchmarks.md#where-the-memory-goes). Two ModelDeployments whose hashes collide share an
/// entry: [`OwnedCache::names_for`] keeps only the names whose objects are labelled for
/// the ModelDeployment asked about.
fn md_hash(ns: &str, md: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    (ns, md).hash(&mut h);
    h.finish()
}

/// The names of a ModelDeployment's objects of one kind, sorted: usually one, and a
/// B-tree set would allocate a node of eleven for it.
type Names = Vec<Box<str>>;

#[derive(Default)]
struct Index {
    current: HashMap<u64, Names>,
    /// Being rebuilt by a relist; swapped in at its end.
    pending: Option<HashMap<u64, Names>>,
}

/// The top-level field of a cached owned object's text that holds the parts of its
/// metadata that only a reconcile reads (no Kubernetes object has a field of that name):
/// its labels, owner references and uid ([`InText`]). Parsed, they cost more than the
/// rest of the object kept: a label map is a B-tree node of about 540 bytes whatever few
/// labels it holds, an owner reference a struct and four strings of about 230 bytes, and
/// the store's key copies the uid. Measured with the scale benchmark's heap profile
/// (docs/benchmarks.md#where-the-memory-goes). [`OwnedCache::get`] puts them back.
const METADATA_IN_TEXT: &str = "kubeairunway.ai/metadata";

/// The metadata a kept object holds in its text ([`METADATA_IN_TEXT`]).
#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InText {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner_references: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uid: Option<String>,
}

/// Shape an owned object before it is kept: [`reflect::strip`], and its labels, owner
/// references and uid moved into its text.
fn keep(object: &mut Owned) {
    reflect::strip(object);
    let meta = &mut object.0.metadata;
    let moved = InText {
        labels: meta.labels.take(),
        owner_references: meta.owner_references.take(),
        uid: meta.uid.take(),
    };
    if moved.labels.is_none() && moved.owner_references.is_none() && moved.uid.is_none() {
        return;
    }
    if object.0.data.is_null() {
        object.0.data = serde_json::Value::Object(serde_json::Map::new());
    }
    if let (Some(fields), Ok(moved)) = (object.0.data.as_object_mut(), serde_json::to_value(moved))
    {
        fields.insert(METADATA_IN_TEXT.into(), moved);
    }
}

/// The object as it was before [`keep`] (but for what [`reflect::strip`] drops).
fn restored(Owned(mut object): Owned) -> DynamicObject {
    if let Some(moved) = object
        .data
        .as_object_mut()
        .and_then(|fields| fields.remove(METADATA_IN_TEXT))
    {
        let moved: InText = serde_json::from_value(moved).unwrap_or_default();
        object.metadata.labels = moved.labels;
        object.metadata.owner_references = moved.owner_references;
        object.metadata.uid = moved.uid;
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
        #[serde(rename = "kubeairunway.ai/metadata")]
        metadata: Option<Labels>,
    }
    #[derive(Deserialize)]
    struct Labels {
        labels: Option<std::collections::BTreeMap<String, String>>,
    }
    let mut labelled = object.peek::<Labelled>()?.metadata?.labels?;
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
    fn insert(map: &mut HashMap<u64, Names>, (ns, md): &MdKey, name: String) {
        let names = map.entry(md_hash(ns, md)).or_default();
        let name = name.into_boxed_str();
        if let Err(at) = names.binary_search(&name) {
            names.insert(at, name);
        }
    }

    /// The names indexed under `ns/md`'s key: its objects', and those of any
    /// ModelDeployment whose key collides with it.
    fn names(&self, ns: &str, md: &str) -> Names {
        self.current
            .get(&md_hash(ns, md))
            .cloned()
            .unwrap_or_default()
    }

    /// Follow `event`, whose object is labelled for the ModelDeployment `md`
    /// ([`event_md`]).
    fn event(&mut self, event: &watcher::Event<Compact<Owned>>, md: Option<&MdKey>) {
        match (event, md) {
            (watcher::Event::Init, _) => self.pending = Some(HashMap::new()),
            (watcher::Event::InitApply(o), Some(key)) => {
                if let Some(p) = self.pending.as_mut() {
                    Self::insert(p, key, o.name_any());
                }
            }
            (watcher::Event::InitDone, _) => {
                if let Some(p) = self.pending.take() {
                    self.current = p;
                }
            }
            (watcher::Event::Apply(o), Some(key)) => {
                Self::insert(&mut self.current, key, o.name_any());
            }
            (watcher::Event::Delete(o), Some((ns, md))) => {
                let key = md_hash(ns, md);
                if let Some(names) = self.current.get_mut(&key) {
                    let gone = o.name_any();
                    names.retain(|n| **n != *gone);
                    if names.is_empty() {
                        self.current.remove(&key);
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

/// Forget what is known of our writes of `key`, the table's memory given back once it is
/// mostly empty ([`super::memory::remove`]): a rollout of thousands of ModelDeployments
/// grows it to thousands of writes whose watch events have not arrived yet (its capacity
/// stayed at its peak, megabytes at 10,000 in the scale benchmark).
fn remove_own_write(
    writes: &mut HashMap<ObjectKey, OwnWrite>,
    key: &ObjectKey,
) -> Option<OwnWrite> {
    super::memory::remove(writes, key)
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
    /// The leader term these caches serve: a wait for a cache ends with it.
    term: Option<crate::process::Term>,
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
            term: None,
        }
    }

    /// Waits for these caches end when `term` does (see [`Self::synced`]).
    pub(crate) fn ending_with(mut self, term: crate::process::Term) -> Self {
        self.term = Some(term);
        self
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
            // After the first list, a list again means the watch restarted: what changed
            // meanwhile arrives as `InitApply`, and wakes as a change does (the first list
            // wakes nothing: the controller starts by reconciling everything).
            let mut listed = false;
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                let md = event_md(&event);
                if let Ok(mut i) = idx.write() {
                    i.event(&event, md.as_ref());
                }
                let o = match &event {
                    watcher::Event::Apply(o) | watcher::Event::Delete(o) => o,
                    watcher::Event::InitApply(o) if listed => o,
                    watcher::Event::InitDone => {
                        listed = true;
                        continue;
                    }
                    _ => continue,
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
                        Some(entry) => {
                            w.insert(key, entry);
                        }
                        None => {
                            remove_own_write(&mut w, &key);
                        }
                    }
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
                Index::insert(&mut index.current, &key, o.name_any());
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

    /// Wait (bounded) until the cache of `resource` has been filled once: whether it was.
    /// A wait cut off from the API server would outlive the leader term; it ends with the
    /// term instead, in [`Error::TermEnded`].
    pub(crate) async fn synced(&self, resource: &ApiResource) -> Result<bool, Error> {
        self.watch(resource);
        let Some((_, cache)) = self.cache(resource) else {
            return Ok(false);
        };
        let Some(term) = &self.term else {
            return Ok(cache.synced_within(SYNC_WAIT).await);
        };
        tokio::select! {
            synced = cache.synced_within(SYNC_WAIT) => Ok(synced),
            () = term.ended() => Err(Error::TermEnded),
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

    /// Names of the objects of `resource` labelled for the ModelDeployment `ns/md`: those
    /// indexed under its key whose cached object is labelled for it.
    pub(crate) fn names_for(&self, resource: &ApiResource, ns: &str, md: &str) -> Vec<String> {
        let Ok(kinds) = self.kinds.lock() else {
            return Vec::new();
        };
        let Some(kind) = kinds.get(&kind_key(resource)) else {
            return Vec::new();
        };
        let names = kind
            .index
            .read()
            .map(|i| i.names(ns, md))
            .unwrap_or_default();
        let wanted = (ns.to_string(), md.to_string());
        names
            .iter()
            .filter(|name| {
                kind.cache
                    .store
                    .get(&ObjectRef::new_with(name, kind.resource.clone()).within(ns))
                    .is_some_and(|o| md_key(&o).as_ref() == Some(&wanted))
            })
            .map(ToString::to_string)
            .collect()
    }

    /// Every kind watched so far.
    pub(crate) fn kinds(&self) -> Vec<ApiResource> {
        self.kinds
            .lock()
            .map(|k| k.values().map(|c| (*c.resource).clone()).collect())
            .unwrap_or_default()
    }

    /// ModelDeployments (`namespace`, name) that own objects of any watched kind, read
    /// from the cached objects' labels (the index holds keys, not names; a sweep at each
    /// resync, not a reconcile, reads every object).
    pub(crate) fn model_deployments(&self) -> BTreeSet<MdKey> {
        let Ok(kinds) = self.kinds.lock() else {
            return BTreeSet::new();
        };
        kinds
            .values()
            .flat_map(|k| k.cache.store.state())
            .filter_map(|o| md_key(&o))
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
            match w.insert(key.clone(), OwnWrite::Written(rv.clone())) {
                // The event of this write came while it was under way: nothing is left
                // to recognise, and kept, the entry would stay until the object's next
                // change (thousands of them after a rollout).
                Some(OwnWrite::InFlight(Some(seen))) if seen == rv => {
                    remove_own_write(&mut w, &key);
                    None
                }
                Some(OwnWrite::InFlight(Some(_))) => Some(()),
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
        let held = self.own_writes.lock().ok().is_some_and(|mut w| {
            matches!(
                remove_own_write(&mut w, &key),
                Some(OwnWrite::InFlight(Some(_)))
            )
        });
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
            remove_own_write(&mut w, &object_key(resource, ns, name));
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
        assert_eq!(i.names("ns", "a").len(), 2);
        follow(&mut i, &watcher::Event::Delete(obj("a-other", "a")));
        assert_eq!(i.names("ns", "a").len(), 1);
        // A relist that no longer holds `b`.
        follow(&mut i, &watcher::Event::Init);
        follow(&mut i, &watcher::Event::InitApply(obj("a-config", "a")));
        assert!(!i.names("ns", "b").is_empty(), "until done");
        follow(&mut i, &watcher::Event::InitDone);
        assert!(i.names("ns", "b").is_empty());
        assert_eq!(&*i.names("ns", "a")[0], "a-config");
    }

    /// The index is keyed by a hash of the ModelDeployment: were two to collide, each is
    /// still given only the objects labelled for it, and the sweep reads the labels.
    #[tokio::test]
    async fn colliding_index_keys_give_each_model_deployment_only_its_own_objects() {
        let (service, _api) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let cache = OwnedCache::new(Client::new(service, "ns"), "p", None);
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let objects = [obj("a-config", "a"), obj("b-config", "b")]
            .into_iter()
            .map(|o| restored(o.object().unwrap()))
            .collect();
        cache.fixed(&resource, objects);
        assert_eq!(cache.names_for(&resource, "ns", "a"), ["a-config"]);
        // `b`'s object indexed under `a`'s key too, as a collision would.
        {
            let kinds = cache.kinds.lock().unwrap();
            let mut index = kinds[&kind_key(&resource)].index.write().unwrap();
            let names = index.current.get_mut(&md_hash("ns", "a")).unwrap();
            names.push("b-config".into());
        }
        assert_eq!(cache.names_for(&resource, "ns", "a"), ["a-config"]);
        assert_eq!(cache.names_for(&resource, "ns", "b"), ["b-config"]);
        assert_eq!(
            cache.model_deployments(),
            BTreeSet::from([
                ("ns".to_string(), "a".to_string()),
                ("ns".to_string(), "b".to_string())
            ])
        );
    }

    /// Cut off from the API server, a reconcile waiting for a cache to fill would outlive
    /// the leader term by up to `SYNC_WAIT`: the wait ends with the term instead.
    #[tokio::test(start_paused = true)]
    async fn a_wait_for_a_cache_ends_with_the_term() {
        let (service, mut server) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let (leading_tx, leading) = tokio::sync::watch::channel(true);
        let term = crate::process::Term::new(
            leading,
            crate::process::Shutdown::on(std::future::pending()),
        );
        let (tx, _rx) = mpsc::unbounded_channel();
        let cache = OwnedCache::new(Client::new(service, "ns"), "p", Some(tx)).ending_with(term);
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let started = tokio::time::Instant::now();
        let wait = cache.synced(&resource);
        tokio::pin!(wait);
        // The watch's list is taken and never answered; five seconds on, the term ends.
        tokio::select! {
            _ = &mut wait => panic!("synced without an answer"),
            _ = server.next_request() => {}
        }
        tokio::select! {
            _ = &mut wait => panic!("the wait ended before the term"),
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        leading_tx.send(false).unwrap();
        assert!(matches!(wait.await, Err(Error::TermEnded)));
        assert!(started.elapsed() < SYNC_WAIT, "{:?}", started.elapsed());
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
                    "uid": "u-x",
                    "labels": {labels::MODEL_DEPLOYMENT: "a"},
                    "ownerReferences": [{"apiVersion": "kubeairunway.ai/v1alpha1",
                        "kind": "ModelDeployment", "name": "a", "uid": "u-a", "controller": true}],
                    "managedFields": [{"manager": "m", "operation": "Apply"}],
                    "annotations": {reflect::LAST_APPLIED: "{}", "keep": "1"}},
                "data": {"k": "v"}}]});
        send.send_response(
            http::Response::builder()
                .body(kube::client::Body::from(serde_json::to_vec(&list).unwrap()))
                .unwrap(),
        );
        assert!(cache.synced(&resource).await.unwrap());
        let o = cache.get(&resource, "ns", "x").unwrap();
        assert!(o.metadata.managed_fields.is_none());
        assert_eq!(o.annotations().keys().collect::<Vec<_>>(), ["keep"]);
        assert_eq!(o.data["data"]["k"], "v");
        assert_eq!(cache.names_for(&resource, "ns", "a"), ["x"]);
        // The labels, owner references and uid are kept in the text, not parsed, and come
        // back whole.
        assert_eq!(o.labels()[labels::MODEL_DEPLOYMENT], "a");
        assert_eq!(o.owner_references()[0].uid, "u-a");
        assert_eq!(o.owner_references()[0].controller, Some(true));
        assert_eq!(o.uid().as_deref(), Some("u-x"));
        assert_eq!(o.resource_version().as_deref(), Some("4"));
        assert!(!o.data.as_object().unwrap().contains_key(METADATA_IN_TEXT));
        let (_, kept) = cache.cache(&resource).unwrap();
        assert!(kept.store.state().iter().all(|c| {
            let meta = c.meta();
            meta.labels.is_none() && meta.owner_references.is_none() && meta.uid.is_none()
        }));
    }

    /// A watch that restarts lists again; an object changed meanwhile arrives as
    /// `InitApply`, and must wake its ModelDeployment as a change would. The first list
    /// wakes nothing (the controller starts by reconciling everything).
    #[tokio::test]
    async fn a_change_seen_by_a_relist_wakes_its_model_deployment() {
        let (service, mut server) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cache = OwnedCache::new(Client::new(service, "ns"), "p", Some(tx));
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let list = |rv: &str, object_rv: &str| {
            let body = json!({"apiVersion": "v1", "kind": "ConfigMapList",
                "metadata": {"resourceVersion": rv},
                "items": [{"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "x", "namespace": "ns", "resourceVersion": object_rv,
                        "labels": {labels::MODEL_DEPLOYMENT: "a"}}}]});
            http::Response::builder()
                .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap()
        };
        cache.watch(&resource);
        let (_, send) = server.next_request().await.unwrap();
        send.send_response(list("5", "4"));
        assert!(cache.synced(&resource).await.unwrap());
        // The watch that follows: the API server has compacted past it (410 Gone).
        let (request, send) = server.next_request().await.unwrap();
        assert!(request.uri().query().unwrap().contains("watch=true"));
        assert!(rx.try_recv().is_err(), "the first list wakes nothing");
        let gone = json!({"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status",
            "status": "Failure", "reason": "Expired", "code": 410,
            "message": "too old resource version"}});
        send.send_response(
            http::Response::builder()
                .body(kube::client::Body::from(serde_json::to_vec(&gone).unwrap()))
                .unwrap(),
        );
        // The list again: `x` changed while the watch was away.
        let (request, send) = server.next_request().await.unwrap();
        assert!(
            !request
                .uri()
                .query()
                .unwrap_or_default()
                .contains("watch=true")
        );
        send.send_response(list("7", "6"));
        let woken = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(
            (woken.name.as_str(), woken.namespace.as_deref()),
            ("a", Some("ns"))
        );
    }

    /// A burst of writes grows the table; once their events have arrived it is small
    /// again, not held at its peak.
    #[test]
    fn the_own_writes_table_gives_its_memory_back_once_drained() {
        let mut writes = HashMap::new();
        let key = |i: usize| {
            (
                "v1".to_string(),
                "ConfigMap".to_string(),
                "ns".to_string(),
                format!("o-{i}"),
            )
        };
        for i in 0..10_000 {
            writes.insert(key(i), OwnWrite::Written(i.to_string()));
        }
        let peak = writes.capacity();
        for i in 0..9_990 {
            assert!(remove_own_write(&mut writes, &key(i)).is_some());
        }
        assert_eq!(writes.len(), 10);
        assert!(writes.capacity() <= 64, "{} of {peak}", writes.capacity());
        // What is left is still there.
        assert_eq!(
            remove_own_write(&mut writes, &key(9_999)),
            Some(OwnWrite::Written("9999".into()))
        );
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
        // Its event seen, nothing is kept of it.
        assert!(cache.own_writes.lock().unwrap().get(&key).is_none());
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
