//! Browsing the hub, for people choosing a model (the dashboard's Models page), not for
//! pulls (hfpy = huggingface/huggingface_hub@ee0a4510, `hf_api.py`):
//!
//! - `GET {endpoint}/api/models?search=<q>&filter=text-generation&sort=downloads&direction=-1&limit=<n>`:
//!   models whose id contains the query, most downloaded first (`list_models`);
//! - `GET {endpoint}/api/models/{repo}?expand[]=safetensors`: the parameter count from the
//!   safetensors headers, `safetensors.total` (`model_info(expand=["safetensors"])`);
//! - `config.json` at `main` (`resolve`), for the architecture figures.

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::{Error, Hub, RepoId};

/// Most results asked of a search.
pub const MAX_RESULTS: usize = 50;
/// A `config.json` larger than this is refused (real ones are a few KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// One model of a search.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Found {
    /// Its id (`org/name`).
    pub id: String,
    /// Downloads over the last month, as the hub counts them.
    #[serde(default)]
    pub downloads: u64,
    /// Likes.
    #[serde(default)]
    pub likes: u64,
    /// Whether downloads need accepting its conditions (`false`, `"auto"`, `"manual"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gated: Option<serde_json::Value>,
}

impl Hub {
    /// Text-generation models whose id contains `query`, most downloaded first, at most
    /// `limit` (capped at [`MAX_RESULTS`]).
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<Found>, Error> {
        let what = format!("search of the hub for {query:?}");
        let mut url = self.url(&["api", "models"]);
        url.query_pairs_mut()
            .append_pair("search", query)
            .append_pair("filter", "text-generation")
            .append_pair("sort", "downloads")
            .append_pair("direction", "-1")
            .append_pair("limit", &limit.clamp(1, MAX_RESULTS).to_string());
        let body = self.get_json_body(&what, url, None).await?;
        let found: Vec<Found> = serde_json::from_slice(&body).map_err(|e| Error::Protocol {
            what: what.clone(),
            message: format!("not a list of models: {e}"),
        })?;
        Ok(found
            .into_iter()
            .filter(|f| RepoId::parse(&f.id).is_ok())
            .take(limit.clamp(1, MAX_RESULTS))
            .collect())
    }

    /// The parameter count of `repo` from its safetensors headers; `None` when the hub
    /// has none (no safetensors files).
    pub async fn parameters(&self, repo: &RepoId) -> Result<Option<u64>, Error> {
        #[derive(Deserialize)]
        struct Info {
            safetensors: Option<Safetensors>,
        }
        #[derive(Deserialize)]
        struct Safetensors {
            total: Option<u64>,
        }
        let what = format!("model info of {repo}");
        let mut segments = vec!["api", "models"];
        segments.extend(repo.as_str().split('/'));
        let mut url = self.url(&segments);
        url.query_pairs_mut().append_pair("expand[]", "safetensors");
        let body = self.get_json_body(&what, url, Some((repo, "main"))).await?;
        let info: Info = serde_json::from_slice(&body).map_err(|e| Error::Protocol {
            what,
            message: format!("not a model-info answer: {e}"),
        })?;
        Ok(info.safetensors.and_then(|s| s.total))
    }

    /// `config.json` of `repo` at `main`, parsed.
    pub async fn config(&self, repo: &RepoId) -> Result<serde_json::Value, Error> {
        let what = format!("{repo}/config.json");
        let deadline = Instant::now() + self.timeouts().request;
        let mut response = self
            .get_file(repo, "main", "config.json", 0, deadline)
            .await?;
        let body =
            crate::client::read_capped(&what, &mut response, deadline, MAX_CONFIG_BYTES).await?;
        serde_json::from_slice(&body).map_err(|e| Error::Protocol {
            what,
            message: format!("not JSON: {e}"),
        })
    }
}
