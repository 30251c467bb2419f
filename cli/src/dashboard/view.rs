//! One identity's view of the cluster: its client and its watch caches of ModelDeployments
//! (the list and the live stream read them, never the API server). The local dashboard
//! has one, for the kubeconfig's identity; in the cluster each signed-in user has their
//! own ([`super::session`]).
//!
//! The view watches every namespace; when the API server refuses that (a user whose rights
//! are in some namespaces only), a namespace asked for gets a watch of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kubeairunway_sdk::{ModelDeployment, reflect};
use tokio::sync::watch;

/// How long a request waits for a new watch to fill or be refused.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

/// Namespace watches one view keeps at most (more: the older ones stop).
const MAX_NAMESPACE_FEEDS: usize = 32;

/// A client and what it sees of ModelDeployments, followed until dropped.
pub struct View {
    /// The API server, as this identity.
    pub client: Client,
    /// The watches, by namespace (`""`: every namespace), started when first asked for.
    feeds: Mutex<HashMap<String, Held>>,
}

/// A watch and when it was last asked for.
struct Held {
    feed: Arc<Feed>,
    used: Instant,
}

/// Why a view cannot serve a request: the API server's refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unseen {
    /// Every namespace was refused and none was named: the user must choose one.
    NamespaceNeeded(String),
    /// The namespace's own watch was refused.
    Refused(String),
}

impl std::fmt::Display for Unseen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NamespaceNeeded(m) => write!(
                f,
                "{m}: you may not list ModelDeployments in every namespace; choose a namespace"
            ),
            Self::Refused(m) => f.write_str(m),
        }
    }
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View").finish_non_exhaustive()
    }
}

impl View {
    /// A view as `client` that watches nothing until asked ([`Self::feed`]).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            feeds: Mutex::default(),
        }
    }

    /// A view as `client` already watching every namespace (must run on a Tokio runtime).
    pub fn start(client: Client) -> Self {
        let view = Self::new(client);
        view.held("");
        view
    }

    /// The watch that serves `namespace` (`None`: every namespace), once filled or at most
    /// [`FIRST_LIST_WAIT`]: the all-namespaces one unless the API server refused it.
    pub async fn feed(&self, namespace: Option<&str>) -> Result<Arc<Feed>, Unseen> {
        let all = self.held("");
        let Some(refusal) = all.ready().await else {
            return Ok(all);
        };
        let Some(ns) = namespace.filter(|n| !n.is_empty()) else {
            return Err(Unseen::NamespaceNeeded(refusal));
        };
        let feed = self.held(ns);
        match feed.ready().await {
            None => Ok(feed),
            Some(refusal) => Err(Unseen::Refused(refusal)),
        }
    }

    /// The ModelDeployment `namespace/name` as this identity sees it: from a filled watch
    /// when one covers it, else one GET (a view that watches nothing right now).
    pub async fn get(&self, namespace: &str, name: &str) -> Option<Arc<ModelDeployment>> {
        let key = ObjectRef::new(name).within(namespace);
        let filled = self.feeds.lock().ok().and_then(|feeds| {
            ["", namespace]
                .iter()
                .filter_map(|k| feeds.get(*k))
                .find(|h| h.feed.mds.is_synced())
                .map(|h| h.feed.clone())
        });
        if let Some(feed) = filled {
            return feed.mds.store.get(&key);
        }
        Api::<ModelDeployment>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .map(Arc::new)
    }

    /// Stop the watches nobody has asked for in `idle` and nobody streams from: a signed-in
    /// user who left the Deployments page holds no copy of the cluster's ModelDeployments.
    pub fn release_idle(&self, idle: Duration) {
        if let Ok(mut feeds) = self.feeds.lock() {
            feeds.retain(|_, h| Arc::strong_count(&h.feed) > 1 || h.used.elapsed() < idle);
        }
    }

    /// The watch of `key` (`""`: every namespace), started if need be; counts as a use.
    fn held(&self, key: &str) -> Arc<Feed> {
        let start = || {
            Arc::new(Feed::start(if key.is_empty() {
                Api::all(self.client.clone())
            } else {
                Api::namespaced(self.client.clone(), key)
            }))
        };
        let Ok(mut feeds) = self.feeds.lock() else {
            return start();
        };
        if let Some(held) = feeds.get_mut(key) {
            held.used = Instant::now();
            return held.feed.clone();
        }
        if feeds.len() > MAX_NAMESPACE_FEEDS {
            feeds.retain(|k, _| k.is_empty());
        }
        let feed = start();
        feeds.insert(
            key.to_string(),
            Held {
                feed: feed.clone(),
                used: Instant::now(),
            },
        );
        feed
    }
}

/// One watch of ModelDeployments (all namespaces, or one) and its cache.
pub struct Feed {
    /// The ModelDeployments (stripped of managed fields).
    pub mds: reflect::Cache<ModelDeployment>,
    /// Bumped on each change the watch delivers after its first list.
    pub changes: watch::Receiver<u64>,
    /// The API server's refusal of the list (403), while it stands.
    refused: watch::Receiver<Option<String>>,
    task: tokio::task::AbortHandle,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed")
            .field("refused", &*self.refused.borrow())
            .finish_non_exhaustive()
    }
}

impl Feed {
    fn start(api: Api<ModelDeployment>) -> Self {
        let (mds, stream) = reflect::cache(api, watcher::Config::default(), (), reflect::strip);
        let (tx, changes) = watch::channel(0u64);
        let (refused_tx, refused) = watch::channel(None);
        let task = tokio::spawn(stream.for_each(move |event| {
            match &event {
                Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) if s.code == 403 => {
                    refused_tx.send_replace(Some(s.message.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "dashboard: ModelDeployment watch failed; retrying");
                }
                Ok(watcher::Event::InitDone) => {
                    refused_tx.send_replace(None);
                    tx.send_modify(|n| *n = n.wrapping_add(1));
                }
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Ok(_) => tx.send_modify(|n| *n = n.wrapping_add(1)),
            }
            futures::future::ready(())
        }))
        .abort_handle();
        Self {
            mds,
            changes,
            refused,
            task,
        }
    }

    /// Once filled or refused (at most [`FIRST_LIST_WAIT`]): the refusal, if any.
    async fn ready(&self) -> Option<String> {
        let mut refused = self.refused.clone();
        let _ = tokio::time::timeout(FIRST_LIST_WAIT, async {
            tokio::select! {
                _ = self.mds.synced() => {}
                _ = refused.wait_for(Option::is_some) => {}
            }
        })
        .await;
        if self.mds.is_synced() {
            return None;
        }
        self.refused.borrow().clone()
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(view: &View) -> Vec<String> {
        let mut keys: Vec<String> = view.feeds.lock().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// A session's watches stop once idle unless a live list streams from them; one asked
    /// for again starts again.
    #[tokio::test]
    async fn idle_watches_stop_unless_a_stream_holds_them() {
        let (service, _server) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let view = View::new(Client::new(service, "ns"));
        assert!(watched(&view).is_empty(), "nothing until asked");
        let streaming = view.held("team-a");
        drop(view.held(""));
        assert_eq!(watched(&view), ["", "team-a"]);
        view.release_idle(Duration::from_secs(3600));
        assert_eq!(watched(&view), ["", "team-a"], "not idle yet");
        view.release_idle(Duration::ZERO);
        assert_eq!(watched(&view), ["team-a"], "the streamed one stays");
        drop(streaming);
        view.release_idle(Duration::ZERO);
        assert!(watched(&view).is_empty());
        drop(view.held(""));
        assert_eq!(watched(&view), [""]);
    }
}
