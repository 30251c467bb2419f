//! A registry client (OCI distribution API, pull only) whose every read is bounded.
//!
//! oci-client (and the sigstore crate built on it) reads manifests, token answers and error
//! bodies whole into memory and has no deadline for a body: a registry that streams
//! forever exhausts the memory of whoever asks, one that trickles holds its caller
//! forever. Here every request has a connect and an idle-read timeout and a deadline for
//! the whole exchange (for a blob, longer with its size), and every body has a byte limit
//! checked while it streams: manifests, token answers and small blobs at fixed caps, a
//! layer at the size its descriptor declares (more bytes than declared is an error at the
//! first byte over, fewer is an error at the end). Blob content is hashed as it streams and
//! checked against its digest.
//!
//! Authentication follows the distribution spec: a `401` with a `Bearer` challenge sends
//! the client to the token realm (which must be `https`, unless the registry itself is
//! spoken to over plain HTTP: credentials are never sent in clear to a realm the registry
//! chose), a `Basic` challenge gets the credentials. Errors say what failed and whether a
//! retry may help ([`RegistryError::transient`]: timeouts, connection failures, `429` and
//! `5xx`).

mod guard;

use guard::{error_codes, redirects};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use oci_client::Reference;
use oci_client::secrets::RegistryAuth;
use reqwest_oci as reqwest;
use sha2::{Digest as _, Sha256, Sha512};
use tokio::time::Instant;

/// The manifest media types a pull accepts.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json";
/// A manifest larger than this is refused (real ones are a few KiB).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// A token answer larger than this is refused.
pub const MAX_TOKEN_BYTES: u64 = 64 << 10;
/// Error bodies are read up to this many bytes, for the message.
const MAX_ERROR_BYTES: u64 = 4 << 10;

/// Time limits of registry requests (the node caches' shared ones).
pub use kubeairunway_cache_http::Timeouts;

/// A registry request that failed, and whether trying again later may help.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RegistryError {
    /// The failure may pass (timeout, connection, `429`, `5xx`).
    pub transient: bool,
    /// The registry answered `404`.
    pub not_found: bool,
    /// What failed.
    pub message: String,
}

/// How the message of content that is not what its digest says ends.
const DIGEST_MISMATCH: &str = "(digest mismatch)";

impl RegistryError {
    /// Whether content the registry sent did not match its digest.
    pub fn is_digest_mismatch(&self) -> bool {
        self.message.ends_with(DIGEST_MISMATCH)
    }

    fn permanent(message: impl Into<String>) -> Self {
        Self {
            transient: false,
            not_found: false,
            message: message.into(),
        }
    }

    fn transient(message: impl Into<String>) -> Self {
        Self {
            transient: true,
            not_found: false,
            message: message.into(),
        }
    }

    fn from_http(context: &str, e: &reqwest::Error) -> Self {
        let mut message = format!("{context}: {e}");
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            let _ = write!(message, ": {s}");
            source = s.source();
        }
        Self::transient(message)
    }
}

/// A manifest as the registry served it.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// The bytes (their digest checked when the reference names one).
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of the bytes.
    pub digest: String,
    /// The `Content-Type` the registry gave.
    pub media_type: Option<String>,
}

/// Pull-only registry client with bounded reads.
pub struct Client {
    http: reqwest::Client,
    auth: RegistryAuth,
    plain_http: Vec<String>,
    timeouts: Timeouts,
    /// `Authorization` values per registry and repository.
    tokens: Mutex<BTreeMap<String, String>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("registry::Client")
            .field("plain_http", &self.plain_http)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// One body read under a byte limit and a deadline.
struct Limit<'a> {
    what: &'a str,
    max: u64,
    deadline: Instant,
    timeout: Duration,
}

impl Client {
    /// A client with `auth`, speaking plain HTTP to the registries in `plain_http`.
    pub fn new(auth: RegistryAuth, plain_http: Vec<String>, timeouts: Timeouts) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .read_timeout(timeouts.idle)
            .redirect(redirects())
            .user_agent(concat!(
                "kubeairunway-kernelcache/",
                env!("CARGO_PKG_VERSION")
            ))
            .build()
            .unwrap_or_default();
        Self {
            http,
            auth,
            plain_http,
            timeouts,
            tokens: Mutex::default(),
        }
    }

    fn scheme(&self, registry: &str) -> &'static str {
        if self.plain_http.iter().any(|r| r == registry) {
            "http"
        } else {
            "https"
        }
    }

    fn base(&self, reference: &Reference) -> String {
        let registry = reference.resolve_registry();
        format!(
            "{}://{registry}/v2/{}",
            self.scheme(registry),
            reference.repository()
        )
    }

    fn token_key(reference: &Reference) -> String {
        format!(
            "{}/{}",
            reference.resolve_registry(),
            reference.repository()
        )
    }

    /// `method` on the manifest `reference` names (its digest, else its tag, else
    /// `latest`): the response, what it is (for messages) and the request's deadline.
    async fn manifest_request(
        &self,
        reference: &Reference,
        method: reqwest::Method,
    ) -> Result<(reqwest::Response, String, Instant), RegistryError> {
        let target = reference.digest().or(reference.tag()).unwrap_or("latest");
        let url = format!("{}/manifests/{target}", self.base(reference));
        let what = format!("manifest {reference}");
        let deadline = Instant::now() + self.timeouts.request;
        let response = self
            .send(
                reference,
                method,
                &url,
                Some(MANIFEST_ACCEPT),
                deadline,
                &what,
            )
            .await?;
        Ok((response, what, deadline))
    }

    /// The manifest `reference` names (tag or digest), at most [`MAX_MANIFEST_BYTES`];
    /// its digest must match when `reference` is pinned.
    pub async fn manifest(&self, reference: &Reference) -> Result<Manifest, RegistryError> {
        let (response, what, deadline) = self
            .manifest_request(reference, reqwest::Method::GET)
            .await?;
        let media_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string());
        let bytes = self
            .body(
                response,
                &Limit {
                    what: &what,
                    max: MAX_MANIFEST_BYTES,
                    deadline,
                    timeout: self.timeouts.request,
                },
            )
            .await?;
        let digest = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
        if let Some(pinned) = reference.digest() {
            check_digest(&what, pinned, &bytes)?;
        }
        Ok(Manifest {
            bytes,
            digest,
            media_type,
        })
    }

    /// The referrers of `digest` (an image index), through the referrers API; `None`
    /// when the registry does not serve it (then clients use the fallback tag
    /// `sha256-<hex>`).
    pub async fn referrers(
        &self,
        reference: &Reference,
        digest: &str,
    ) -> Result<Option<Manifest>, RegistryError> {
        let url = format!("{}/referrers/{digest}", self.base(reference));
        let what = format!("referrers of {digest}");
        let deadline = Instant::now() + self.timeouts.request;
        let response = match self
            .send(
                reference,
                reqwest::Method::GET,
                &url,
                Some("application/vnd.oci.image.index.v1+json"),
                deadline,
                &what,
            )
            .await
        {
            Ok(r) => r,
            Err(e) if e.not_found => return Ok(None),
            Err(e) => return Err(e),
        };
        let bytes = self
            .body(
                response,
                &Limit {
                    what: &what,
                    max: MAX_MANIFEST_BYTES,
                    deadline,
                    timeout: self.timeouts.request,
                },
            )
            .await?;
        Ok(Some(Manifest {
            digest: format!("sha256:{}", hex(&Sha256::digest(&bytes))),
            bytes,
            media_type: Some("application/vnd.oci.image.index.v1+json".into()),
        }))
    }

    /// The digest of the manifest a tag (or digest) names: the registry's
    /// `Docker-Content-Digest` of a `HEAD`, else the digest of the manifest itself.
    pub async fn resolve(&self, reference: &Reference) -> Result<String, RegistryError> {
        let (response, what, _) = self
            .manifest_request(reference, reqwest::Method::HEAD)
            .await?;
        let header = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .filter(|d| d.starts_with("sha256:"))
            .map(str::to_string);
        match (header, reference.digest()) {
            (Some(found), Some(pinned)) if found != pinned => Err(RegistryError::permanent(
                format!("{what}: the registry names it {found} (digest mismatch)"),
            )),
            (Some(found), _) => Ok(found),
            (None, _) => Ok(self.manifest(reference).await?.digest),
        }
    }

    /// A small blob (config, signature) whole: at most `max` bytes, and exactly `size` when
    /// the descriptor gives one; checked against `digest`.
    pub async fn blob_bytes(
        &self,
        reference: &Reference,
        digest: &str,
        size: Option<u64>,
        max: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        let what = format!("blob {digest}");
        if let Some(size) = size
            && size > max
        {
            return Err(RegistryError::permanent(format!(
                "{what} declares {size} bytes, more than the {max} accepted"
            )));
        }
        let deadline = Instant::now() + self.timeouts.request;
        let url = format!("{}/blobs/{digest}", self.base(reference));
        let response = self
            .send(reference, reqwest::Method::GET, &url, None, deadline, &what)
            .await?;
        let bytes = self
            .body(
                response,
                &Limit {
                    what: &what,
                    max: size.unwrap_or(max),
                    deadline,
                    timeout: self.timeouts.request,
                },
            )
            .await?;
        if let Some(size) = size
            && bytes.len() as u64 != size
        {
            return Err(RegistryError::permanent(format!(
                "{what}: the registry sent {} bytes, its descriptor declares {size}",
                bytes.len()
            )));
        }
        check_digest(&what, digest, &bytes)?;
        Ok(bytes)
    }

    /// Stream the blob `digest` of exactly `size` bytes to `out` (the other end of a
    /// [`BlobReader`]) as it arrives, hashing it as it goes; returns the bytes received.
    /// [`Piece::Verified`] is sent only after the last byte, once the size and the digest
    /// matched: a reader that sees the end of the blob knows it is the blob. More bytes
    /// than `size`, fewer, another digest or a transfer slower than the timeouts allow are
    /// errors (and no end is sent). The deadline is the registry's: time spent waiting
    /// for the reader to take a chunk moves it. A reader that goes away early does not
    /// stop the transfer: the blob is still read to its end and checked, so a blob that is
    /// not what its digest says is reported as such, whatever its reader made of it.
    pub async fn blob_stream(
        &self,
        reference: &Reference,
        digest: &str,
        size: u64,
        out: tokio::sync::mpsc::Sender<Piece>,
    ) -> Result<u64, RegistryError> {
        let what = format!("layer {digest}");
        let timeout = self.timeouts.for_bytes(size);
        let mut deadline = Instant::now() + timeout;
        let url = format!("{}/blobs/{digest}", self.base(reference));
        let mut response = self
            .send(reference, reqwest::Method::GET, &url, None, deadline, &what)
            .await?;
        declared_length(&response, &what, size)?;
        let mut hasher = Hasher::new(digest)?;
        let mut received = 0u64;
        let mut reader = Some(out);
        loop {
            let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
                Err(_) => return Err(timed_out(&what, timeout, received)),
                Ok(Err(e)) => return Err(RegistryError::from_http(&format!("reading {what}"), &e)),
                Ok(Ok(None)) => break,
                Ok(Ok(Some(chunk))) => chunk,
            };
            received += chunk.len() as u64;
            if received > size {
                return Err(RegistryError::permanent(format!(
                    "{what}: the registry sent more than the {size} bytes its descriptor declares"
                )));
            }
            hasher.update(&chunk);
            if let Some(tx) = &reader {
                let waiting = Instant::now();
                if tx.send(Piece::Bytes(chunk)).await.is_err() {
                    reader = None;
                }
                deadline += waiting.elapsed();
            }
        }
        if received != size {
            return Err(RegistryError::transient(format!(
                "{what}: the registry sent {received} of the {size} bytes its descriptor declares"
            )));
        }
        hasher.check(&what, digest)?;
        if let Some(tx) = reader {
            let _ = tx.send(Piece::Verified).await;
        }
        Ok(received)
    }

    /// Send a request, authenticating on a `401` challenge once; a non-success answer is
    /// an error carrying (the start of) the registry's message.
    async fn send(
        &self,
        reference: &Reference,
        method: reqwest::Method,
        url: &str,
        accept: Option<&str>,
        deadline: Instant,
        what: &str,
    ) -> Result<reqwest::Response, RegistryError> {
        let mut challenged = false;
        loop {
            let mut request = self.http.request(method.clone(), url);
            if let Some(accept) = accept {
                request = request.header(reqwest::header::ACCEPT, accept);
            }
            let cached = self
                .tokens
                .lock()
                .ok()
                .and_then(|t| t.get(&Self::token_key(reference)).cloned());
            if let Some(authorization) = cached {
                request = request.header(reqwest::header::AUTHORIZATION, authorization);
            }
            let response = match tokio::time::timeout_at(deadline, request.send()).await {
                Err(_) => return Err(timed_out(what, self.timeouts.request, 0)),
                Ok(Err(e)) => {
                    return Err(RegistryError::from_http(&format!("fetching {what}"), &e));
                }
                Ok(Ok(r)) => r,
            };
            let status = response.status();
            if status == reqwest::StatusCode::UNAUTHORIZED && !challenged {
                challenged = true;
                let challenge = response
                    .headers()
                    .get(reqwest::header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
                    .unwrap_or_default();
                let authorization = self
                    .authorize(reference, &challenge, deadline, what)
                    .await?;
                if let Ok(mut tokens) = self.tokens.lock() {
                    tokens.insert(Self::token_key(reference), authorization);
                }
                continue;
            }
            if status.is_success() {
                return Ok(response);
            }
            let body = self
                .body(
                    response,
                    &Limit {
                        what,
                        max: MAX_ERROR_BYTES,
                        deadline,
                        timeout: self.timeouts.request,
                    },
                )
                .await
                .unwrap_or_default();
            let message = format!("fetching {what}: {status}{}", error_codes(&body));
            return Err(RegistryError {
                transient: status.is_server_error()
                    || status == reqwest::StatusCode::TOO_MANY_REQUESTS
                    || status == reqwest::StatusCode::REQUEST_TIMEOUT,
                not_found: status == reqwest::StatusCode::NOT_FOUND,
                message,
            });
        }
    }

    /// The `Authorization` value answering a challenge: the configured credentials for
    /// `Basic`, a pull token from the realm ([`token_realm`], [`Client::token`]) for
    /// `Bearer`.
    async fn authorize(
        &self,
        reference: &Reference,
        challenge: &str,
        deadline: Instant,
        what: &str,
    ) -> Result<String, RegistryError> {
        let basic = match &self.auth {
            RegistryAuth::Basic(user, password) => Some(format!(
                "Basic {}",
                STANDARD.encode(format!("{user}:{password}"))
            )),
            RegistryAuth::Bearer(token) => return Ok(format!("Bearer {token}")),
            RegistryAuth::Anonymous => None,
        };
        let (scheme, params) = parse_challenge(challenge);
        if scheme.eq_ignore_ascii_case("basic") {
            return basic.ok_or_else(|| {
                RegistryError::permanent(format!(
                    "fetching {what}: the registry wants credentials and none are configured (imagePullSecrets)"
                ))
            });
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(RegistryError::permanent(format!(
                "fetching {what}: unsupported authentication challenge {challenge:?}"
            )));
        }
        let registry_plain = self.scheme(reference.resolve_registry()) == "http";
        let (realm, realm_url) = token_realm(&params, registry_plain, what)?;
        self.token(
            reference,
            (realm, realm_url),
            params.get("service"),
            basic.as_deref(),
            deadline,
        )
        .await
    }

    /// A pull token for `reference` from the token service at `realm` (a part of
    /// [`Client::authorize`]), its answer bounded in size and time.
    async fn token(
        &self,
        reference: &Reference,
        (realm, realm_url): (&str, reqwest::Url),
        service: Option<&String>,
        basic: Option<&str>,
        deadline: Instant,
    ) -> Result<String, RegistryError> {
        let mut request = self.http.get(realm_url).query(&[(
            "scope",
            format!("repository:{}:pull", reference.repository()),
        )]);
        if let Some(service) = service {
            request = request.query(&[("service", service)]);
        }
        if let Some(basic) = basic {
            request = request.header(reqwest::header::AUTHORIZATION, basic);
        }
        let token_what = format!("a token from {realm}");
        let response = match tokio::time::timeout_at(deadline, request.send()).await {
            Err(_) => return Err(timed_out(&token_what, self.timeouts.request, 0)),
            Ok(Err(e)) => {
                return Err(RegistryError::from_http(
                    &format!("fetching {token_what}"),
                    &e,
                ));
            }
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        let body = self
            .body(
                response,
                &Limit {
                    what: &token_what,
                    max: MAX_TOKEN_BYTES,
                    deadline,
                    timeout: self.timeouts.request,
                },
            )
            .await?;
        token_answer(status, &body, &token_what)
    }

    /// A whole body under `limit`.
    async fn body(
        &self,
        mut response: reqwest::Response,
        limit: &Limit<'_>,
    ) -> Result<Vec<u8>, RegistryError> {
        if let Some(length) = response.content_length()
            && length > limit.max
        {
            return Err(RegistryError::permanent(format!(
                "{}: the registry declares {length} bytes, more than the {} accepted",
                limit.what, limit.max
            )));
        }
        let mut out = Vec::new();
        loop {
            let chunk = match tokio::time::timeout_at(limit.deadline, response.chunk()).await {
                Err(_) => return Err(timed_out(limit.what, limit.timeout, out.len() as u64)),
                Ok(Err(e)) => {
                    return Err(RegistryError::from_http(
                        &format!("reading {}", limit.what),
                        &e,
                    ));
                }
                Ok(Ok(None)) => return Ok(out),
                Ok(Ok(Some(chunk))) => chunk,
            };
            if (out.len() + chunk.len()) as u64 > limit.max {
                return Err(RegistryError::permanent(format!(
                    "{}: the registry sent more than the {} bytes accepted",
                    limit.what, limit.max
                )));
            }
            out.extend_from_slice(&chunk);
        }
    }
}

/// What [`Client::blob_stream`] sends its reader.
#[derive(Debug)]
pub enum Piece {
    /// The next bytes of the blob, not yet verified.
    Bytes(Bytes),
    /// The end: the whole blob arrived, of its declared size and digest.
    Verified,
}

/// The blob [`Client::blob_stream`] streams, as a blocking reader (for extraction on a
/// blocking thread while the download goes on): it ends only at [`Piece::Verified`]; if
/// the stream stops before (the download failed, its error is the sender's), reading is
/// an error. Chunks are handed on as they arrived, without copying ([`BufRead`]).
///
/// [`BufRead`]: std::io::BufRead
#[derive(Debug)]
pub struct BlobReader {
    pieces: tokio::sync::mpsc::Receiver<Piece>,
    chunk: Bytes,
    verified: bool,
}

impl BlobReader {
    /// A reader of what is sent into `pieces`. It must be read outside the async runtime
    /// (it blocks the thread until the next piece arrives).
    pub fn new(pieces: tokio::sync::mpsc::Receiver<Piece>) -> Self {
        Self {
            pieces,
            chunk: Bytes::new(),
            verified: false,
        }
    }
}

impl std::io::BufRead for BlobReader {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        while self.chunk.is_empty() && !self.verified {
            match self.pieces.blocking_recv() {
                Some(Piece::Bytes(chunk)) => self.chunk = chunk,
                Some(Piece::Verified) => self.verified = true,
                None => {
                    return Err(std::io::Error::other(
                        "the download stopped before the end of the layer",
                    ));
                }
            }
        }
        Ok(&self.chunk)
    }

    fn consume(&mut self, amount: usize) {
        let amount = amount.min(self.chunk.len());
        bytes::Buf::advance(&mut self.chunk, amount);
    }
}

impl std::io::Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::BufRead as _;
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

fn timed_out(what: &str, after: Duration, received: u64) -> RegistryError {
    RegistryError::transient(format!(
        "{what}: timed out after {} ({received} bytes received)",
        humantime_secs(after)
    ))
}

fn humantime_secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

fn declared_length(
    response: &reqwest::Response,
    what: &str,
    size: u64,
) -> Result<(), RegistryError> {
    match response.content_length() {
        Some(length) if length != size => Err(RegistryError::permanent(format!(
            "{what}: the registry declares {length} bytes (Content-Length), its descriptor {size}"
        ))),
        _ => Ok(()),
    }
}

/// The token realm of a `Bearer` challenge's `params`, as given and parsed: refused
/// unless https, or http from a registry that is itself plain HTTP (`registry_plain`).
fn token_realm<'a>(
    params: &'a BTreeMap<String, String>,
    registry_plain: bool,
    what: &str,
) -> Result<(&'a str, reqwest::Url), RegistryError> {
    let realm = params.get("realm").ok_or_else(|| {
        RegistryError::permanent(format!("fetching {what}: a Bearer challenge without realm"))
    })?;
    let realm_url = reqwest::Url::parse(realm).map_err(|e| {
        RegistryError::permanent(format!("fetching {what}: token realm {realm:?}: {e}"))
    })?;
    if realm_url.scheme() != "https" && !(registry_plain && realm_url.scheme() == "http") {
        return Err(RegistryError::permanent(format!(
            "fetching {what}: refusing token realm {realm}: not https"
        )));
    }
    Ok((realm, realm_url))
}

/// The token in a token service's answer (`token`, else `access_token`); a failed answer
/// is transient when the service failed (`5xx`).
fn token_answer(
    status: reqwest::StatusCode,
    body: &[u8],
    token_what: &str,
) -> Result<String, RegistryError> {
    if !status.is_success() {
        return Err(RegistryError {
            transient: status.is_server_error(),
            not_found: false,
            message: format!("fetching {token_what}: {status}{}", error_codes(body)),
        });
    }
    let answer: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| RegistryError::permanent(format!("fetching {token_what}: not JSON: {e}")))?;
    let token = answer
        .get("token")
        .or_else(|| answer.get("access_token"))
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| {
            RegistryError::permanent(format!("fetching {token_what}: no token in the answer"))
        })?;
    Ok(format!("Bearer {token}"))
}

/// `Bearer realm="...",service="..."` into the scheme and its parameters.
fn parse_challenge(header: &str) -> (String, BTreeMap<String, String>) {
    let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    let mut params = BTreeMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        params.insert(key, value.to_string());
        rest = remaining.trim_start().trim_start_matches(',').trim_start();
    }
    (scheme.to_string(), params)
}

enum Hasher {
    Sha256(Sha256),
    Sha512(Sha512),
}

impl Hasher {
    fn new(digest: &str) -> Result<Self, RegistryError> {
        match digest.split_once(':') {
            Some(("sha256", _)) => Ok(Self::Sha256(Sha256::new())),
            Some(("sha512", _)) => Ok(Self::Sha512(Sha512::new())),
            _ => Err(RegistryError::permanent(format!(
                "unsupported digest {digest:?}"
            ))),
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Self::Sha256(h) => h.update(bytes),
            Self::Sha512(h) => h.update(bytes),
        }
    }

    fn check(self, what: &str, digest: &str) -> Result<(), RegistryError> {
        let (algorithm, actual) = match self {
            Self::Sha256(h) => ("sha256", hex(&h.finalize())),
            Self::Sha512(h) => ("sha512", hex(&h.finalize())),
        };
        let actual = format!("{algorithm}:{actual}");
        if actual == digest {
            Ok(())
        } else {
            Err(RegistryError::permanent(format!(
                "{what}: content digest is {actual}, expected {digest} {DIGEST_MISMATCH}"
            )))
        }
    }
}

fn check_digest(what: &str, digest: &str, bytes: &[u8]) -> Result<(), RegistryError> {
    let mut hasher = Hasher::new(digest)?;
    hasher.update(bytes);
    hasher.check(what, digest)
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        let (scheme, p) = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull""#,
        );
        assert_eq!(scheme, "Bearer");
        assert_eq!(p["realm"], "https://auth.docker.io/token");
        assert_eq!(p["service"], "registry.docker.io");
        assert_eq!(p["scope"], "repository:a/b:pull");
        let (scheme, p) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!(
            (scheme.as_str(), p["realm"].as_str()),
            ("Basic", "Registry Realm")
        );
        assert_eq!(parse_challenge("").0, "");
    }

    #[test]
    fn token_realms_are_https_unless_the_registry_is_plain_http() {
        let params = |realm: &str| BTreeMap::from([("realm".to_string(), realm.to_string())]);
        let https = params("https://auth.example/token");
        assert_eq!(
            token_realm(&https, false, "x").unwrap().0,
            "https://auth.example/token"
        );
        let http = params("http://auth.example/token");
        assert!(token_realm(&http, true, "x").is_ok());
        let refused = token_realm(&http, false, "x").unwrap_err();
        assert!(
            refused.message.ends_with("not https"),
            "{}",
            refused.message
        );
        assert!(!refused.transient);
        assert!(token_realm(&params("not a url"), true, "x").is_err());
        assert!(token_realm(&BTreeMap::new(), true, "x").is_err());
    }

    #[test]
    fn token_answers_give_the_token_or_say_why_not() {
        let ok = reqwest::StatusCode::OK;
        assert_eq!(
            token_answer(ok, br#"{"token":"t"}"#, "a token").unwrap(),
            "Bearer t"
        );
        assert_eq!(
            token_answer(ok, br#"{"access_token":"a"}"#, "a token").unwrap(),
            "Bearer a"
        );
        assert!(token_answer(ok, b"{}", "a token").is_err());
        assert!(token_answer(ok, b"<html>", "a token").is_err());
        let down = token_answer(reqwest::StatusCode::BAD_GATEWAY, b"down", "a token").unwrap_err();
        assert!(down.transient);
        // The body (anyone's text) never reaches the message, which lands in a status.
        assert_eq!(down.message, "fetching a token: 502 Bad Gateway");
        let denied = token_answer(reqwest::StatusCode::UNAUTHORIZED, b"", "a token").unwrap_err();
        assert!(!denied.transient);
    }

    #[test]
    fn deadlines_grow_with_size() {
        let t = Timeouts {
            request: Duration::from_secs(2),
            min_rate: 1000,
            ..Timeouts::default()
        };
        assert_eq!(t.for_bytes(0), Duration::from_secs(2));
        assert_eq!(t.for_bytes(5000), Duration::from_secs(7));
    }
}

#[cfg(test)]
#[path = "registry_hostile_tests.rs"]
mod hostile;
