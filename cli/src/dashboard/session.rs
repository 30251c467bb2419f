//! Who the dashboard acts as when it runs in the cluster (`--in-cluster`): each user, with
//! their own Kubernetes bearer token. The dashboard holds no credentials of its own (its
//! pod mounts no service-account token), so everything it does is the user's request,
//! allowed or refused by the API server as that user.
//!
//! - A user signs in on the page with a token the API server accepts (`kubectl create
//!   token`, an OIDC id token). It is checked with one SelfSubjectAccessReview (any
//!   authenticated user may make one; 401 means the token is not accepted) and kept in
//!   this process only, inside the session's client. The browser holds an unguessable
//!   session id in a cookie (`HttpOnly`, `SameSite=Strict`, `Secure`).
//! - An authenticating proxy in front (oauth2-proxy, say) may pass the token in
//!   `Authorization: Bearer` on every request instead: its session is named by the
//!   token's SHA-256.
//! - Each session has its own client and watch ([`View`]); it ends after `idle` without
//!   use or `lifetime` after sign-in, and at most `max` live at once (the least recently
//!   used ends first).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use sha2::Digest;

use super::view::View;

/// The cookie that names a session.
pub const COOKIE: &str = "kubeairunway-session";

/// How long sessions live and how many there may be.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A session unused this long ends.
    pub idle: Duration,
    /// A session ends this long after sign-in, used or not.
    pub lifetime: Duration,
    /// Sessions alive at once; one more ends the least recently used.
    pub max: usize,
    /// Mark the cookie `Secure` (sent over HTTPS only; browsers also send it to
    /// `http://localhost`, as through `kubectl port-forward`).
    pub secure_cookie: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(3600),
            lifetime: Duration::from_secs(12 * 3600),
            max: 256,
            secure_cookie: true,
        }
    }
}

/// Why a token was not taken.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    /// No token.
    #[error("no token: paste a Kubernetes bearer token (kubectl create token NAME)")]
    Empty,
    /// The API server answered 401.
    #[error("the API server does not accept this token")]
    Refused,
    /// The API server could not be asked.
    #[error("the API server could not check the token: {0}")]
    Unreachable(String),
    /// The operating system gave no random bytes for a session id.
    #[error("no session id could be made: {0}")]
    NoRandom(String),
}

/// A signed-in user: their view of the cluster and, when the API server says, their name.
#[derive(Clone)]
pub struct User {
    /// The user's client and watch.
    pub view: Arc<View>,
    /// The user name (`SelfSubjectReview`; `None` where the API server does not serve it).
    pub name: Option<String>,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

struct Entry {
    user: User,
    created: Instant,
    used: Instant,
}

/// The live sessions of the in-cluster dashboard.
pub struct Sessions {
    /// The API server's address and CA, without credentials.
    base: kube::Config,
    settings: Settings,
    entries: Mutex<HashMap<String, Entry>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("server", &self.base.cluster_url)
            .field("settings", &self.settings)
            .field("alive", &self.len())
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// Sessions against the API server `base` names (its credentials, if any, unused).
    pub fn new(mut base: kube::Config, settings: Settings) -> Self {
        base.auth_info = kube::config::AuthInfo::default();
        Self {
            base,
            settings,
            entries: Mutex::default(),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Check `token` with the API server and open a session for it: its id and user.
    pub async fn sign_in(&self, token: &str) -> Result<(String, User), SignInError> {
        let user = self.check(token).await?;
        let id = new_id()?;
        self.insert(id.clone(), user.clone(), Instant::now());
        Ok((id, user))
    }

    /// The user of session `id`, which counts as a use; `None` when there is no such
    /// session or it has ended.
    pub fn get(&self, id: &str) -> Option<User> {
        let now = Instant::now();
        let mut entries = self.entries.lock().ok()?;
        let entry = entries.get_mut(id)?;
        if expired(entry.created, entry.used, now, &self.settings) {
            entries.remove(id);
            return None;
        }
        entry.used = now;
        Some(entry.user.clone())
    }

    /// The user of a bearer token an authenticating proxy passed: its session, opened
    /// (and the token checked) on first sight.
    pub async fn bearer(&self, token: &str) -> Result<User, SignInError> {
        let id = bearer_id(token);
        if let Some(user) = self.get(&id) {
            return Ok(user);
        }
        let user = self.check(token).await?;
        self.insert(id, user.clone(), Instant::now());
        Ok(user)
    }

    /// End session `id`.
    pub fn sign_out(&self, id: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(id);
        }
    }

    /// Sessions alive now.
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or_default()
    }

    /// Whether no session is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// End the sessions that have expired (their watches stop with them), and stop the
    /// watches of live ones that nobody has used in `feed_idle`.
    pub fn sweep(&self, feed_idle: Duration) {
        let now = Instant::now();
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|_, e| !expired(e.created, e.used, now, &self.settings));
            for entry in entries.values() {
                entry.user.view.release_idle(feed_idle);
            }
        }
    }

    fn insert(&self, id: String, user: User, now: Instant) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        entries.retain(|_, e| !expired(e.created, e.used, now, &self.settings));
        while entries.len() >= self.settings.max.max(1) {
            let Some(oldest) = least_recently_used(entries.iter().map(|(k, e)| (k, e.used))) else {
                break;
            };
            let oldest = oldest.clone();
            entries.remove(&oldest);
        }
        entries.insert(
            id,
            Entry {
                user,
                created: now,
                used: now,
            },
        );
    }

    /// A client bearing `token`, checked: 401 refuses it; its name, where served.
    async fn check(&self, token: &str) -> Result<User, SignInError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(SignInError::Empty);
        }
        let mut config = self.base.clone();
        config.auth_info.token = Some(token.to_string().into());
        let client =
            Client::try_from(config).map_err(|e| SignInError::Unreachable(e.to_string()))?;
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some("kubeairunway.ai".into()),
                    resource: Some("modeldeployments".into()),
                    verb: Some("list".into()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        match Api::<SelfSubjectAccessReview>::all(client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 401 => return Err(SignInError::Refused),
            Err(e) => return Err(SignInError::Unreachable(e.to_string())),
        }
        let name = Api::<SelfSubjectReview>::all(client.clone())
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .ok()
            .and_then(|r| r.status?.user_info?.username);
        Ok(User {
            view: Arc::new(View::new(client)),
            name,
        })
    }
}

/// Whether a session made at `created` and last used at `used` has ended by `now`.
pub fn expired(created: Instant, used: Instant, now: Instant, settings: &Settings) -> bool {
    now.saturating_duration_since(used) >= settings.idle
        || now.saturating_duration_since(created) >= settings.lifetime
}

/// The key used least recently (ties: the smallest key, so the choice is stable).
fn least_recently_used<'a>(
    entries: impl Iterator<Item = (&'a String, Instant)>,
) -> Option<&'a String> {
    entries
        .min_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(b.0)))
        .map(|(k, _)| k)
}

/// A new session id: 32 bytes from the operating system's generator, as hex.
fn new_id() -> Result<String, SignInError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| SignInError::NoRandom(e.to_string()))?;
    Ok(hex(&bytes))
}

/// The session key of a bearer token passed by a proxy: never the token itself.
fn bearer_id(token: &str) -> String {
    format!(
        "bearer-{}",
        hex(&sha2::Sha256::digest(token.trim().as_bytes()))
    )
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// The `Set-Cookie` value that hands session `id` to the browser.
pub fn cookie(id: &str, settings: &Settings) -> String {
    let secure = if settings.secure_cookie {
        "; Secure"
    } else {
        ""
    };
    format!(
        "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        settings.lifetime.as_secs()
    )
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn cleared_cookie(settings: &Settings) -> String {
    cookie(
        "",
        &Settings {
            lifetime: Duration::ZERO,
            ..settings.clone()
        },
    )
}

/// The session id the request's cookies carry.
pub fn session_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == COOKIE && !value.is_empty())
        .map(|(_, value)| value)
}

/// The bearer token of the request's `Authorization` header.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            idle: Duration::from_secs(60),
            lifetime: Duration::from_secs(600),
            max: 2,
            secure_cookie: true,
        }
    }

    #[test]
    fn sessions_end_when_idle_or_old() {
        let s = settings();
        let t0 = Instant::now();
        assert!(!expired(t0, t0, t0 + Duration::from_secs(59), &s));
        assert!(expired(t0, t0, t0 + Duration::from_secs(60), &s), "idle");
        let used = t0 + Duration::from_secs(590);
        assert!(!expired(t0, used, t0 + Duration::from_secs(599), &s));
        assert!(expired(t0, used, t0 + Duration::from_secs(600), &s), "old");
    }

    #[test]
    fn the_least_recently_used_session_goes_first() {
        let t0 = Instant::now();
        let (a, b, c) = ("a".to_string(), "b".to_string(), "c".to_string());
        let entries = [
            (&b, t0 + Duration::from_secs(5)),
            (&a, t0 + Duration::from_secs(9)),
            (&c, t0 + Duration::from_secs(5)),
        ];
        assert_eq!(least_recently_used(entries.into_iter()), Some(&b));
        assert_eq!(least_recently_used(std::iter::empty()), None);
    }

    #[test]
    fn the_cookie_is_kept_from_scripts_and_other_sites() {
        let c = cookie("abc", &settings());
        assert_eq!(
            c,
            "kubeairunway-session=abc; Path=/; HttpOnly; SameSite=Strict; Max-Age=600; Secure"
        );
        let plain = cookie(
            "abc",
            &Settings {
                secure_cookie: false,
                ..settings()
            },
        );
        assert!(!plain.contains("Secure"), "{plain}");
        assert!(cleared_cookie(&settings()).starts_with("kubeairunway-session=; "));
        assert!(cleared_cookie(&settings()).contains("Max-Age=0"));
    }

    #[test]
    fn session_ids_and_bearer_tokens_are_read_from_the_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(session_id(&h), None);
        h.insert(
            header::COOKIE,
            "a=1; kubeairunway-session=xyz; b=2".parse().unwrap(),
        );
        assert_eq!(session_id(&h), Some("xyz"));
        h.insert(header::COOKIE, "kubeairunway-session=".parse().unwrap());
        assert_eq!(session_id(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer  tok ".parse().unwrap());
        assert_eq!(bearer_token(&h), Some("tok"));
        h.insert(header::AUTHORIZATION, "Basic dTpw".parse().unwrap());
        assert_eq!(bearer_token(&h), None);
    }

    #[test]
    fn ids_are_random_and_bearer_keys_never_hold_the_token() {
        let (a, b) = (new_id().unwrap(), new_id().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        let key = bearer_id("secret-token");
        assert!(!key.contains("secret"), "{key}");
        assert_eq!(key, bearer_id(" secret-token "));
        assert_ne!(key, bearer_id("other"));
    }
}
