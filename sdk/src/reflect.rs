//! Watch caches ("reflectors") the way every controller of the platform keeps them: a
//! kube [`Store`] filled by a watch with backoff, what no controller reads dropped before
//! anything is stored (`managedFields`, the last-applied annotation), and a sync signal
//! any number of tasks may wait on.
//!
//! Why a sync signal of our own: kube's `Store::wait_until_ready` keeps a single waker,
//! so of several tasks waiting on the same store (a controller's runner, a readiness
//! check, a reconcile), all but the last to poll are never woken; a poll from
//! `now_or_never` can even steal the controller's own wake-up. [`Cache::synced`] is a
//! `tokio::sync::watch`, which wakes every waiter.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use crate::compact::Compact;

pub use crate::compact::LAST_APPLIED;

/// Drop what no reconcile reads and what takes most of a cached object's memory:
/// `managedFields` and the last-applied annotation.
pub fn strip<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
    if let Some(a) = object.meta_mut().annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

/// A watch cache: its store, and whether it has been filled once.
pub struct Cache<K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// The objects.
    pub store: Store<K>,
    synced: watch::Receiver<bool>,
}

impl<K: Resource + 'static> std::fmt::Debug for Cache<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("synced", &*self.synced.borrow())
            .finish_non_exhaustive()
    }
}

impl<K: Resource + 'static> Clone for Cache<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            synced: self.synced.clone(),
        }
    }
}

impl<K: Resource + Clone + 'static> Cache<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// Whether the cache has been filled once (its first list is complete).
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Wait until the cache has been filled once; `false` when its watch is gone first.
    pub async fn synced(&self) -> bool {
        let mut rx = self.synced.clone();
        rx.wait_for(|s| *s).await.is_ok()
    }

    /// [`Cache::synced`], giving up after `timeout`.
    pub async fn synced_within(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.synced())
            .await
            .unwrap_or(false)
    }
}

impl<K> Cache<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// A synced cache holding exactly `objects`, with no watch behind it (unit tests,
    /// offline previews).
    pub fn fixed(objects: impl IntoIterator<Item = K>, dyntype: K::DynamicType) -> Self {
        let mut writer = reflector::store::Writer::new(dyntype);
        writer.apply_watcher_event(&watcher::Event::Init);
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(o));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let (_, synced) = watch::channel(true);
        Self {
            store: writer.as_reader(),
            synced,
        }
    }
}

/// How objects are shaped before they are cached.
pub type Shape<K> = fn(&mut K);

/// A cache of what `api` lists under `config`, each object shaped by `shape` (usually
/// [`strip`]) before it is stored, and the stream of watch events that fills it (drive it,
/// or hand its `applied_objects()` to `Controller::for_stream`). `dyntype` is `()` for
/// static kinds and the `ApiResource` for dynamic ones.
pub fn cache<K>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
    shape: Shape<K>,
) -> (Cache<K>, impl Stream<Item = Events<K>> + Send + 'static)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    filled(
        reflector::store::Writer::new(dyntype),
        watcher(api, config).default_backoff().modify(shape),
    )
}

/// A cache filled by `events` through `writer`, and the stream that fills it.
fn filled<K>(
    writer: reflector::store::Writer<K>,
    events: impl Stream<Item = Events<K>> + Send + 'static,
) -> (Cache<K>, impl Stream<Item = Events<K>> + Send + 'static)
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let store = writer.as_reader();
    let (tx, synced) = watch::channel(false);
    let stream = events.reflect(writer).inspect(move |event| {
        if matches!(event, Ok(watcher::Event::InitDone)) {
            tx.send_replace(true);
        }
    });
    (Cache { store, synced }, stream)
}

/// [`cache`], each object kept as a [`Compact`] (metadata parsed, the rest as JSON text):
/// for caches that hold an object per ModelDeployment of the cluster. `shape` runs on the
/// parsed object before it is made compact. An object that cannot be kept (its type does
/// not serialize, a bug) is logged and left out.
pub fn compact_cache<K>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
    shape: Shape<K>,
) -> (
    Cache<Compact<K>>,
    impl Stream<Item = Events<Compact<K>>> + Send + 'static,
)
where
    K: Resource
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    filled(
        reflector::store::Writer::new(dyntype),
        watcher(api, config)
            .default_backoff()
            .modify(shape)
            .filter_map(|event| std::future::ready(compact_event(event))),
    )
}

/// What a cache's watch yields.
pub type Events<K> = Result<watcher::Event<K>, watcher::Error>;

/// A watch event with its object made compact; `None` (logged) when it cannot be.
fn compact_event<K: Resource + serde::Serialize>(event: Events<K>) -> Option<Events<Compact<K>>> {
    let compact = |object: K| {
        let name = object.meta().name.clone().unwrap_or_default();
        Compact::new(object)
            .map_err(|e| tracing::error!(name, error = %e, "an object could not be cached"))
            .ok()
    };
    Some(Ok(match event {
        Err(e) => return Some(Err(e)),
        Ok(watcher::Event::Init) => watcher::Event::Init,
        Ok(watcher::Event::InitDone) => watcher::Event::InitDone,
        Ok(watcher::Event::InitApply(o)) => watcher::Event::InitApply(compact(o)?),
        Ok(watcher::Event::Apply(o)) => watcher::Event::Apply(compact(o)?),
        Ok(watcher::Event::Delete(o)) => watcher::Event::Delete(compact(o)?),
    }))
}

/// Drive a cache's stream until it ends, logging watch errors (the watch retries with
/// backoff by itself).
pub async fn drive<K>(
    what: &'static str,
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
) {
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        if let Err(e) = event {
            tracing::warn!(cache = what, error = %e, "watch failed; retrying");
        }
    }
}

/// Completes once `ended` has completed while `cache` has never synced; never when it had.
///
/// Race a kube Controller whose graceful shutdown is `ended` (and whose store is this
/// cache's) against this, and drop it when this wins: kube's Controller never ends a
/// graceful shutdown that comes before its store is ready. Its runner holds every task
/// until the store is ready, and while it does, a finished queue is reported as pending
/// rather than as the end (`controller/runner.rs:111-124`, kube-runtime 5.0.0); the
/// shutdown also stops the reflector that would fill the store. A leader term that began
/// while the API server was unreachable, then lost its Lease, would wait there forever. No
/// reconcile can be in flight before the store is ready, so dropping the controller then
/// cancels nothing.
pub async fn ended_unsynced<K>(cache: &Cache<K>, ended: impl std::future::Future<Output = ()>)
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    ended.await;
    if cache.is_synced() {
        std::future::pending::<()>().await;
    }
}

/// A cache's objects offered to further controllers over the same store, so that one watch
/// feeds them all: each watch of a kind costs the API server and this process a copy of
/// every event. Made by [`share`].
pub struct Shared<K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    cache: Cache<K>,
    applied: tokio::sync::broadcast::Sender<std::sync::Arc<K>>,
}

impl<K: Resource + 'static> Clone for Shared<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            cache: self.cache.clone(),
            applied: self.applied.clone(),
        }
    }
}

impl<K: Resource + 'static> std::fmt::Debug for Shared<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("cache", &self.cache)
            .field("subscribers", &self.applied.receiver_count())
            .finish()
    }
}

/// `cache` and its `stream` (from [`cache`] or [`compact_cache`]), with each object the
/// stream applies offered to the subscribers of the returned [`Shared`] (at most `buffer`
/// waiting per subscriber). Drive the returned stream in place of `stream`. Nothing is
/// offered while nobody subscribes, and a slow subscriber never holds the watch back: it
/// is given every stored object again instead (see [`Shared::subscribe`]).
pub fn share<K>(
    cache: Cache<K>,
    stream: impl Stream<Item = Events<K>> + Send + 'static,
    buffer: usize,
) -> (Shared<K>, impl Stream<Item = Events<K>> + Send + 'static)
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    let (applied, _) = tokio::sync::broadcast::channel(buffer.max(1));
    let (store, sender) = (cache.store.clone(), applied.clone());
    let stream = stream.inspect(move |event| {
        if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = event
            && sender.receiver_count() > 0
            // The stream has stored it already: offer the store's own copy.
            && let Some(stored) = store.get(&reflector::ObjectRef::from_obj(o))
        {
            let _ = sender.send(stored);
        }
    });
    (Shared { cache, applied }, stream)
}

impl<K> Shared<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    /// The shared cache.
    pub fn cache(&self) -> &Cache<K> {
        &self.cache
    }

    /// A trigger stream for `Controller::for_shared_stream` over [`Shared::cache`]'s store:
    /// once the cache is filled, every stored object, then each object the watch applies.
    /// A subscriber that falls more than the buffer behind is given every stored object
    /// again (a reconcile is idempotent; a missed one would not be). Ends when the cache's
    /// watch is gone before it filled.
    pub fn subscribe(&self) -> impl Stream<Item = std::sync::Arc<K>> + Send + 'static {
        use tokio::sync::broadcast::error::RecvError;
        let receiver = self.applied.subscribe();
        let state = (Some(self.cache.clone()), self.cache.store.clone(), receiver);
        futures::stream::unfold(state, |(start, store, mut receiver)| async move {
            if let Some(cache) = start {
                if !cache.synced().await {
                    return None;
                }
                return Some((store.state(), (None, store, receiver)));
            }
            let batch = match receiver.recv().await {
                Ok(object) => vec![object],
                Err(RecvError::Lagged(_)) => store.state(),
                Err(RecvError::Closed) => return None,
            };
            Some((batch, (None, store, receiver)))
        })
        .flat_map(futures::stream::iter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn map(name: &str) -> ConfigMap {
        let mut m = ConfigMap::default();
        m.metadata.name = Some(name.into());
        m.metadata.namespace = Some("ns".into());
        m
    }

    type Feed = futures::channel::mpsc::UnboundedSender<Events<ConfigMap>>;

    /// A shared cache fed by hand, its stream driven in the background.
    fn shared(buffer: usize) -> (Shared<ConfigMap>, Feed) {
        let (feed, events) = futures::channel::mpsc::unbounded();
        let (cache, stream) = filled(reflector::store::Writer::new(()), events);
        let (shared, stream) = share(cache, stream, buffer);
        tokio::spawn(drive("test", stream));
        (shared, feed)
    }

    async fn names(
        stream: &mut (impl Stream<Item = std::sync::Arc<ConfigMap>> + Unpin),
        n: usize,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(stream.next().await.unwrap().metadata.name.clone().unwrap());
        }
        out.sort();
        out
    }

    #[tokio::test]
    async fn a_subscriber_gets_the_filled_cache_then_each_applied_object() {
        let (shared, feed) = shared(16);
        let mut sub = Box::pin(shared.subscribe());
        feed.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        feed.unbounded_send(Ok(watcher::Event::InitApply(map("a"))))
            .unwrap();
        feed.unbounded_send(Ok(watcher::Event::InitApply(map("b"))))
            .unwrap();
        feed.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
        // The objects of the initial list once: the store takes them at its end, and only
        // stored objects are offered.
        assert_eq!(names(&mut sub, 2).await, ["a", "b"]);
        feed.unbounded_send(Ok(watcher::Event::Apply(map("c"))))
            .unwrap();
        assert_eq!(names(&mut sub, 1).await, ["c"]);
        // A late subscriber starts from everything stored.
        let mut late = Box::pin(shared.subscribe());
        assert_eq!(names(&mut late, 3).await, ["a", "b", "c"]);
        // Deletions are not offered: the store no longer holds the object.
        feed.unbounded_send(Ok(watcher::Event::Delete(map("a"))))
            .unwrap();
        feed.unbounded_send(Ok(watcher::Event::Apply(map("d"))))
            .unwrap();
        assert_eq!(names(&mut late, 1).await, ["d"]);
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_gets_every_stored_object_again() {
        let (shared, feed) = shared(1);
        feed.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        feed.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
        assert!(shared.cache().synced().await);
        let mut sub = Box::pin(shared.subscribe());
        assert!(
            futures::FutureExt::now_or_never(sub.next()).is_none(),
            "empty cache"
        );
        for name in ["a", "b", "c"] {
            feed.unbounded_send(Ok(watcher::Event::Apply(map(name))))
                .unwrap();
        }
        // Wait until the watch has stored all three, then read: two were lost to the buffer.
        while shared.cache().store.state().len() < 3 {
            tokio::task::yield_now().await;
        }
        assert_eq!(names(&mut sub, 3).await, ["a", "b", "c"]);
        assert_eq!(
            names(&mut sub, 1).await,
            ["c"],
            "the one buffered is still given"
        );
    }

    #[tokio::test]
    async fn a_subscription_ends_when_the_watch_ends_before_the_cache_filled() {
        let (shared, feed) = shared(4);
        let mut sub = Box::pin(shared.subscribe());
        drop(feed);
        assert!(sub.next().await.is_none());
    }
}
