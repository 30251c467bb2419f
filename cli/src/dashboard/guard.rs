//! Who may talk to the dashboard: only its own pages, through its own address.
//!
//! The dashboard acts with the user's credentials, so a web page on another origin must
//! not be able to make it act. Two rules, each a pure function over the request's headers:
//! - the `Host` header names this server's loopback address (`127.0.0.1:<port>`,
//!   `localhost:<port>`, `[::1]:<port>`): a page that rebinds its own DNS name to
//!   127.0.0.1 sends its own name and is refused;
//! - a request that changes anything (any method but GET and HEAD) carries
//!   [`CSRF_HEADER`]: a cross-site HTML form cannot set a header, and a cross-site `fetch`
//!   that sets one needs a CORS preflight, which this server never grants.

use axum::http::{HeaderMap, Method, header};

/// The header the dashboard's own script sends with every change.
pub const CSRF_HEADER: &str = "x-kubeairunway-dashboard";

/// Why a request is refused, or `None` when it may proceed. `hosts`: the names the
/// server is also reached by in the cluster (its Service or Ingress host, `--allowed-host`),
/// each with any port unless it names one.
pub fn refusal(
    method: &Method,
    headers: &HeaderMap,
    port: u16,
    hosts: &[String],
) -> Option<&'static str> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let loopback = ["127.0.0.1", "localhost", "[::1]"]
        .iter()
        .any(|name| host == format!("{name}:{port}"));
    if !loopback && !hosts.iter().any(|allowed| host_matches(host, allowed)) {
        return Some(
            "the Host header must be this dashboard's loopback address or an allowed host",
        );
    }
    let reads = matches!(*method, Method::GET | Method::HEAD);
    if !reads && headers.get(CSRF_HEADER).is_none() {
        return Some("changes must come from the dashboard's own page");
    }
    None
}

/// Whether `host` (a Host header) is `allowed`: the same name and port, or the same name
/// with any port when `allowed` names none. Names compare without case.
fn host_matches(host: &str, allowed: &str) -> bool {
    let (name, port) = split_port(host);
    let (allowed_name, allowed_port) = split_port(allowed);
    !allowed_name.is_empty()
        && name.eq_ignore_ascii_case(allowed_name)
        && (allowed_port.is_none() || allowed_port == port)
}

/// `name:port` (`[v6]:port`) into its name and port; no port when there is none.
fn split_port(host: &str) -> (&str, Option<&str>) {
    match host.rsplit_once(':') {
        Some((name, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!name.contains(':') || name.ends_with(']')) =>
        {
            (name, Some(port))
        }
        _ => (host, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_the_loopback_host_of_this_port_is_served() {
        for host in ["127.0.0.1:3001", "localhost:3001", "[::1]:3001"] {
            assert_eq!(
                refusal(&Method::GET, &headers(&[("host", host)]), 3001, &[]),
                None,
                "{host}"
            );
        }
        for host in [
            "evil.example:3001",
            "127.0.0.1:3002",
            "127.0.0.1",
            "localhost.evil:3001",
        ] {
            assert!(
                refusal(&Method::GET, &headers(&[("host", host)]), 3001, &[]).is_some(),
                "{host}"
            );
        }
        assert!(refusal(&Method::GET, &HeaderMap::new(), 3001, &[]).is_some());
    }

    #[test]
    fn changes_need_the_dashboards_header() {
        let plain = headers(&[("host", "127.0.0.1:3001")]);
        let marked = headers(&[("host", "127.0.0.1:3001"), (CSRF_HEADER, "1")]);
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            assert!(refusal(&method, &plain, 3001, &[]).is_some(), "{method}");
            assert_eq!(refusal(&method, &marked, 3001, &[]), None, "{method}");
        }
        assert_eq!(refusal(&Method::HEAD, &plain, 3001, &[]), None);
    }

    #[test]
    fn allowed_hosts_are_served_with_any_port_unless_they_name_one() {
        let hosts = [
            "dashboard.example.com".to_string(),
            "kar.svc:8080".to_string(),
        ];
        let get = |host: &str| refusal(&Method::GET, &headers(&[("host", host)]), 3001, &hosts);
        for host in [
            "dashboard.example.com",
            "Dashboard.Example.com:443",
            "kar.svc:8080",
            "127.0.0.1:3001",
        ] {
            assert_eq!(get(host), None, "{host}");
        }
        for host in [
            "kar.svc",
            "kar.svc:8081",
            "evil.dashboard.example.com",
            "dashboard.example.com.evil",
            "127.0.0.1:8080",
        ] {
            assert!(get(host).is_some(), "{host}");
        }
    }
}
