//! What the provider runtime remembers of each ModelDeployment between reconciles: the
//! spec generation whose render warnings were published, when the upstream status last
//! changed, and how many reconciles failed in a row. One map, keyed by namespace and name,
//! an entry dropped as soon as it holds nothing (no failure, nothing published, no
//! upstream status watched) and when the ModelDeployment is deleted or leaves this
//! provider: at 10,000 ModelDeployments, three maps keyed by kube's `ObjectRef` (which
//! carries the resourceVersion and uid as strings of their own) held about 500 bytes per
//! ModelDeployment, and entries of deleted ones were never dropped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use kube::ResourceExt;

/// What is remembered of one ModelDeployment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Remembered {
    /// The spec generation whose render warnings were published.
    pub(crate) warned: Option<i64>,
    /// The upstream status fingerprint, and when it last changed.
    pub(crate) upstream: Option<(u64, Instant)>,
    /// Reconciles failed in a row, for backoff.
    pub(crate) failures: u32,
}

impl Remembered {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// `(namespace, name)`.
type Key = (Box<str>, Box<str>);

fn key(namespace: Option<String>, name: &str) -> Key {
    (namespace.unwrap_or_default().into(), name.into())
}

/// The runtime's memory of every ModelDeployment it reconciles.
#[derive(Debug, Default)]
pub(crate) struct Memory(Mutex<HashMap<Key, Remembered>>);

impl Memory {
    /// Read and change what is remembered of `md` (by namespace and name); an entry left
    /// empty is dropped. `None` only when the lock is poisoned.
    pub(crate) fn with<R>(
        &self,
        md: &impl ResourceExt,
        change: impl FnOnce(&mut Remembered) -> R,
    ) -> Option<R> {
        let mut map = self.0.lock().ok()?;
        let key = key(md.namespace(), &md.name_any());
        let out = if let Some(entry) = map.get_mut(&key) {
            let out = change(entry);
            if entry.is_empty() {
                remove(&mut map, &key);
            }
            out
        } else {
            let mut entry = Remembered::default();
            let out = change(&mut entry);
            if !entry.is_empty() {
                map.insert(key, entry);
            }
            out
        };
        Some(out)
    }

    /// Forget `md` (deleted, or served by another provider now).
    pub(crate) fn forget(&self, md: &impl ResourceExt) {
        self.forget_named(&md.namespace().unwrap_or_default(), &md.name_any());
    }

    /// [`Self::forget`] the ModelDeployment `namespace/name`.
    pub(crate) fn forget_named(&self, namespace: &str, name: &str) {
        if let Ok(mut map) = self.0.lock() {
            remove(&mut map, &key(Some(namespace.to_string()), name));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().map(|m| m.len()).unwrap_or_default()
    }
}

/// Drop the entry of `key`, and return it. hashbrown never shrinks by itself: once many
/// entries are gone (ModelDeployments deleted, a burst of failures or of writes over),
/// the room is given back when a quarter of it is in use. The runtime's maps of
/// ModelDeployments and of its own writes ([`super::cache`]) shrink so.
pub(super) fn remove<K, V>(map: &mut HashMap<K, V>, key: &K) -> Option<V>
where
    K: std::hash::Hash + Eq,
{
    let removed = map.remove(key);
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to_fit();
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn object(namespace: &str, name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn an_entry_lives_while_it_holds_something_and_goes_with_its_model_deployment() {
        let memory = Memory::default();
        let (a, b) = (object("ns", "a"), object("other", "a"));
        memory.with(&a, |r| r.failures += 1);
        memory.with(&b, |r| r.warned = Some(3));
        assert_eq!(memory.len(), 2, "namespace is part of the key");
        assert_eq!(memory.with(&a, |r| r.failures), Some(1));
        // Back to nothing held: the entry goes.
        memory.with(&a, |r| r.failures = 0);
        assert_eq!(memory.len(), 1);
        memory.with(&b, |r| r.upstream = Some((7, Instant::now())));
        memory.forget(&b);
        assert_eq!(memory.len(), 0);
        memory.with(&a, |r| r.warned = Some(1));
        memory.forget_named("ns", "a");
        assert_eq!(memory.len(), 0);
        assert_eq!(memory.with(&b, |r| r.clone()), Some(Remembered::default()));
    }
}
