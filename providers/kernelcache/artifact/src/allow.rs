//! The registries a cluster operator allows cache images from (`--allowed-registry`),
//! checked before any request for an image is made:
//! without a list, a KernelCache's `spec.image` could make the controller and every node
//! agent speak to any host and port. An entry is a registry host, with its port when it
//! has one, optionally followed by a repository prefix (`ghcr.io/acme` allows
//! `ghcr.io/acme/...` only, at a path-segment boundary). An empty list allows any
//! registry. Docker Hub's names (`docker.io`, `index.docker.io`,
//! `registry-1.docker.io`) are one registry.

use oci_client::Reference;

/// One allowed registry, or a repository prefix in one (parsed from the operator's
/// entry: `ghcr.io`, `mirror.internal:5000`, `ghcr.io/acme`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedRegistry {
    registry: String,
    prefix: Option<String>,
}

/// The registries images may come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedRegistries(Vec<AllowedRegistry>);

/// The registry flags the kernel-cache controller and the node agents share (one
/// definition, so that both read the same names and environment variables).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct RegistryOptions {
    /// A registry (`host:port`) spoken to over plain HTTP; repeatable (the environment
    /// variable takes a comma-separated list). For tests and local mirrors only.
    #[arg(
        long = "plain-http-registry",
        env = "PLAIN_HTTP_REGISTRIES",
        value_name = "HOST:PORT",
        value_delimiter = ','
    )]
    pub plain_http_registries: Vec<String>,
    /// A registry (host, host:port, or with a repository prefix: ghcr.io/acme) cache
    /// images may come from; repeatable. None given: any registry. The controller refuses
    /// the others before pinning them; the agents check again before they pull.
    #[arg(
        long = "allowed-registry",
        env = "ALLOWED_REGISTRIES",
        value_name = "REGISTRY[/PREFIX]",
        value_delimiter = ','
    )]
    pub allowed_registries: Vec<AllowedRegistry>,
}

impl RegistryOptions {
    /// The allow-list the flags give.
    pub fn allowed(&self) -> AllowedRegistries {
        AllowedRegistries::new(self.allowed_registries.clone())
    }
}

/// Docker Hub's names, as one.
fn registry_name(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".into(),
        _ => host,
    }
}

impl std::str::FromStr for AllowedRegistry {
    type Err = String;

    /// An error names the entry that is not one.
    fn from_str(raw: &str) -> Result<Self, String> {
        let entry = raw.trim().trim_end_matches('/');
        let (host, prefix) = match entry.split_once('/') {
            Some((host, prefix)) => (host, Some(prefix.to_string())),
            None => (entry, None),
        };
        let valid_host = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
        let valid_prefix = prefix.as_deref().is_none_or(|p| {
            p.split('/').all(|segment| !segment.is_empty()) && !p.contains(['@', ':'])
        });
        if !(valid_host && valid_prefix) || raw.contains("://") {
            return Err(format!(
                "allowed registry {raw:?}: expected a registry host (host or host:port), \
                 optionally with a repository prefix (ghcr.io/acme)"
            ));
        }
        Ok(Self {
            registry: registry_name(host),
            prefix,
        })
    }
}

impl AllowedRegistries {
    /// Allow images from these (none: from any registry).
    pub fn new(entries: Vec<AllowedRegistry>) -> Self {
        Self(entries)
    }

    /// Whether every registry is allowed (no list).
    pub fn is_any(&self) -> bool {
        self.0.is_empty()
    }

    /// Allow `image`, or say why not, before any request is made for it.
    pub fn check(&self, image: &str) -> Result<(), String> {
        if self.is_any() {
            return Ok(());
        }
        let reference: Reference = image
            .parse()
            .map_err(|e| format!("invalid image reference {image:?}: {e}"))?;
        let registry = registry_name(reference.registry());
        let repository = reference.repository();
        let allowed = self.0.iter().any(|entry| {
            entry.registry == registry
                && entry.prefix.as_deref().is_none_or(|prefix| {
                    repository == prefix
                        || repository
                            .strip_prefix(prefix)
                            .is_some_and(|rest| rest.starts_with('/'))
                })
        });
        if allowed {
            return Ok(());
        }
        let list: Vec<String> = self
            .0
            .iter()
            .map(|e| match &e.prefix {
                Some(p) => format!("{}/{p}", e.registry),
                None => e.registry.clone(),
            })
            .collect();
        Err(format!(
            "image {image:?} is from {registry}/{repository}, which the cluster operator does not \
             allow (allowed: {})",
            list.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(entries: &[&str]) -> AllowedRegistries {
        AllowedRegistries::new(entries.iter().map(|e| e.parse().unwrap()).collect())
    }

    #[test]
    fn no_list_allows_any_registry() {
        assert!(allow(&[]).check("evil.example:6443/x/y:1").is_ok());
    }

    #[test]
    fn a_host_allows_its_images_and_only_its_port() {
        let a = allow(&["ghcr.io", "mirror.internal:5000"]);
        for ok in [
            "ghcr.io/acme/cache:1",
            "GHCR.io/acme/cache@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "mirror.internal:5000/team/cache:2",
        ] {
            assert!(a.check(ok).is_ok(), "{ok}");
        }
        for refused in [
            "mirror.internal:5001/team/cache:2",
            "mirror.internal/team/cache:2",
            "ghcr.io.evil.example/acme/cache:1",
            "127.0.0.1:2379/x:1",
            "ubuntu:24.04",
        ] {
            let error = a.check(refused).unwrap_err();
            assert!(error.contains("does not allow"), "{refused}: {error}");
            assert!(
                error.contains("allowed: ghcr.io, mirror.internal:5000"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_prefix_allows_whole_path_segments_only() {
        let a = allow(&["ghcr.io/acme/"]);
        assert!(a.check("ghcr.io/acme/cache:1").is_ok());
        assert!(a.check("ghcr.io/acme/team/cache:1").is_ok());
        assert!(a.check("ghcr.io/acmeevil/cache:1").is_err());
        assert!(a.check("ghcr.io/other/cache:1").is_err());
    }

    #[test]
    fn docker_hub_has_one_name() {
        let a = allow(&["index.docker.io/library"]);
        assert!(a.check("ubuntu:24.04").is_ok());
        assert!(a.check("docker.io/library/ubuntu:24.04").is_ok());
        assert!(a.check("docker.io/someone/ubuntu:24.04").is_err());
    }

    #[test]
    fn entries_that_are_not_registries_are_refused_by_name() {
        for bad in [
            "https://ghcr.io",
            "",
            "ghcr.io//acme",
            "ghcr.io/acme:1",
            "gh cr.io",
        ] {
            let error = bad.parse::<AllowedRegistry>().unwrap_err();
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }
}
