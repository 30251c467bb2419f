//! The objects a provider owns, read from watch caches instead of the API server.
//!
//! One reflector per kind the provider renders (the upstream kind and every other kind,
//! started on first use), cluster-wide, filtered by the server on the label
//! `kubeairunway.ai/provider=<name>`, with `managedFields` and the last-applied annotation
//! dropped before anything is stored. Beside each store, an index from a ModelDeployment
//! (namespace and name, from the label `kubeairunway.ai/model-deployment`) to the names of
//! its objects of that kind, kept from the same event stream (relists swap it whole, as
//! the store does).
//!
//! Every change of an owned object asks for its ModelDeployment to be reconciled, except
//! the change this provider just wrote itself (recognised by the resourceVersion its
//! apply returned): a reconcile never wakes itself up.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use crate::api::ModelDeployment;
use crate::{labels, reflect};

/// How long a reconcile waits for a kind's cache to fill when it first needs it.
const SYNC_WAIT: Duration = Duration::from_secs(30);

/// `(namespace, ModelDeployment name)`.
type MdKey = (String, String);

#[derive(Default)]
struct Index {
    current: HashMap<MdKey, BTreeSet<String>>,
    /// Being rebuilt by a relist; swapped in at its end.
    pending: Option<HashMap<MdKey, BTreeSet<String>>>,
}

fn md_key(object: &DynamicObject) -> Option<MdKey> {
    Some((
        object.namespace()?,
        object.labels().get(labels::MODEL_DEPLOYMENT)?.clone(),
    ))
}

impl Index {
    fn insert(map: &mut HashMap<MdKey, BTreeSet<String>>, object: &DynamicObject) {
        if let Some(key) = md_key(object) {
            map.entry(key).or_default().insert(object.name_any());
        }
    }

    fn event(&mut self, event: &watcher::Event<DynamicObject>) {
        match event {
            watcher::Event::Init => self.pending = Some(HashMap::new()),
            watcher::Event::InitApply(o) => {
                if let Some(p) = self.pending.as_mut() {
                    Self::insert(p, o);
                }
            }
            watcher::Event::InitDone => {
                if let Some(p) = self.pending.take() {
                    self.current = p;
                }
            }
            watcher::Event::Apply(o) => Self::insert(&mut self.current, o),
            watcher::Event::Delete(o) => {
                if let Some(key) = md_key(o)
                    && let Some(names) = self.current.get_mut(&key)
                {
                    names.remove(&o.name_any());
                    if names.is_empty() {
                        self.current.remove(&key);
                    }
                }
            }
        }
    }
}

struct KindCache {
    resource: ApiResource,
    cache: reflect::Cache<DynamicObject>,
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

/// The owned-object caches of one provider, for one term of leadership.
pub(crate) struct OwnedCache {
    client: Client,
    selector: String,
    kinds: Mutex<HashMap<(String, String), KindCache>>,
    /// resourceVersion of each object as this provider last wrote it.
    own_writes: Arc<Mutex<HashMap<ObjectKey, String>>>,
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
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
        let (cache, stream) = reflect::cache(
            api,
            watcher::Config::default().labels(&self.selector),
            resource.clone(),
            reflect::strip,
        );
        let (idx, own, res) = (index.clone(), self.own_writes.clone(), resource.clone());
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                if let Ok(mut i) = idx.write() {
                    i.event(&event);
                }
                let (watcher::Event::Apply(o) | watcher::Event::Delete(o)) = &event else {
                    continue;
                };
                let (Some(ns), Some(md)) =
                    (o.namespace(), o.labels().get(labels::MODEL_DEPLOYMENT))
                else {
                    continue;
                };
                let mine = own.lock().ok().is_some_and(|w| {
                    matches!(&event, watcher::Event::Apply(_))
                        && w.get(&object_key(&res, &ns, &o.name_any()))
                            .map(String::as_str)
                            == o.resource_version().as_deref()
                });
                if !mine {
                    let _ = trigger.send(ObjectRef::new(md).within(&ns));
                }
            }
        })
        .abort_handle();
        kinds.insert(
            kind_key(resource),
            KindCache {
                resource: resource.clone(),
                cache,
                index,
                task,
            },
        );
    }

    /// Hold exactly `objects` of `resource`, with no watch behind them (single reconcile
    /// steps in unit tests).
    pub(crate) fn fixed(&self, resource: &ApiResource, objects: Vec<DynamicObject>) {
        let mut index = Index::default();
        for o in &objects {
            Index::insert(&mut index.current, o);
        }
        let task = tokio::spawn(async {}).abort_handle();
        if let Ok(mut kinds) = self.kinds.lock() {
            kinds.insert(
                kind_key(resource),
                KindCache {
                    resource: resource.clone(),
                    cache: reflect::Cache::fixed(objects, resource.clone()),
                    index: Arc::new(RwLock::new(index)),
                    task,
                },
            );
        }
    }

    fn cache(&self, resource: &ApiResource) -> Option<reflect::Cache<DynamicObject>> {
        self.kinds
            .lock()
            .ok()?
            .get(&kind_key(resource))
            .map(|k| k.cache.clone())
    }

    /// Wait (bounded) until the cache of `resource` has been filled once.
    pub(crate) async fn synced(&self, resource: &ApiResource) -> bool {
        self.watch(resource);
        match self.cache(resource) {
            Some(cache) => cache.synced_within(SYNC_WAIT).await,
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
        self.cache(resource)?
            .store
            .get(&ObjectRef::new_with(name, resource.clone()).within(ns))
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
            .and_then(|i| {
                i.current
                    .get(&(ns.to_string(), md.to_string()))
                    .map(|n| n.iter().cloned().collect())
            })
            .unwrap_or_default()
    }

    /// Every kind watched so far.
    pub(crate) fn kinds(&self) -> Vec<ApiResource> {
        self.kinds
            .lock()
            .map(|k| k.values().map(|c| c.resource.clone()).collect())
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

    /// Remember that this provider wrote `object` (as the API server returned it), so
    /// that its watch event does not wake the reconciler.
    pub(crate) fn wrote(&self, resource: &ApiResource, object: &DynamicObject) {
        let (Some(ns), Some(rv)) = (object.namespace(), object.resource_version()) else {
            return;
        };
        if let Ok(mut w) = self.own_writes.lock() {
            w.insert(object_key(resource, &ns, &object.name_any()), rv);
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

    fn obj(name: &str, md: &str) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "labels": {labels::MODEL_DEPLOYMENT: md}}}))
        .unwrap()
    }

    #[test]
    fn the_index_follows_events_and_swaps_on_relist() {
        let mut i = Index::default();
        i.event(&watcher::Event::Apply(obj("a-config", "a")));
        i.event(&watcher::Event::Apply(obj("a-other", "a")));
        i.event(&watcher::Event::Apply(obj("b-config", "b")));
        assert_eq!(i.current[&("ns".into(), "a".into())].len(), 2);
        i.event(&watcher::Event::Delete(obj("a-other", "a")));
        assert_eq!(i.current[&("ns".into(), "a".into())].len(), 1);
        // A relist that no longer holds `b`.
        i.event(&watcher::Event::Init);
        i.event(&watcher::Event::InitApply(obj("a-config", "a")));
        assert!(
            i.current.contains_key(&("ns".into(), "b".into())),
            "until done"
        );
        i.event(&watcher::Event::InitDone);
        assert!(!i.current.contains_key(&("ns".into(), "b".into())));
        assert!(i.current.contains_key(&("ns".into(), "a".into())));
    }

    #[test]
    fn stripping_drops_managed_fields_and_the_last_applied_annotation() {
        let mut o: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "managedFields": [{"manager": "m", "operation": "Apply"}],
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "1"}}}))
        .unwrap();
        reflect::strip(&mut o);
        assert!(o.metadata.managed_fields.is_none());
        assert_eq!(o.annotations().len(), 1);
    }
}
