//! One identity's view of the cluster: its client and its watch cache of ModelDeployments
//! (the list and the live stream read the cache, never the API server). The local
//! dashboard has one, for the kubeconfig's identity; in the cluster each signed-in user
//! has their own ([`super::session`]).

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use kubeairunway_sdk::{ModelDeployment, reflect};
use tokio::sync::watch;

/// A client and what it sees of ModelDeployments, followed until dropped.
pub struct View {
    /// The API server, as this identity.
    pub client: Client,
    /// Every ModelDeployment this identity may list (stripped of managed fields).
    pub mds: reflect::Cache<ModelDeployment>,
    /// Bumped on each change the watch delivers after its first list.
    pub changes: watch::Receiver<u64>,
    feed: tokio::task::AbortHandle,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View").finish_non_exhaustive()
    }
}

impl View {
    /// Start watching ModelDeployments as `client` (must run on a Tokio runtime).
    pub fn start(client: Client) -> Self {
        let (mds, stream) = reflect::cache(
            Api::<ModelDeployment>::all(client.clone()),
            watcher::Config::default(),
            (),
            reflect::strip,
        );
        let (tx, changes) = watch::channel(0u64);
        let feed = tokio::spawn(stream.for_each(move |event| {
            if let Err(e) = &event {
                tracing::warn!(error = %e, "dashboard: ModelDeployment watch failed; retrying");
            } else if !matches!(
                event,
                Ok(watcher::Event::Init | watcher::Event::InitApply(_))
            ) {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
            futures::future::ready(())
        }))
        .abort_handle();
        Self {
            client,
            mds,
            changes,
            feed,
        }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        self.feed.abort();
    }
}
