//! What a registry's answers may do to the client: the redirects it follows
//! ([`redirects`]) and what of an error body may reach a status ([`error_codes`]).

use reqwest_oci as reqwest;

/// Redirects a registry may send the client on: at most 5, never from HTTPS to plain
/// HTTP, and never to a loopback, private or link-local address unless the request began
/// at one (a registry on the cluster's network, or a test's): a registry named by a
/// KernelCache's `spec.image` cannot make the controller or an agent reach the cluster's
/// own services. Redirects to other hosts stay allowed, as registries send blob
/// downloads to their storage; the client drops credentials on a change of host.
pub(super) fn redirects() -> reqwest::redirect::Policy {
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

/// What of a registry's error body may reach a status: the error codes of the
/// distribution spec's `{"errors": [{"code": ...}]}` (a fixed vocabulary:
/// `MANIFEST_UNKNOWN`, `UNAUTHORIZED`, ...), at most three, as ` (CODE, CODE)`; never the
/// body's own text, which a registry (or anything a redirect or a hostile image reference
/// reaches) writes and which would otherwise land in a status any reader of the object
/// sees.
pub(super) fn error_codes(body: &[u8]) -> String {
    let Ok(answer) = serde_json::from_slice::<serde_json::Value>(body) else {
        return String::new();
    };
    let codes: Vec<&str> = answer["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["code"].as_str())
        .filter(|c| {
            !c.is_empty() && c.len() <= 40 && c.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        })
        .take(3)
        .collect();
    if codes.is_empty() {
        String::new()
    } else {
        format!(" ({})", codes.join(", "))
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
    fn error_bodies_give_their_codes_and_nothing_else() {
        assert_eq!(
            error_codes(br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"secret: hunter2"}]}"#),
            " (MANIFEST_UNKNOWN)"
        );
        assert_eq!(
            error_codes(b"<html>internal page of another service</html>"),
            ""
        );
        assert_eq!(
            error_codes(br#"{"errors":[{"code":"lowercase words"},{"code":"DENIED"}]}"#),
            " (DENIED)"
        );
    }
}
