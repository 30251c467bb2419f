//! Registry credentials from image pull Secrets (`kubernetes.io/dockerconfigjson`, and the
//! older `kubernetes.io/dockercfg`), as the kubelet reads them: the first Secret with an
//! entry for the image's registry wins; no entry means anonymous access.
//!
//! The node agents never read a user's Secrets. The controller, allowed to read the pull
//! Secrets of the namespaces the chart names, hands each cache's credentials over in one
//! Secret of its own in a namespace of its own ([`handover_name`], [`handover_config`]);
//! the agents may read Secrets in that namespace only.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::ByteString;
use oci_client::secrets::RegistryAuth;
use serde_json::Value;

/// Why a pull Secret could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialsError {
    /// The Secret holds neither `.dockerconfigjson` nor `.dockercfg`.
    #[error("pull secret {0} has no .dockerconfigjson or .dockercfg key")]
    NoDockerConfig(String),
    /// The docker config is not the JSON it should be.
    #[error("pull secret {secret}: {reason}")]
    Malformed {
        /// The Secret's name.
        secret: String,
        /// What is wrong.
        reason: String,
    },
}

/// The name of the Secret holding the registry credentials of the KernelCache
/// `namespace/name`, in the handover namespace: `kernelcache-pull-` and 40 hex digits of
/// the SHA-256 of `namespace/name` (any KernelCache name fits).
pub fn handover_name(namespace: &str, name: &str) -> String {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(format!("{namespace}/{name}").as_bytes());
    format!("kernelcache-pull-{}", &crate::registry::hex(&hash)[..40])
}

/// The `.dockerconfigjson` handing `auth` over for `registry`; `None` for anonymous
/// access (nothing to hand over).
pub fn handover_config(registry: &str, auth: &RegistryAuth) -> Option<Vec<u8>> {
    let entry = match auth {
        RegistryAuth::Anonymous => return None,
        RegistryAuth::Basic(user, password) => {
            serde_json::json!({"auth": STANDARD.encode(format!("{user}:{password}"))})
        }
        RegistryAuth::Bearer(token) => serde_json::json!({"registrytoken": token}),
    };
    serde_json::to_vec(&serde_json::json!({"auths": {registry: entry}})).ok()
}

/// The registry host of an image reference (`host[:port]`, Docker Hub for bare names).
pub fn registry_of(image: &str) -> String {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first.to_string(),
        _ => "docker.io".to_string(),
    }
}

/// The credentials for `registry` from the data of the given pull Secrets, in order.
pub fn registry_auth(
    registry: &str,
    secrets: &[(String, BTreeMap<String, ByteString>)],
) -> Result<RegistryAuth, CredentialsError> {
    for (name, data) in secrets {
        let auths = if let Some(json) = data.get(".dockerconfigjson") {
            let value: Value = parse(name, &json.0)?;
            value.get("auths").cloned().unwrap_or(Value::Null)
        } else if let Some(cfg) = data.get(".dockercfg") {
            parse(name, &cfg.0)?
        } else {
            return Err(CredentialsError::NoDockerConfig(name.clone()));
        };
        let Some(auths) = auths.as_object() else {
            continue;
        };
        for (key, entry) in auths {
            if normalize(key) == normalize(registry) {
                return credentials(name, entry);
            }
        }
    }
    Ok(RegistryAuth::Anonymous)
}

fn parse(secret: &str, bytes: &[u8]) -> Result<Value, CredentialsError> {
    serde_json::from_slice(bytes).map_err(|e| CredentialsError::Malformed {
        secret: secret.to_string(),
        reason: format!("not JSON: {e}"),
    })
}

/// `https://index.docker.io/v1/` and `docker.io` are the same registry; schemes and
/// paths do not matter.
fn normalize(registry: &str) -> String {
    let host = registry
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        _ => host,
    }
}

fn credentials(secret: &str, entry: &Value) -> Result<RegistryAuth, CredentialsError> {
    let malformed = |reason: &str| CredentialsError::Malformed {
        secret: secret.to_string(),
        reason: reason.to_string(),
    };
    if let Some(token) = entry.get("registrytoken").and_then(Value::as_str) {
        return Ok(RegistryAuth::Bearer(token.to_string()));
    }
    if let (Some(user), Some(password)) = (
        entry.get("username").and_then(Value::as_str),
        entry.get("password").and_then(Value::as_str),
    ) {
        return Ok(RegistryAuth::Basic(user.to_string(), password.to_string()));
    }
    let auth = entry
        .get("auth")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("an entry has neither username/password nor auth"))?;
    let decoded = STANDARD
        .decode(auth.trim())
        .map_err(|_| malformed("auth is not base64"))?;
    let decoded = String::from_utf8(decoded).map_err(|_| malformed("auth is not UTF-8"))?;
    let (user, password) = decoded
        .split_once(':')
        .ok_or_else(|| malformed("auth is not user:password"))?;
    Ok(RegistryAuth::Basic(user.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, key: &str, json: &str) -> (String, BTreeMap<String, ByteString>) {
        (
            name.to_string(),
            BTreeMap::from([(key.to_string(), ByteString(json.as_bytes().to_vec()))]),
        )
    }

    fn basic(auth: &RegistryAuth) -> Option<(&str, &str)> {
        match auth {
            RegistryAuth::Basic(u, p) => Some((u, p)),
            _ => None,
        }
    }

    #[test]
    fn registry_hosts() {
        assert_eq!(registry_of("quay.io/gkm/cache:rocm"), "quay.io");
        assert_eq!(registry_of("127.0.0.1:5000/c@sha256:ab"), "127.0.0.1:5000");
        assert_eq!(registry_of("localhost/c:1"), "localhost");
        assert_eq!(registry_of("library/ubuntu:24.04"), "docker.io");
        assert_eq!(registry_of("ubuntu"), "docker.io");
    }

    #[test]
    fn dockerconfigjson_with_auth_or_username_and_password() {
        let encoded = STANDARD.encode("robot:s3cret");
        let secrets = [
            secret(
                "other",
                ".dockerconfigjson",
                r#"{"auths":{"ghcr.io":{"username":"a","password":"b"}}}"#,
            ),
            secret(
                "quay",
                ".dockerconfigjson",
                &format!(r#"{{"auths":{{"https://quay.io/v1/":{{"auth":"{encoded}"}}}}}}"#),
            ),
        ];
        let auth = registry_auth("quay.io", &secrets).unwrap();
        assert_eq!(basic(&auth), Some(("robot", "s3cret")));
        let auth = registry_auth("ghcr.io", &secrets).unwrap();
        assert_eq!(basic(&auth), Some(("a", "b")));
        let auth = registry_auth("registry.example", &secrets).unwrap();
        assert!(matches!(auth, RegistryAuth::Anonymous));
    }

    #[test]
    fn docker_hub_aliases_and_legacy_dockercfg() {
        let encoded = STANDARD.encode("hub:pw");
        let secrets = [secret(
            "legacy",
            ".dockercfg",
            &format!(r#"{{"https://index.docker.io/v1/":{{"auth":"{encoded}"}}}}"#),
        )];
        let auth = registry_auth("docker.io", &secrets).unwrap();
        assert_eq!(basic(&auth), Some(("hub", "pw")));
    }

    #[test]
    fn handed_over_credentials_read_back_the_same() {
        for auth in [
            RegistryAuth::Basic("robot".into(), "s3:cret".into()),
            RegistryAuth::Bearer("tok".into()),
        ] {
            let config = handover_config("reg.example:5000", &auth).unwrap();
            let secrets = [(
                "h".to_string(),
                BTreeMap::from([(".dockerconfigjson".to_string(), ByteString(config))]),
            )];
            assert_eq!(registry_auth("reg.example:5000", &secrets).unwrap(), auth);
        }
        assert!(handover_config("r", &RegistryAuth::Anonymous).is_none());
        let name = handover_name("ml", "llama");
        assert_eq!(name.len(), "kernelcache-pull-".len() + 40);
        assert_ne!(name, handover_name("ml", "llama2"));
    }

    #[test]
    fn malformed_secrets_are_named() {
        let err = registry_auth("quay.io", &[secret("bad", ".dockerconfigjson", "{")]);
        assert!(
            matches!(err, Err(CredentialsError::Malformed { ref secret, .. }) if secret == "bad")
        );
        let err = registry_auth(
            "quay.io",
            &[secret(
                "noauth",
                ".dockerconfigjson",
                r#"{"auths":{"quay.io":{"email":"x"}}}"#,
            )],
        );
        assert!(err.unwrap_err().to_string().contains("noauth"));
        let err = registry_auth("quay.io", &[secret("opaque", "token", "x")]);
        assert_eq!(
            err.unwrap_err(),
            CredentialsError::NoDockerConfig("opaque".into())
        );
    }
}
