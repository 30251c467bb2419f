//! The Warmups the warmup gate reads: one cluster-wide watch cache, started when the
//! first ModelDeployment that has (or had) `spec.warmup` is reconciled, whose events
//! reconcile the ModelDeployments held by each Warmup ([`Waiting`]). No request per
//! reconcile.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use super::gate::{
    Gate, Seen, Write, change, decide, decide_inline, made_of, opened_before, read, warmup_name,
    warmup_object,
};
use crate::api::{ModelDeployment, Warmup, WarmupSpec};
use crate::conditions::{self, WARMED_UP};
use crate::{reflect, render};

/// Keep of a Warmup only what the gate reads: its metadata (whose owner, annotations
/// and deletion tell of a Warmup made for an inline `spec.warmup`) and its status.
fn shape(warmup: &mut Warmup) {
    reflect::strip(warmup);
    warmup.spec = WarmupSpec::default();
}

/// `(namespace, Warmup name)`.
type WarmupKey = (String, String);

/// Which ModelDeployments a change of each Warmup must wake: those it holds. A
/// ModelDeployment leaves when its gate opens, its `spec.warmup` goes or names another
/// Warmup, or it is deleted or handed to another provider, so this holds no more entries
/// than there are held ModelDeployments.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    by_warmup: HashMap<WarmupKey, BTreeSet<String>>,
    /// `(namespace, ModelDeployment name)` to the name of the Warmup it waits on.
    by_md: HashMap<(String, String), String>,
}

impl Waiting {
    /// The ModelDeployment `md` of namespace `ns` waits on the Warmup `warmup` of its
    /// namespace, or on none.
    fn set(&mut self, ns: &str, md: &str, warmup: Option<&str>) {
        let key = (ns.to_string(), md.to_string());
        if let Some(old) = self.by_md.get(&key)
            && Some(old.as_str()) != warmup
        {
            let old_key = (ns.to_string(), old.clone());
            if let Some(mds) = self.by_warmup.get_mut(&old_key) {
                mds.remove(md);
                if mds.is_empty() {
                    self.by_warmup.remove(&old_key);
                }
            }
        }
        match warmup {
            Some(w) => {
                self.by_md.insert(key, w.to_string());
                self.by_warmup
                    .entry((ns.to_string(), w.to_string()))
                    .or_default()
                    .insert(md.to_string());
            }
            None => {
                self.by_md.remove(&key);
            }
        }
    }

    /// The ModelDeployments the Warmup `key` holds.
    fn on(&self, key: &WarmupKey) -> impl Iterator<Item = &String> {
        self.by_warmup.get(key).into_iter().flatten()
    }

    /// Every Warmup something waits on.
    fn warmups(&self) -> Vec<WarmupKey> {
        self.by_warmup.keys().cloned().collect()
    }
}

/// The Warmups the gate reads, from one cluster-wide watch cache started on first use,
/// and which ModelDeployments wait on each.
pub(crate) struct Warmups {
    client: Client,
    /// Reconcile requests; `None`: never watch (single reconcile steps in unit tests).
    trigger: Option<mpsc::UnboundedSender<ObjectRef<ModelDeployment>>>,
    cache: OnceLock<reflect::Cache<Warmup>>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    /// The ModelDeployments each Warmup holds.
    waiting: Arc<Mutex<Waiting>>,
}

impl std::fmt::Debug for Warmups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warmups")
            .field("started", &self.cache.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Warmups {
    pub(crate) fn new(
        client: Client,
        trigger: Option<mpsc::UnboundedSender<ObjectRef<ModelDeployment>>>,
    ) -> Self {
        Self {
            client,
            trigger,
            cache: OnceLock::new(),
            task: Mutex::new(None),
            waiting: Arc::default(),
        }
    }

    /// Hold exactly `warmups`, with no watch behind them (unit tests).
    pub(crate) fn fixed(&self, warmups: Vec<Warmup>) {
        let mut warmups = warmups;
        warmups.iter_mut().for_each(shape);
        let _ = self.cache.set(reflect::Cache::fixed(warmups, ()));
    }

    /// The cache, its watch started on first use (none without a trigger).
    fn cache(&self) -> Option<reflect::Cache<Warmup>> {
        if let Some(cache) = self.cache.get() {
            return Some(cache.clone());
        }
        let trigger = self.trigger.clone()?;
        let cache = self.cache.get_or_init(|| {
            let (cache, stream) = reflect::cache(
                Api::<Warmup>::all(self.client.clone()),
                watcher::Config::default(),
                (),
                shape,
            );
            let waiting = self.waiting.clone();
            let task = tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    let wake: Vec<WarmupKey> = match &event {
                        Ok(watcher::Event::InitDone) => {
                            waiting.lock().map(|w| w.warmups()).unwrap_or_default()
                        }
                        Ok(watcher::Event::Apply(w) | watcher::Event::Delete(w)) => {
                            vec![(w.namespace().unwrap_or_default(), w.name_any())]
                        }
                        Ok(_) => Vec::new(),
                        Err(e) => {
                            tracing::warn!(error = %e, "watching Warmups failed; retrying");
                            Vec::new()
                        }
                    };
                    let Ok(waiting) = waiting.lock() else {
                        continue;
                    };
                    for key in wake {
                        for md in waiting.on(&key) {
                            let _ = trigger.send(ObjectRef::new(md).within(&key.0));
                        }
                    }
                }
            });
            if let Ok(mut t) = self.task.lock() {
                *t = Some(task.abort_handle());
            }
            cache
        });
        Some(cache.clone())
    }

    /// The Warmup `name` of `md`'s namespace as the cache shows it (`Err`: Warmups
    /// cannot be read). `md` is registered as waiting on it first, so that a change
    /// after this look wakes it.
    fn look(&self, md: &ModelDeployment, name: &str) -> Result<Option<Arc<Warmup>>, ()> {
        let ns = md.namespace().unwrap_or_default();
        self.wait(md, Some(name));
        let cache = self.cache().ok_or(())?;
        if !cache.is_synced() {
            return Err(());
        }
        Ok(cache.store.get(&ObjectRef::new(name).within(&ns)))
    }

    /// The Warmup the runtime made for `md` (its name, owned by it), from the cache; only
    /// once the cache is filled, and started only for a ModelDeployment that has, or had,
    /// `spec.warmup` (its status says `WarmedUp`): no other starts a watch of Warmups.
    pub(crate) fn made_for(&self, md: &ModelDeployment) -> Option<Arc<Warmup>> {
        let had = md.spec.warmup.is_some()
            || md
                .status
                .as_ref()
                .is_some_and(|s| conditions::find(&s.conditions, WARMED_UP).is_some());
        let cache = if had {
            self.cache()?
        } else {
            self.cache.get()?.clone()
        };
        if !cache.is_synced() {
            return None;
        }
        let ns = md.namespace().unwrap_or_default();
        cache
            .store
            .get(&ObjectRef::new(&md.name_any()).within(&ns))
            .filter(|w| render::owned_by(w.as_ref(), md))
    }

    /// `md` waits on the Warmup `warmup`, or on none.
    fn wait(&self, md: &ModelDeployment, warmup: Option<&str>) {
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.set(&md.namespace().unwrap_or_default(), &md.name_any(), warmup);
        }
    }

    /// `md` waits on no Warmup any more (deleted, or handed to another provider).
    pub(crate) fn forget(&self, md: &ModelDeployment) {
        self.wait(md, None);
    }

    /// The gate of `md` (`None` without `spec.warmup`) for applying `rendered` over
    /// `live` (every object it owns, see [`change`]); `provider` makes the Warmup of an
    /// inline `spec.warmup`.
    pub(crate) fn gate(
        &self,
        md: &ModelDeployment,
        provider: &str,
        rendered: &[DynamicObject],
        live: &[Arc<DynamicObject>],
    ) -> Option<Gate> {
        let Some(warmup) = &md.spec.warmup else {
            self.forget(md);
            return None;
        };
        let name = warmup_name(md, warmup);
        let found = self.look(md, &name);
        let seen = match &found {
            Err(()) => Seen::Unavailable,
            Ok(None) => Seen::Missing,
            Ok(Some(w)) => read(w),
        };
        let change = change(rendered, live, opened_before(md));
        let gate = if warmup.is_inline() {
            let (_, wanted) = warmup_object(md, warmup, provider, &render::images(rendered));
            let made = found.ok().flatten().map(|w| made_of(&w, md));
            decide_inline(&name, &seen, made.as_ref(), &wanted, &change)
        } else {
            decide(&name, &seen, &change)
        };
        if gate.open && gate.write == Write::Nothing {
            self.forget(md);
        }
        Some(gate)
    }
}

impl Drop for Warmups {
    fn drop(&mut self) {
        if let Ok(Some(task)) = self.task.lock().map(|mut t| t.take()) {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::DeploymentWarmup;
    use crate::conditions::reasons;
    use crate::runtime::fixtures::{gated_md, object, warmup};
    #[tokio::test]
    async fn the_gate_reads_the_cache_and_remembers_it_opened() {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let warmups = Warmups::new(Client::new(service, "ml"), None);
        let rendered = vec![object("Server", "m", Some("replicas=1"), "llama.cpp:b1")];
        assert_eq!(
            warmups.gate(&gated_md(false, None), "p", &rendered, &[]),
            None,
            "no spec.warmup, no gate"
        );
        assert_eq!(
            warmups
                .gate(&gated_md(true, None), "p", &rendered, &[])
                .unwrap()
                .reason,
            reasons::WARMUP_UNAVAILABLE,
            "no cache"
        );
        warmups.fixed(vec![warmup(Some("InProgress"), json!([]))]);
        assert_eq!(
            warmups
                .gate(&gated_md(true, None), "p", &rendered, &[])
                .unwrap()
                .reason,
            reasons::AWAITING_WARMUP
        );
        assert!(
            warmups
                .gate(&gated_md(true, Some("True")), "p", &rendered, &[])
                .unwrap()
                .open,
            "opened before: a primary being recreated is not held"
        );
        assert!(
            !warmups
                .gate(&gated_md(true, Some("False")), "p", &rendered, &[])
                .unwrap()
                .open
        );
        let live = vec![Arc::new(rendered[0].clone())];
        assert!(
            warmups
                .gate(&gated_md(true, None), "p", &rendered, &live)
                .unwrap()
                .open
        );
    }
    fn waiting_on(warmups: &Warmups, warmup: &str) -> Vec<String> {
        let waiting = warmups.waiting.lock().unwrap();
        waiting
            .on(&("ml".to_string(), warmup.to_string()))
            .cloned()
            .collect()
    }
    #[tokio::test]
    async fn only_held_model_deployments_wait_on_a_warmup() {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let warmups = Warmups::new(Client::new(service, "ml"), None);
        warmups.fixed(vec![warmup(Some("InProgress"), json!([]))]);
        let rendered = vec![object("Server", "m", Some("replicas=1"), "llama.cpp:b1")];
        let live = vec![Arc::new(rendered[0].clone())];
        let held = gated_md(true, None);
        assert!(!warmups.gate(&held, "p", &rendered, &[]).unwrap().open);
        assert_eq!(waiting_on(&warmups, "w"), ["m"]);

        // The gate opens (nothing new to warm): it waits no more.
        assert!(warmups.gate(&held, "p", &rendered, &live).unwrap().open);
        assert!(waiting_on(&warmups, "w").is_empty());
        assert!(warmups.waiting.lock().unwrap().by_md.is_empty());

        // spec.warmup names another Warmup: it moves there.
        warmups.gate(&held, "p", &rendered, &[]);
        let mut renamed = held.clone();
        renamed.spec.warmup = Some(DeploymentWarmup::named("v"));
        assert!(!warmups.gate(&renamed, "p", &rendered, &[]).unwrap().open);
        assert!(waiting_on(&warmups, "w").is_empty());
        assert_eq!(waiting_on(&warmups, "v"), ["m"]);

        // spec.warmup removed.
        assert_eq!(
            warmups.gate(&gated_md(false, None), "p", &rendered, &[]),
            None
        );
        assert!(waiting_on(&warmups, "v").is_empty());

        // Deleted (or handed to another provider).
        warmups.gate(&held, "p", &rendered, &[]);
        warmups.forget(&held);
        let waiting = warmups.waiting.lock().unwrap();
        assert!(waiting.by_warmup.is_empty() && waiting.by_md.is_empty());
    }
}
