//! What a registry's answers may do to the client: the redirects it follows (the node
//! caches' shared policy, `kubeairunway_cache_http::redirects`) and what of an error body
//! may reach a status ([`error_codes`]).

pub(super) use kubeairunway_cache_http::redirects;

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
