//! A loopback stand-in of the Hugging Face hub (feature `testing`), serving what a pull
//! and huggingface_hub's `snapshot_download`/`hf_hub_download` ask (hfpy =
//! huggingface/huggingface_hub@ee0a4510: `hf_api.py` `model_info`, `list_repo_tree`;
//! `file_download.py` `get_hf_file_metadata`, `http_get`; `utils/_http.py`):
//!
//! - `GET /api/models/{org}/{name}/revision/{rev}?blobs=true`: `{id, sha, siblings}`;
//! - `GET /api/models/{org}/{name}/tree/{rev}?recursive=...`: the files, one page;
//! - `HEAD`/`GET /{org}/{name}/resolve/{rev}/{path}`: `X-Repo-Commit`, `ETag`, and for
//!   LFS files `X-Linked-Etag`/`X-Linked-Size`; `Range: bytes=<n>-[<m>]` answered `206`
//!   with `Content-Range`;
//! - `GET /api/models?search=<q>&limit=<n>`: repositories whose id contains the query,
//!   most downloaded first (`list_models`); `GET /api/models/{org}/{name}?expand[]=safetensors`:
//!   `{id, sha, safetensors: {parameters, total}}` when parameters were set
//!   (`model_info(expand=...)`);
//! - a gated repo answers `401` with `X-Error-Code: GatedRepo` without its token (with
//!   [`StandIn::gate_files`], only its files do: the hub lists a gated model's files to
//!   anyone and gates their downloads); unknown
//!   repos, revisions and files answer `RepoNotFound`, `RevisionNotFound`,
//!   `EntryNotFound`.
//!
//! Faults: the connection dies after `n` bytes of a file (once), a file's bytes are wrong.
//! Content is either bytes or a pattern generated as it is sent (large files cost no
//! memory).
#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    clippy::cast_possible_truncation,
    clippy::result_large_err
)] // test support: a failure here is a failed test; the stand-in runs on 64-bit hosts

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Response, StatusCode};
use axum::routing::get;
use bytes::Bytes;

use crate::hash::{Expected, git_blob_sha1, hex};

/// Bytes sent per chunk.
const CHUNK: u64 = 256 << 10;

/// A file's content.
#[derive(Clone, Debug)]
pub enum Content {
    /// These bytes.
    Bytes(Bytes),
    /// `len` bytes of a pattern of `seed`, generated as they are sent.
    Pattern {
        /// The length.
        len: u64,
        /// Different seeds give different bytes.
        seed: u8,
    },
}

impl Content {
    /// The length.
    pub fn len(&self) -> u64 {
        match self {
            Self::Bytes(b) => b.len() as u64,
            Self::Pattern { len, .. } => *len,
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes `from..to`.
    pub fn slice(&self, from: u64, to: u64) -> Bytes {
        match self {
            Self::Bytes(b) => b.slice(from as usize..to as usize),
            Self::Pattern { seed, .. } => (from..to)
                .map(|i| (i.wrapping_mul(31) ^ (i >> 13)) as u8 ^ seed)
                .collect::<Vec<u8>>()
                .into(),
        }
    }

    /// All of it (for small files and tests).
    pub fn to_vec(&self) -> Vec<u8> {
        self.slice(0, self.len()).to_vec()
    }
}

/// A file of a commit, with its digests.
#[derive(Clone, Debug)]
pub struct StandInFile {
    /// The path in the repository.
    pub path: String,
    /// The content.
    pub content: Content,
    /// Stored with LFS (named by sha256) or not (named by git blob id).
    pub lfs: bool,
    /// Its etag: sha256 (LFS) or git blob sha1.
    pub etag: String,
    /// The sha256 of the content (what the tests compare).
    pub sha256: String,
}

impl StandInFile {
    /// A file; its digests are computed here (one pass over the content).
    pub fn new(path: &str, content: Content, lfs: bool) -> Self {
        use sha2::Digest as _;
        let mut sha = sha2::Sha256::new();
        let mut git = Expected::GitSha1(String::new()).hasher(content.len());
        let mut at = 0;
        while at < content.len() {
            let end = (at + CHUNK).min(content.len());
            let part = content.slice(at, end);
            sha.update(&part);
            git.update(&part);
            at = end;
        }
        let sha256 = hex(&sha.finalize());
        let etag = if lfs { sha256.clone() } else { git.finish() };
        Self {
            path: path.to_string(),
            content,
            lfs,
            etag,
            sha256,
        }
    }

    /// A regular (non-LFS) file of `bytes`.
    pub fn regular(path: &str, bytes: &[u8]) -> Self {
        Self::new(path, Content::Bytes(Bytes::copy_from_slice(bytes)), false)
    }

    /// An LFS file of `bytes`.
    pub fn lfs(path: &str, bytes: &[u8]) -> Self {
        Self::new(path, Content::Bytes(Bytes::copy_from_slice(bytes)), true)
    }
}

/// A commit id made from `name` (the git blob id of it: 40 hex digits).
pub fn commit_id(name: &str) -> String {
    git_blob_sha1(name.as_bytes())
}

/// One request the stand-in answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// `GET` or `HEAD`.
    pub method: String,
    /// The request path.
    pub path: String,
    /// The start of a `Range` header, if any.
    pub range_from: Option<u64>,
    /// The status answered.
    pub status: u16,
}

#[derive(Default, Debug)]
struct Repo {
    refs: BTreeMap<String, String>,
    commits: BTreeMap<String, Vec<StandInFile>>,
    token: Option<String>,
    /// The model info and listing answer without the token: only files are gated.
    files_only: bool,
    /// Parameters (its safetensors headers' total) and downloads, for browsing.
    parameters: Option<u64>,
    downloads: u64,
}

#[derive(Default, Debug)]
struct Inner {
    repos: BTreeMap<String, Repo>,
    /// Path in repo -> bytes after which the connection dies (once).
    die_after: BTreeMap<String, u64>,
    /// Path in repo -> bytes after which the body stalls, the connection kept (once).
    stall_after: BTreeMap<String, u64>,
    /// Paths whose bytes are served wrong.
    corrupt: std::collections::BTreeSet<String>,
    log: Vec<Logged>,
    /// Path in repo -> body bytes sent.
    sent: BTreeMap<String, u64>,
}

type Shared = Arc<Mutex<Inner>>;

/// The stand-in, serving on loopback until dropped.
#[derive(Debug)]
pub struct StandIn {
    /// `http://127.0.0.1:<port>`: the endpoint (`HF_ENDPOINT`).
    pub url: String,
    inner: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StandIn {
    /// Starts serving on a free loopback port.
    pub async fn start() -> Self {
        let inner: Shared = Arc::default();
        let app = Router::new()
            .route("/api/models", get(search))
            .route("/api/models/{org}/{name}", get(summary))
            .route("/api/models/{org}/{name}/revision/{rev}", get(model_info))
            .route("/api/models/{org}/{name}/tree/{rev}", get(tree))
            .route("/{org}/{name}/resolve/{rev}/{*path}", get(resolve))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, inner, task }
    }

    /// Adds commit `commit` of `repo` with `files`, named by `revision` (which then
    /// moves to it).
    pub fn commit(&self, repo: &str, revision: &str, commit: &str, files: Vec<StandInFile>) {
        let mut inner = self.inner.lock().unwrap();
        let r = inner.repos.entry(repo.to_string()).or_default();
        r.commits.insert(commit.to_string(), files);
        r.refs.insert(revision.to_string(), commit.to_string());
    }

    /// Gates `repo`: only requests with `authorization: Bearer <token>` get through.
    pub fn gate(&self, repo: &str, token: &str) {
        let mut inner = self.inner.lock().unwrap();
        inner.repos.entry(repo.to_string()).or_default().token = Some(token.to_string());
    }

    /// What browsing the hub shows of `repo`: its parameter count (safetensors) and its
    /// downloads.
    pub fn describe(&self, repo: &str, parameters: u64, downloads: u64) {
        let mut inner = self.inner.lock().unwrap();
        let r = inner.repos.entry(repo.to_string()).or_default();
        r.parameters = Some(parameters);
        r.downloads = downloads;
    }

    /// Gates the files of `repo` only: its model info and listing answer anyone.
    pub fn gate_files(&self, repo: &str, token: &str) {
        let mut inner = self.inner.lock().unwrap();
        let r = inner.repos.entry(repo.to_string()).or_default();
        r.token = Some(token.to_string());
        r.files_only = true;
    }

    /// The next `GET` of `path` (in any repo) dies after `bytes` bytes of body.
    pub fn die_after(&self, path: &str, bytes: u64) {
        self.inner
            .lock()
            .unwrap()
            .die_after
            .insert(path.to_string(), bytes);
    }

    /// The next `GET` of `path` (in any repo) sends `bytes` bytes of body, then nothing
    /// more, the connection kept open (a process to kill midway).
    pub fn stall_after(&self, path: &str, bytes: u64) {
        self.inner
            .lock()
            .unwrap()
            .stall_after
            .insert(path.to_string(), bytes);
    }

    /// Every `GET` of `path` sends wrong bytes (same length).
    pub fn corrupt(&self, path: &str) {
        self.inner.lock().unwrap().corrupt.insert(path.to_string());
    }

    /// The requests answered so far.
    pub fn log(&self) -> Vec<Logged> {
        self.inner.lock().unwrap().log.clone()
    }

    /// Body bytes sent for `path` (in any repo) so far.
    pub fn sent(&self, path: &str) -> u64 {
        self.inner
            .lock()
            .unwrap()
            .sent
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("x-error-code", code)
        .header("x-error-message", message)
        .header("content-type", "application/json")
        .body(Body::from(
            serde_json::json!({ "error": message }).to_string(),
        ))
        .unwrap()
}

/// The repo's commit for `rev` and its files, or the hub's error answer.
fn lookup(
    inner: &Inner,
    repo: &str,
    rev: &str,
    headers: &HeaderMap,
    file: bool,
) -> Result<(String, Vec<StandInFile>), Response<Body>> {
    let Some(r) = inner.repos.get(repo) else {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "RepoNotFound",
            "Repository Not Found",
        ));
    };
    if let Some(token) = r.token.as_ref().filter(|_| file || !r.files_only) {
        let sent = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if sent != format!("Bearer {token}") {
            return Err(error(
                StatusCode::UNAUTHORIZED,
                "GatedRepo",
                &format!(
                    "Access to model {repo} is restricted. You must have access to it and be authenticated to access it. Please log in."
                ),
            ));
        }
    }
    let commit = r.refs.get(rev).cloned().unwrap_or_else(|| rev.to_string());
    match r.commits.get(&commit) {
        Some(files) => Ok((commit, files.clone())),
        None => Err(error(
            StatusCode::NOT_FOUND,
            "RevisionNotFound",
            &format!("Invalid rev id: {rev}"),
        )),
    }
}

fn log(inner: &Shared, method: &Method, path: String, range_from: Option<u64>, status: u16) {
    inner.lock().unwrap().log.push(Logged {
        method: method.to_string(),
        path,
        range_from,
        status,
    });
}

fn json(value: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(value.to_string()))
        .unwrap()
}

/// Which listing an API request asks for.
#[derive(Clone, Copy)]
enum Listing {
    /// `/api/models/{repo}/revision/{rev}?blobs=true` (hfpy `ModelInfo`, `RepoSibling`).
    Info,
    /// `/api/models/{repo}/tree/{rev}` (hfpy `RepoFile`).
    Tree,
}

/// One file as `listing` describes it: LFS files by their pointer's blob id plus
/// `lfs{sha256|oid, size, pointerSize}`, others by their blob id.
fn entry(listing: Listing, f: &StandInFile) -> serde_json::Value {
    let (blob_id, lfs) = if f.lfs {
        let p = pointer(f);
        let digest = match listing {
            Listing::Info => "sha256",
            Listing::Tree => "oid",
        };
        let lfs =
            serde_json::json!({digest: f.sha256, "size": f.content.len(), "pointerSize": p.len()});
        (git_blob_sha1(p.as_bytes()), Some(lfs))
    } else {
        (f.etag.clone(), None)
    };
    let mut e = match listing {
        Listing::Info => {
            serde_json::json!({"rfilename": f.path, "size": f.content.len(), "blobId": blob_id})
        }
        Listing::Tree => {
            serde_json::json!({"type": "file", "path": f.path, "size": f.content.len(), "oid": blob_id})
        }
    };
    if let Some(lfs) = lfs {
        e["lfs"] = lfs;
    }
    e
}

fn list(
    listing: Listing,
    inner: &Shared,
    (org, name, rev): (String, String, String),
    method: &Method,
    headers: &HeaderMap,
) -> Response<Body> {
    let repo = format!("{org}/{name}");
    let answer = {
        let guard = inner.lock().unwrap();
        lookup(&guard, &repo, &rev, headers, false)
    };
    let response = match answer {
        Err(e) => e,
        Ok((commit, files)) => {
            let entries: Vec<serde_json::Value> = files.iter().map(|f| entry(listing, f)).collect();
            json(&match listing {
                Listing::Info => {
                    serde_json::json!({"id": repo, "modelId": repo, "sha": commit, "private": false, "siblings": entries})
                }
                Listing::Tree => serde_json::Value::Array(entries),
            })
        }
    };
    let kind = match listing {
        Listing::Info => "revision",
        Listing::Tree => "tree",
    };
    let path = format!("/api/models/{repo}/{kind}/{rev}");
    log(inner, method, path, None, response.status().as_u16());
    response
}

async fn model_info(
    State(inner): State<Shared>,
    Path(params): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response<Body> {
    list(Listing::Info, &inner, params, &method, &headers)
}

#[derive(serde::Deserialize)]
struct SearchQuery {
    search: Option<String>,
    limit: Option<usize>,
}

/// Repositories whose id contains the query, most downloaded first.
async fn search(
    State(inner): State<Shared>,
    axum::extract::Query(q): axum::extract::Query<SearchQuery>,
    method: Method,
) -> Response<Body> {
    let query = q.search.unwrap_or_default().to_lowercase();
    let mut found: Vec<(u64, String)> = {
        let guard = inner.lock().unwrap();
        guard
            .repos
            .iter()
            .filter(|(id, _)| id.to_lowercase().contains(&query))
            .map(|(id, r)| (r.downloads, id.clone()))
            .collect()
    };
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    found.truncate(q.limit.unwrap_or(1000));
    log(&inner, &method, "/api/models".into(), None, 200);
    json(&serde_json::Value::Array(
        found
            .into_iter()
            .map(|(downloads, id)| {
                serde_json::json!({"_id": id, "id": id, "modelId": id, "downloads": downloads,
                                   "likes": 0, "private": false, "pipeline_tag": "text-generation"})
            })
            .collect(),
    ))
}

/// A repository's summary at `main`, with its safetensors parameter count when set.
async fn summary(
    State(inner): State<Shared>,
    Path((org, name)): Path<(String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response<Body> {
    let repo = format!("{org}/{name}");
    let answer = {
        let guard = inner.lock().unwrap();
        lookup(&guard, &repo, "main", &headers, false)
            .map(|(commit, _)| (commit, guard.repos.get(&repo).and_then(|r| r.parameters)))
    };
    let response = match answer {
        Err(e) => e,
        Ok((commit, parameters)) => {
            let mut body = serde_json::json!({"_id": repo, "id": repo, "modelId": repo, "sha": commit,
                                              "private": false, "pipeline_tag": "text-generation"});
            if let Some(total) = parameters {
                body["safetensors"] =
                    serde_json::json!({"parameters": {"BF16": total}, "total": total});
            }
            json(&body)
        }
    };
    log(
        &inner,
        &method,
        format!("/api/models/{repo}"),
        None,
        response.status().as_u16(),
    );
    response
}

async fn tree(
    State(inner): State<Shared>,
    Path(params): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response<Body> {
    list(Listing::Tree, &inner, params, &method, &headers)
}

/// The git-lfs pointer of an LFS file (what its `blobId` names).
fn pointer(f: &StandInFile) -> String {
    format!(
        "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize {}\n",
        f.sha256,
        f.content.len()
    )
}

/// `bytes=<from>-[<to>]` -> (from, inclusive end).
fn parse_range(value: &str, len: u64) -> Option<(u64, Option<u64>)> {
    let spec = value.trim().strip_prefix("bytes=")?;
    let (from, to) = spec.split_once('-')?;
    let from: u64 = from.trim().parse().ok()?;
    let to = if to.trim().is_empty() {
        None
    } else {
        Some(to.trim().parse::<u64>().ok()?.min(len.saturating_sub(1)))
    };
    Some((from, to))
}

async fn resolve(
    State(inner): State<Shared>,
    Path((org, name, rev, path)): Path<(String, String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response<Body> {
    let repo = format!("{org}/{name}");
    let logged = format!("/{repo}/resolve/{rev}/{path}");
    let answer = {
        let guard = inner.lock().unwrap();
        lookup(&guard, &repo, &rev, &headers, true)
    };
    let (commit, files) = match answer {
        Ok(found) => found,
        Err(e) => {
            log(&inner, &method, logged, None, e.status().as_u16());
            return e;
        }
    };
    let Some(file) = files.into_iter().find(|f| f.path == path) else {
        log(&inner, &method, logged, None, 404);
        return error(
            StatusCode::NOT_FOUND,
            "EntryNotFound",
            &format!("{path} does not exist"),
        );
    };
    let len = file.content.len();
    let range = headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_range(v, len));
    let mut builder = Response::builder()
        .header("x-repo-commit", &commit)
        .header("accept-ranges", "bytes")
        .header("content-type", "application/octet-stream");
    if file.lfs {
        builder = builder
            .header(
                "etag",
                format!("\"{}\"", git_blob_sha1(pointer(&file).as_bytes())),
            )
            .header("x-linked-etag", format!("\"{}\"", file.etag))
            .header("x-linked-size", len.to_string());
    } else {
        builder = builder.header("etag", format!("\"{}\"", file.etag));
    }
    let (from, to) = match range {
        Some((from, _)) if from >= len && len > 0 => {
            log(&inner, &method, logged, Some(from), 416);
            return builder
                .status(StatusCode::RANGE_NOT_SATISFIABLE)
                .header("content-range", format!("bytes */{len}"))
                .body(Body::empty())
                .unwrap();
        }
        Some((from, to)) => (from, to.map_or(len, |t| t + 1)),
        None => (0, len),
    };
    let status = if range.is_some() {
        builder = builder.header(
            "content-range",
            format!("bytes {from}-{}/{len}", to.saturating_sub(1)),
        );
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    builder = builder
        .status(status)
        .header("content-length", (to - from).to_string());
    log(&inner, &method, logged, range.map(|r| r.0), status.as_u16());
    if method == Method::HEAD {
        return builder.body(Body::empty()).unwrap();
    }
    let (die_at, stall_at, corrupt) = {
        let mut guard = inner.lock().unwrap();
        (
            guard.die_after.remove(&path),
            guard.stall_after.remove(&path),
            guard.corrupt.contains(&path),
        )
    };
    let state = (from, inner.clone());
    let body = futures::stream::unfold(state, move |(at, inner)| {
        let content = file.content.clone();
        let path = path.clone();
        async move {
            if at >= to {
                return None;
            }
            let mut end = (at + CHUNK).min(to);
            if let Some(die) = die_at {
                if at >= from + die {
                    let e = std::io::Error::other("the stand-in drops the connection");
                    return Some((Err(e), (to, inner)));
                }
                end = end.min(from + die);
            }
            if let Some(stall) = stall_at {
                if at >= from + stall {
                    futures::future::pending::<()>().await;
                }
                end = end.min(from + stall);
            }
            let mut chunk = content.slice(at, end);
            if corrupt {
                let mut wrong = chunk.to_vec();
                for b in &mut wrong {
                    *b = !*b;
                }
                chunk = wrong.into();
            }
            *inner.lock().unwrap().sent.entry(path).or_default() += chunk.len() as u64;
            Some((Ok::<_, std::io::Error>(chunk), (end, inner)))
        }
    });
    builder.body(Body::from_stream(body)).unwrap()
}

/// The judge of the tests: the python of a venv with the pinned huggingface_hub
/// (`tests/hfhub-venv.sh`, installed when missing). `None` (the caller skips) outside CI
/// when pip or PyPI cannot be reached; in CI a failure panics.
pub fn judge() -> Option<std::path::PathBuf> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hfhub-venv.sh");
    let out = match std::process::Command::new("bash").arg(&script).output() {
        Ok(out) => out,
        Err(e) => {
            eprintln!("SKIPPED: bash could not run {}: {e}", script.display());
            return None;
        }
    };
    if out.status.success() {
        return Some(std::path::PathBuf::from(
            String::from_utf8_lossy(&out.stdout).trim(),
        ));
    }
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(
        std::env::var_os("CI").is_none() && out.status.code() == Some(3),
        "installing huggingface_hub failed (CI needs it): {why}"
    );
    eprintln!("SKIPPED: huggingface_hub is not installable here (pip/PyPI unreachable): {why}");
    None
}

/// Runs `code` with the judge's python (`py`, from [`judge`]) and `args`, in an
/// environment without the caller's token or endpoint (`env` sets what a check needs);
/// its stdout parsed as JSON. Panics with python's output when it fails.
pub fn python(
    py: &std::path::Path,
    code: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> serde_json::Value {
    let out = std::process::Command::new(py)
        .arg("-c")
        .arg(code)
        .args(args)
        .env_remove("HF_TOKEN")
        .env_remove("HF_ENDPOINT")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", py.display()));
    assert!(
        out.status.success(),
        "python failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "python's answer is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}
