//! Bounded HTTP for the node caches' downloads, shared by the kernel-cache registry client
//! (`kubeairunway-kernelcache-artifact`) and the model-cache hub client
//! (`kubeairunway-modelcache-hub`), both of which the privileged node agent runs against
//! servers a user names: the time limits of every request ([`Timeouts`]) and the redirects
//! a server may send the client on ([`redirects`]).

use std::time::Duration;

use reqwest_oci as reqwest;

/// Time limits of requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// To establish a connection.
    pub connect: Duration,
    /// Without a byte arriving.
    pub idle: Duration,
    /// For a whole request of bounded size (a manifest, a token, a listing), and the
    /// fixed part of a transfer's deadline.
    pub request: Duration,
    /// The slowest transfer rate accepted, in bytes per second: a transfer of `n` bytes
    /// has `request + n / min_rate` in all.
    pub min_rate: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            idle: Duration::from_secs(30),
            request: Duration::from_secs(60),
            min_rate: 256 << 10,
        }
    }
}

impl Timeouts {
    /// The deadline of a transfer of `bytes`.
    pub fn for_bytes(&self, bytes: u64) -> Duration {
        self.request + Duration::from_secs(bytes / self.min_rate.max(1))
    }
}

/// Redirects a server (a registry, the hub) may send the client on: at most 5, never from HTTPS to plain
/// HTTP, and never to a loopback, private or link-local address unless the request began
/// at one (a registry on the cluster's network, or a test's): a server named by a
/// user (a KernelCache's `spec.image`, a model's hub) cannot make the controller or an agent reach the cluster's
/// own services. Redirects to other hosts stay allowed, as registries and the hub send
/// downloads to their storage or CDN; the client drops credentials on a change of host.
pub fn redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        match redirect_refusal(attempt.previous(), attempt.url()) {
            Some(why) => attempt.error(why),
            None => attempt.follow(),
        }
    })
}

/// Why a redirect to `to` after the requests to `previous` (the first one first) is not
/// followed, if it is not.
fn redirect_refusal(previous: &[reqwest::Url], to: &reqwest::Url) -> Option<String> {
    let first = previous.first()?;
    if previous.len() > 5 {
        return Some("too many redirects".into());
    }
    if previous.iter().any(|u| u.scheme() == "https") && to.scheme() != "https" {
        return Some(format!("refusing a redirect from HTTPS to {}", to.scheme()));
    }
    if internal(to) && !internal(first) {
        return Some(format!(
            "refusing a redirect to an internal address ({})",
            to.host_str().unwrap_or_default()
        ));
    }
    None
}

/// Whether `url` names a loopback, private, link-local or unspecified address (or
/// `localhost`).
fn internal(url: &reqwest::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => {
            ip.is_loopback() || ip.is_private() || ip.is_link_local() || ip.is_unspecified()
        }
        Some(url::Host::Ipv6(ip)) => {
            ip.is_loopback()
                || ip.is_unspecified()
                || ip.is_unique_local()
                || ip.is_unicast_link_local()
                || ip
                    .to_ipv4_mapped()
                    .is_some_and(|v4| v4.is_loopback() || v4.is_private() || v4.is_link_local())
        }
        Some(url::Host::Domain(d)) => d == "localhost" || d.ends_with(".localhost"),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_stay_https_and_never_turn_to_internal_addresses() {
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        let public = [url("https://registry.example/v2/c/blobs/sha256:ab")];
        let storage = url("https://storage.example/blob?sig=x");
        assert_eq!(
            redirect_refusal(&public, &storage),
            None,
            "blob storage elsewhere"
        );
        let downgrade = redirect_refusal(&public, &url("http://storage.example/blob"));
        assert!(downgrade.unwrap().contains("from HTTPS to http"));
        for inside in [
            "https://127.0.0.1:6443/api",
            "https://10.0.0.1/",
            "https://169.254.169.254/latest/meta-data",
            "https://[::1]/",
            "https://[fd00::1]/",
            "https://localhost/",
        ] {
            let refused = redirect_refusal(&public, &url(inside));
            assert!(refused.is_some_and(|r| r.contains("internal")), "{inside}");
        }
        // A registry on the cluster's own network (or a test's) may redirect within it.
        let mirror = [url("http://10.0.0.5:5000/v2/c/blobs/sha256:ab")];
        assert_eq!(
            redirect_refusal(&mirror, &url("http://10.0.0.6:9000/b")),
            None
        );
        let six: Vec<_> = (0..6).map(|_| public[0].clone()).collect();
        assert_eq!(
            redirect_refusal(&six, &storage).as_deref(),
            Some("too many redirects")
        );
    }

    #[test]
    fn a_transfer_has_its_fixed_part_and_its_size_at_the_slowest_rate() {
        let t = Timeouts::default();
        assert_eq!(t.for_bytes(0), Duration::from_secs(60));
        assert_eq!(t.for_bytes(256 << 20), Duration::from_secs(60 + 1024));
    }
}
