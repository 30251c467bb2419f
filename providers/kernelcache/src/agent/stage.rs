//! The registry work of the agent, run as tasks beside the loop: reading an image's
//! labels (to decide compatibility before any download) and staging a pinned digest
//! (pull, digest verification while streaming, safe atomic extraction, manifest check,
//! Triton group files rewritten to the mount path).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::plan::Wanted;
use super::secrets::{SecretApi, auth_for};
use crate::extract::{Extracted, Limits};
use crate::image::Target;
use crate::oci::Puller;

/// What a task produced.
#[derive(Debug)]
pub enum Outcome {
    /// The targets the image's labels list, or why they could not be read.
    Inspected(Result<Vec<Target>, String>),
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
    /// Registries spoken to over plain HTTP.
    pub plain_http: Vec<String>,
    /// Where pull Secrets come from.
    pub secrets: Arc<dyn SecretApi>,
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
    async fn puller(&self, w: &Wanted) -> Result<Puller, String> {
        let auth = auth_for(
            self.secrets.as_ref(),
            &w.key.namespace,
            &w.pull_secrets,
            &w.pinned,
        )
        .await?;
        Ok(Puller::new(auth, self.plain_http.clone()))
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
            Ok(image.targets)
        }
        .await;
        Outcome::Inspected(result)
    }

    /// Stage `w` under the root.
    pub async fn stage(&self, w: &Wanted) -> Outcome {
        let started = Instant::now();
        let result = async {
            let staged = self
                .puller(w)
                .await?
                .stage(
                    &w.pinned,
                    &self.root,
                    &w.key.namespace,
                    &w.key.name,
                    Some(&w.triton_mount),
                    self.limits,
                )
                .await
                .map_err(|e| format!("staging {}: {e}", w.pinned))?;
            Ok(staged.extracted)
        }
        .await;
        Outcome::Staged {
            result,
            took: started.elapsed(),
        }
    }
}
