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

/// Why a request is refused, or `None` when it may proceed.
pub fn refusal(method: &Method, headers: &HeaderMap, port: u16) -> Option<&'static str> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let allowed = ["127.0.0.1", "localhost", "[::1]"]
        .iter()
        .any(|name| host == format!("{name}:{port}"));
    if !allowed {
        return Some("the Host header must be this dashboard's loopback address");
    }
    let reads = matches!(*method, Method::GET | Method::HEAD);
    if !reads && headers.get(CSRF_HEADER).is_none() {
        return Some("changes must come from the dashboard's own page");
    }
    None
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
                refusal(&Method::GET, &headers(&[("host", host)]), 3001),
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
                refusal(&Method::GET, &headers(&[("host", host)]), 3001).is_some(),
                "{host}"
            );
        }
        assert!(refusal(&Method::GET, &HeaderMap::new(), 3001).is_some());
    }

    #[test]
    fn changes_need_the_dashboards_header() {
        let plain = headers(&[("host", "127.0.0.1:3001")]);
        let marked = headers(&[("host", "127.0.0.1:3001"), (CSRF_HEADER, "1")]);
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            assert!(refusal(&method, &plain, 3001).is_some(), "{method}");
            assert_eq!(refusal(&method, &marked, 3001), None, "{method}");
        }
        assert_eq!(refusal(&Method::HEAD, &plain, 3001), None);
    }
}
