//! The registry work of the agent, run as tasks beside the loop: reading an image's
//! labels (to decide compatibility before any download) and staging a pinned digest
//! (pull, digest verification while streaming, safe atomic extraction, manifest check,
//! Triton group files rewritten to the mount path).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::plan::Wanted;
use super::space;
use oci_client::secrets::RegistryAuth;

use kubeairunway_kernelcache_artifact::allow::AllowedRegistries;
use kubeairunway_kernelcache_artifact::credentials::{handover_name, registry_auth, registry_of};
use kubeairunway_kernelcache_artifact::extract::{ExtractError, Extracted, Limits};
use kubeairunway_kernelcache_artifact::image::Target;
use kubeairunway_kernelcache_artifact::oci::{PullError, Puller};
use kubeairunway_kernelcache_artifact::secrets::SecretApi;

/// The room a stage has on the node's disk, as the loop sees it when the stage starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// No budget: the extraction limits and the free-space floor only.
    Unlimited,
    /// A budget of which `used` bytes are taken (caches on disk, stages under way).
    Budget {
        /// The node's budget.
        budget: u64,
        /// Bytes taken.
        used: u64,
    },
}

impl Room {
    /// The budget and what is used of it, under a budget.
    pub fn budget(self) -> Option<(u64, u64)> {
        match self {
            Room::Unlimited => None,
            Room::Budget { budget, used } => Some((budget, used)),
        }
    }
}

/// What a task produced.
#[derive(Debug)]
pub enum Outcome {
    /// The targets the image's labels list and the size they declare, or why they could
    /// not be read.
    Inspected(Result<(Vec<Target>, Option<u64>), String>),
    /// What staging wrote, or why it failed, and how long it took.
    Staged {
        /// Files and bytes written, or the error.
        result: Result<Extracted, String>,
        /// Time taken.
        took: Duration,
    },
}

/// Runs registry work for one node.
#[derive(Clone)]
pub struct Stager {
    /// The cache root.
    pub root: PathBuf,
    /// Caps on one layer.
    pub limits: Limits,
    /// Free space no stage goes below.
    pub min_free: space::Size,
    /// Registries spoken to over plain HTTP.
    pub plain_http: Vec<String>,
    /// The registries caches may come from.
    pub allowed: AllowedRegistries,
    /// Where the handed-over credentials are read.
    pub secrets: Arc<dyn SecretApi>,
    /// The namespace of the handed-over credentials.
    pub credentials_namespace: Option<String>,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("root", &self.root)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Stager {
    /// A puller with the credentials the controller handed over for `w` (anonymous when
    /// the cache names no pull Secret).
    async fn puller(&self, w: &Wanted) -> Result<Puller, String> {
        // Checked again here (the controller pins only allowed images): no request for an
        // image of a registry the operator does not allow leaves the node.
        self.allowed.check(&w.pinned)?;
        if w.pull_secrets.is_empty() {
            return Ok(Puller::new(
                RegistryAuth::Anonymous,
                self.plain_http.clone(),
            ));
        }
        let Some(namespace) = &self.credentials_namespace else {
            return Err("the cache names imagePullSecrets, but this agent has no --credentials-namespace to receive them from the controller".into());
        };
        let name = handover_name(&w.key.namespace, &w.key.name);
        match self.secrets.get(namespace, &name).await {
            Ok(Some(data)) => {
                let auth = registry_auth(&registry_of(&w.pinned), &[(name, data)])
                    .map_err(|e| e.to_string())?;
                Ok(Puller::new(auth, self.plain_http.clone()))
            }
            Ok(None) => Err(format!(
                "the controller has not handed over this cache's registry credentials (Secret {namespace}/{name}) yet"
            )),
            Err(e) => Err(format!(
                "reading the handed-over credentials {namespace}/{name}: {e}"
            )),
        }
    }

    /// Read the labels of `w`'s pinned image.
    pub async fn inspect(&self, w: &Wanted) -> Outcome {
        let result = async {
            let (_, image) = self
                .puller(w)
                .await?
                .inspect(&w.pinned)
                .await
                .map_err(|e| format!("inspecting {}: {e}", w.pinned))?;
            Ok((image.targets, image.size_bytes))
        }
        .await;
        Outcome::Inspected(result)
    }

    /// Stage `w` under the root, within `room` (what the node's disk budget leaves, when
    /// there is one); `declared` is the size its labels declare.
    pub async fn stage(&self, w: &Wanted, room: Room, declared: Option<u64>) -> Outcome {
        let started = Instant::now();
        let result = async {
            // Read now, at the start of this stage: other stages and other writers of the
            // filesystem change it.
            let fs = space::filesystem(&self.root)?;
            let floor = self.min_free.bytes(fs.total);
            let (allowed, bound) =
                space::allowance(self.limits.max_bytes, room.budget(), fs, floor);
            let over = |size: u64| self.over(w, size, (allowed, bound), room, (fs, floor));
            if let Some(declared) = declared
                && declared > allowed
            {
                return Err(over(declared));
            }
            let limits = Limits {
                max_bytes: allowed,
                ..self.limits
            };
            let staged = self
                .puller(w)
                .await?
                .stage(
                    &w.pinned,
                    &self.root,
                    &w.key.namespace,
                    &w.key.name,
                    Some(&w.triton_mount),
                    limits,
                )
                .await
                .map_err(|e| match &e {
                    // Extraction stops at the allowance while it writes, whatever the
                    // image declared.
                    PullError::Extract(ExtractError::TooLarge { .. })
                        if bound != space::Bound::Layer =>
                    {
                        over(allowed.saturating_add(1))
                    }
                    _ => format!("staging {}: {e}", w.pinned),
                })?;
            Ok(staged.extracted)
        }
        .await;
        Outcome::Staged {
            result,
            took: started.elapsed(),
        }
    }

    /// Why a cache of `size` bytes does not fit what `bound` allows.
    fn over(
        &self,
        w: &Wanted,
        size: u64,
        (allowed, bound): (u64, space::Bound),
        room: Room,
        (fs, floor): (space::Filesystem, u64),
    ) -> String {
        let image = &w.pinned;
        match (bound, room) {
            (space::Bound::Budget, Room::Budget { budget, used }) => format!(
                "staging {image}: over the node's disk budget of {budget} bytes ({used} used by other caches, {allowed} left; the cache needs {size})"
            ),
            (space::Bound::Floor, _) => format!(
                "staging {image}: only {} bytes free on {}, and the node keeps {floor} free (--min-free): {allowed} left for a cache that needs {size}",
                fs.free,
                self.root.display()
            ),
            _ => format!(
                "staging {image}: {size} bytes, over the limit of {allowed} bytes for one cache"
            ),
        }
    }
}
