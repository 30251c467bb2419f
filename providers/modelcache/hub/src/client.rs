//! The hub's API, as much as a pull needs (hfpy = huggingface/huggingface_hub@ee0a4510):
//!
//! - `GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true`: the commit (`sha`) and
//!   the files (`siblings[{rfilename,size,blobId,lfs{sha256,size}}]`) (hfpy `hf_api.py`
//!   `model_info`);
//! - `GET {endpoint}/{repo}/resolve/{commit}/{path}`: a file, from an offset with `Range`
//!   (hfpy `file_download.py` `http_get`).
//!
//! Errors follow the hub's `X-Error-Code` header (`GatedRepo`, `RepoNotFound`,
//! `RevisionNotFound`, `EntryNotFound`; hfpy `utils/_http.py` `hf_raise_for_status`).

use reqwest_oci as reqwest;
use serde::Deserialize;
use tokio::time::Instant;

use crate::Error;
use crate::hash::Expected;
use crate::layout::{RepoId, check_etag, check_file_path, is_commit};

/// The hub's public endpoint (hfpy `constants.py` `ENDPOINT`).
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// A model-info answer larger than this is refused (a repo of 10 000 files is ~2 MB).
pub const MAX_INFO_BYTES: u64 = 32 << 20;

/// Time limits of hub requests (the node caches' shared ones: the fixed part of a
/// file's deadline restarts with each resumed attempt).
pub use kubeairunway_cache_http::Timeouts;

/// How to reach the hub.
#[derive(Clone, PartialEq, Eq)]
pub struct HubOptions {
    /// The hub's base URL (`HF_ENDPOINT`), without a trailing `/`.
    pub endpoint: String,
    /// A user access token, sent as `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Time limits.
    pub timeouts: Timeouts,
}

impl std::fmt::Debug for HubOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubOptions")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("timeouts", &self.timeouts)
            .finish()
    }
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            token: None,
            timeouts: Timeouts::default(),
        }
    }
}

impl HubOptions {
    /// The defaults, with the endpoint from `HF_ENDPOINT` when set (hfpy `constants.py`).
    pub fn from_env() -> Self {
        let mut options = Self::default();
        if let Ok(endpoint) = std::env::var("HF_ENDPOINT")
            && !endpoint.trim().is_empty()
        {
            options.endpoint = endpoint.trim().trim_end_matches('/').to_string();
        }
        options
    }
}

/// One file of a revision, checked: its path is safe, its etag plain hex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubFile {
    /// The path in the repository (`rfilename`).
    pub path: String,
    /// The size of the content in bytes (for LFS files, `lfs.size`).
    pub size: u64,
    /// The content's digest, which is also its etag.
    pub expected: Expected,
}

impl HubFile {
    /// The etag: the blob's name in the cache.
    pub fn etag(&self) -> &str {
        self.expected.hex()
    }
}

/// A revision resolved: its commit and its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionInfo {
    /// The commit (40 hex digits).
    pub commit: String,
    /// The files, in the hub's order.
    pub files: Vec<HubFile>,
}

#[derive(Deserialize)]
struct InfoJson {
    sha: Option<String>,
    siblings: Option<Vec<SiblingJson>>,
}

#[derive(Deserialize)]
struct SiblingJson {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<LfsJson>,
}

#[derive(Deserialize)]
struct LfsJson {
    sha256: String,
    size: u64,
}

/// The commit and files of a model-info answer (`?blobs=true`): an LFS file is named by
/// its sha256 (`lfs.sha256`, size `lfs.size`), a regular one by its git blob id
/// (`blobId`). Any path, commit or digest that could not safely name a file is refused.
pub fn parse_revision_info(what: &str, body: &[u8]) -> Result<RevisionInfo, Error> {
    let protocol = |message: String| Error::Protocol {
        what: what.to_string(),
        message,
    };
    let info: InfoJson = serde_json::from_slice(body)
        .map_err(|e| protocol(format!("not a model-info answer: {e}")))?;
    let commit = info
        .sha
        .ok_or_else(|| protocol("no `sha` (commit) in the answer".into()))?;
    if !is_commit(&commit) {
        return Err(Error::invalid("commit", &commit, "expected 40 hex digits"));
    }
    let siblings = info
        .siblings
        .ok_or_else(|| protocol("no `siblings` (files) in the answer".into()))?;
    let mut files = Vec::with_capacity(siblings.len());
    let mut seen = std::collections::BTreeSet::new();
    for s in siblings {
        check_file_path(&s.rfilename)?;
        if !seen.insert(s.rfilename.clone()) {
            return Err(protocol(format!("{} is listed twice", s.rfilename)));
        }
        let (size, expected) = match (s.lfs, s.blob_id, s.size) {
            (Some(lfs), _, _) => (lfs.size, Expected::Sha256(lfs.sha256.to_ascii_lowercase())),
            (None, Some(blob), Some(size)) => (size, Expected::GitSha1(blob.to_ascii_lowercase())),
            _ => {
                return Err(protocol(format!(
                    "{} has no blobId and size (was ?blobs=true honoured?)",
                    s.rfilename
                )));
            }
        };
        check_etag(expected.hex())?;
        let digest_len = match expected {
            Expected::Sha256(_) => 64,
            Expected::GitSha1(_) => 40,
        };
        if expected.hex().len() != digest_len {
            return Err(Error::invalid(
                "etag",
                expected.hex(),
                "not a digest of its kind",
            ));
        }
        files.push(HubFile {
            path: s.rfilename,
            size,
            expected,
        });
    }
    Ok(RevisionInfo { commit, files })
}

/// The error of a non-success answer, from its status and `X-Error-Code` (hfpy
/// `utils/_http.py`): a gated repo says whether a token was sent.
pub fn status_error(
    what: &str,
    repo: &RepoId,
    revision: &str,
    path: Option<&str>,
    status: u16,
    code: Option<&str>,
    with_token: bool,
) -> Error {
    match code {
        Some("GatedRepo") => Error::Gated {
            repo: repo.to_string(),
            with_token,
        },
        Some("RepoNotFound") => Error::RepoNotFound {
            repo: repo.to_string(),
        },
        Some("RevisionNotFound") => Error::RevisionNotFound {
            repo: repo.to_string(),
            revision: revision.to_string(),
        },
        Some("EntryNotFound") => Error::EntryNotFound {
            repo: repo.to_string(),
            commit: revision.to_string(),
            path: path.unwrap_or_default().to_string(),
        },
        _ if status == 401 || status == 403 => Error::Unauthorized {
            what: what.to_string(),
            status,
        },
        _ => Error::Status {
            what: what.to_string(),
            status,
        },
    }
}

/// The error of a non-success answer about no repository in particular.
fn status_error_plain(what: &str, status: u16) -> Error {
    if status == 401 || status == 403 {
        Error::Unauthorized {
            what: what.to_string(),
            status,
        }
    } else {
        Error::Status {
            what: what.to_string(),
            status,
        }
    }
}

/// A client of one hub.
#[derive(Clone)]
pub struct Hub {
    http: reqwest::Client,
    endpoint: url::Url,
    token: Option<String>,
    timeouts: Timeouts,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("endpoint", &self.endpoint.as_str())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// A client of the hub `options` name.
    pub fn new(options: &HubOptions) -> Result<Self, Error> {
        let endpoint = url::Url::parse(options.endpoint.trim_end_matches('/'))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| Error::invalid("endpoint", &options.endpoint, "not an http(s) URL"))?;
        let http = reqwest::Client::builder()
            .connect_timeout(options.timeouts.connect)
            .read_timeout(options.timeouts.idle)
            .redirect(kubeairunway_cache_http::redirects())
            .user_agent(concat!(
                "kubeairunway-modelcache/",
                env!("CARGO_PKG_VERSION")
            ))
            .build()
            .map_err(|e| Error::Transport {
                what: "building the HTTP client".into(),
                message: e.to_string(),
            })?;
        Ok(Self {
            http,
            endpoint,
            token: options.token.clone().filter(|t| !t.is_empty()),
            timeouts: options.timeouts,
        })
    }

    /// The time limits.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// The endpoint with `segments` appended, each percent-encoded as one segment.
    pub(crate) fn url(&self, segments: &[&str]) -> url::Url {
        let mut url = self.endpoint.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty();
            path.extend(segments);
        }
        url
    }

    /// `{endpoint}/{repo}/resolve/{commit}/{path}`.
    pub fn resolve_url(&self, repo: &RepoId, commit: &str, path: &str) -> url::Url {
        let mut segments: Vec<&str> = repo.as_str().split('/').collect();
        segments.extend(["resolve", commit]);
        segments.extend(path.split('/'));
        self.url(&segments)
    }

    /// Sends `request` (with the token) before `deadline`.
    async fn send(
        &self,
        what: &str,
        mut request: reqwest::RequestBuilder,
        deadline: Instant,
    ) -> Result<reqwest::Response, Error> {
        if let Some(token) = &self.token {
            request = request.header(reqwest::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        match tokio::time::timeout_at(deadline, request.send()).await {
            Err(_) => Err(Error::Transport {
                what: what.to_string(),
                message: "timed out".into(),
            }),
            Ok(Err(e)) => Err(transport(what, &e)),
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// The commit `revision` names in `repo`, and its files.
    pub async fn revision(&self, repo: &RepoId, revision: &str) -> Result<RevisionInfo, Error> {
        let what = format!("model info of {repo} at {revision}");
        let mut segments = vec!["api", "models"];
        segments.extend(repo.as_str().split('/'));
        segments.extend(["revision", revision]);
        let mut url = self.url(&segments);
        url.set_query(Some("blobs=true"));
        let body = self
            .get_json_body(&what, url, Some((repo, revision)))
            .await?;
        parse_revision_info(&what, &body)
    }

    /// The body of a JSON `GET` of `url` (an API answer, about a repository at a
    /// revision when `about` says so), capped at [`MAX_INFO_BYTES`] and under the request
    /// deadline; errors typed.
    pub(crate) async fn get_json_body(
        &self,
        what: &str,
        url: url::Url,
        about: Option<(&RepoId, &str)>,
    ) -> Result<Vec<u8>, Error> {
        let deadline = Instant::now() + self.timeouts.request;
        let mut response = self.send(what, self.http.get(url), deadline).await?;
        if !response.status().is_success() {
            return Err(match about {
                Some((repo, revision)) => self.error(what, repo, revision, None, &response),
                None => status_error_plain(what, response.status().as_u16()),
            });
        }
        read_capped(what, &mut response, deadline, MAX_INFO_BYTES).await
    }

    /// `GET` the file `path` of `commit` from byte `from` on (a `Range` request when
    /// `from > 0`); the answer's status is the caller's to judge (`200` or `206`), any
    /// other success is refused, errors are typed.
    pub async fn get_file(
        &self,
        repo: &RepoId,
        commit: &str,
        path: &str,
        from: u64,
        deadline: Instant,
    ) -> Result<reqwest::Response, Error> {
        let what = format!("{repo}/{path}");
        let mut request = self
            .http
            .get(self.resolve_url(repo, commit, path))
            .header(reqwest::header::ACCEPT_ENCODING, "identity");
        if from > 0 {
            request = request.header(reqwest::header::RANGE, format!("bytes={from}-"));
        }
        let response = self.send(&what, request, deadline).await?;
        let status = response.status().as_u16();
        if status == 200 || status == 206 || status == 416 {
            Ok(response)
        } else {
            Err(self.error(&what, repo, commit, Some(path), &response))
        }
    }

    /// Whether this client may download `path` of `commit`: a `HEAD` of the file, as
    /// huggingface_hub's `get_hf_file_metadata` does (the hub lists a gated repository's
    /// files to anyone and gates their downloads, so only a file request tells).
    pub async fn check_access(&self, repo: &RepoId, commit: &str, path: &str) -> Result<(), Error> {
        let what = format!("{repo}/{path}");
        let deadline = Instant::now() + self.timeouts.request;
        let response = self
            .send(
                &what,
                self.http.head(self.resolve_url(repo, commit, path)),
                deadline,
            )
            .await?;
        if response.status().is_success() || response.status().is_redirection() {
            Ok(())
        } else {
            Err(self.error(&what, repo, commit, Some(path), &response))
        }
    }

    fn error(
        &self,
        what: &str,
        repo: &RepoId,
        revision: &str,
        path: Option<&str>,
        response: &reqwest::Response,
    ) -> Error {
        let code = response
            .headers()
            .get("x-error-code")
            .and_then(|v| v.to_str().ok());
        status_error(
            what,
            repo,
            revision,
            path,
            response.status().as_u16(),
            code,
            self.token.is_some(),
        )
    }
}

/// The body of `response`, refused past `cap` bytes (announced or received) and at
/// `deadline`.
pub(crate) async fn read_capped(
    what: &str,
    response: &mut reqwest::Response,
    deadline: Instant,
    cap: u64,
) -> Result<Vec<u8>, Error> {
    let too_large = || Error::Protocol {
        what: what.to_string(),
        message: format!("the answer is larger than {cap} bytes"),
    };
    if response.content_length().is_some_and(|n| n > cap) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) => {
                return Err(Error::Transport {
                    what: what.to_string(),
                    message: "timed out".into(),
                });
            }
            Ok(Err(e)) => return Err(transport(what, &e)),
            Ok(Ok(None)) => return Ok(body),
            Ok(Ok(Some(chunk))) => {
                if (body.len() + chunk.len()) as u64 > cap {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
        }
    }
}

/// A reqwest error with its causes (reqwest's own message hides them).
pub(crate) fn transport(what: &str, e: &reqwest::Error) -> Error {
    use std::fmt::Write as _;
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let _ = write!(message, ": {s}");
        source = s.source();
    }
    Error::Transport {
        what: what.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn lfs_files_are_named_by_sha256_and_regular_ones_by_git_blob_id() {
        let body = serde_json::json!({
            "id": "o/n", "sha": COMMIT,
            "siblings": [
                {"rfilename": "config.json", "size": 6, "blobId": "CE013625030BA8DBA906F756967F9E9CA394464A"},
                {"rfilename": "w/model.safetensors", "size": 134, "blobId": "1".repeat(40),
                 "lfs": {"sha256": "a".repeat(64), "size": 1000, "pointerSize": 134}}
            ]
        });
        let info = parse_revision_info("t", body.to_string().as_bytes()).unwrap();
        assert_eq!(info.commit, COMMIT);
        assert_eq!(
            info.files,
            vec![
                HubFile {
                    path: "config.json".into(),
                    size: 6,
                    expected: Expected::GitSha1("ce013625030ba8dba906f756967f9e9ca394464a".into())
                },
                HubFile {
                    path: "w/model.safetensors".into(),
                    size: 1000,
                    expected: Expected::Sha256("a".repeat(64))
                },
            ]
        );
    }

    #[test]
    fn hostile_answers_are_refused_before_they_name_a_file() {
        let answer = |sha: &str, name: &str, blob: &str| {
            serde_json::json!({"sha": sha, "siblings": [{"rfilename": name, "size": 1, "blobId": blob}]})
                .to_string()
        };
        let blob = "b".repeat(40);
        for (sha, name, blob) in [
            ("../x", "a", blob.as_str()),
            (COMMIT, "../../etc/passwd", &blob),
            (COMMIT, "/etc/passwd", &blob),
            (COMMIT, "a\\b", &blob),
            (COMMIT, "a", "../../x"),
            (COMMIT, "a", &"b".repeat(64)), // a sha256-long blob id for a regular file
        ] {
            assert!(
                parse_revision_info("t", answer(sha, name, blob).as_bytes()).is_err(),
                "{sha} {name} {blob}"
            );
        }
        assert!(parse_revision_info("t", b"{").is_err());
        assert!(parse_revision_info("t", br#"{"sha": "x"}"#).is_err());
    }

    #[test]
    fn error_codes_become_typed_errors() {
        let repo = RepoId::parse("o/n").unwrap();
        let e =
            |status, code, token| status_error("w", &repo, "main", Some("f"), status, code, token);
        assert!(matches!(
            e(401, Some("GatedRepo"), false),
            Error::Gated {
                with_token: false,
                ..
            }
        ));
        assert!(matches!(
            e(403, Some("GatedRepo"), true),
            Error::Gated {
                with_token: true,
                ..
            }
        ));
        assert!(
            e(401, Some("GatedRepo"), false)
                .to_string()
                .contains("--token-file")
        );
        assert!(matches!(
            e(401, Some("RepoNotFound"), false),
            Error::RepoNotFound { .. }
        ));
        assert!(matches!(
            e(404, Some("RevisionNotFound"), false),
            Error::RevisionNotFound { .. }
        ));
        assert!(matches!(
            e(404, Some("EntryNotFound"), false),
            Error::EntryNotFound { .. }
        ));
        assert!(matches!(
            e(403, None, true),
            Error::Unauthorized { status: 403, .. }
        ));
        assert!(e(503, None, false).transient());
        assert!(!e(404, None, false).transient());
    }

    #[test]
    fn urls_encode_each_segment() {
        let hub = Hub::new(&HubOptions {
            endpoint: "http://127.0.0.1:1/mirror/".into(),
            ..HubOptions::default()
        })
        .unwrap();
        let repo = RepoId::parse("o/n").unwrap();
        assert_eq!(
            hub.resolve_url(&repo, COMMIT, "a b/c#d?.json").as_str(),
            format!("http://127.0.0.1:1/mirror/o/n/resolve/{COMMIT}/a%20b/c%23d%3F.json")
        );
        assert!(
            Hub::new(&HubOptions {
                endpoint: "file:///etc".into(),
                ..HubOptions::default()
            })
            .is_err()
        );
    }
}
