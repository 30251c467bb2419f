//! Helpers for admission webhooks speaking `admission.k8s.io/v1` with kube's types.

use kube::core::admission::AdmissionResponse;
use serde_json::Value;

/// The AdmissionReview JSON for a response. kube serialises `patch` (Go `[]byte`) as an
/// array of numbers; the API server's Go JSON reads that too, but the canonical form (what
/// Go writes and every other consumer expects) is a base64 string, so write that.
pub fn review_json(resp: AdmissionResponse) -> Result<Value, serde_json::Error> {
    use base64::Engine as _;
    let mut v = serde_json::to_value(resp.into_review())?;
    if let Some(patch) = v.pointer_mut("/response/patch")
        && let Value::Array(items) = patch
    {
        let bytes: Vec<u8> = items
            .iter()
            .filter_map(Value::as_u64)
            .filter_map(|b| u8::try_from(b).ok())
            .collect();
        *patch = Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    Ok(v)
}
