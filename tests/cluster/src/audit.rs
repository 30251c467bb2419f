//! The API server's audit log: who made which request. Tests use it to check that each
//! component's requests are what its chart's RBAC rules allow, and that each rule is used.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

/// One audited request (the `audit.k8s.io/v1` Event fields the tests use).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// Stage: `ResponseComplete`, or `ResponseStarted` for a watch that is still open.
    pub stage: String,
    /// Request verb as RBAC names it: get, list, watch, create, update, patch, delete, ...
    pub verb: String,
    /// Request path and query.
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// Who made the request.
    pub user: AuditUser,
    /// The object the request was about; absent for non-resource requests (discovery).
    #[serde(default)]
    pub object_ref: Option<AuditObjectRef>,
    /// The response.
    #[serde(default)]
    pub response_status: Option<AuditResponse>,
    /// Annotations, e.g. `mutation.webhook.admission.k8s.io/round_0_index_0` (which
    /// mutating webhook was called and whether it changed the object) or
    /// `failed-open.…` (a webhook that failed under an Ignore policy).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// The authenticated user of a request.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct AuditUser {
    /// User name (a client certificate's common name).
    #[serde(default)]
    pub username: String,
    /// Groups.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// The resource a request addressed.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AuditObjectRef {
    /// Resource (plural), e.g. `pods`.
    #[serde(default)]
    pub resource: String,
    /// API group, empty for core.
    #[serde(default)]
    pub api_group: String,
    /// Namespace, if any.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Object name, if any.
    #[serde(default)]
    pub name: Option<String>,
    /// Subresource, e.g. `status`.
    #[serde(default)]
    pub subresource: Option<String>,
}

/// The status of a response.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct AuditResponse {
    /// HTTP status code.
    #[serde(default)]
    pub code: u16,
}

impl AuditEvent {
    /// `resource` or `resource/subresource`, as RBAC rules name it.
    pub fn resource_path(&self) -> Option<String> {
        let r = self.object_ref.as_ref()?;
        if r.resource.is_empty() {
            return None;
        }
        Some(match &r.subresource {
            Some(sub) if !sub.is_empty() => format!("{}/{sub}", r.resource),
            _ => r.resource.clone(),
        })
    }
}

/// Read every event of the audit log at `path` (JSON lines).
pub fn read(path: &Path) -> anyhow::Result<Vec<AuditEvent>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // The API server may be writing an event as we read: only lines it has ended count.
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).with_context(|| format!("parsing audit event {line}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event the API server is still writing (no newline yet) is left for the next read.
    #[test]
    fn a_line_being_written_is_not_read() {
        let line = r#"{"stage":"ResponseComplete","verb":"get","requestURI":"/api/v1/pods","user":{"username":"u"}}"#;
        let path = std::env::temp_dir().join(format!("audit-{}.log", std::process::id()));
        std::fs::write(&path, format!("{line}\n{}", &line[..40])).unwrap();
        let events = read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].verb, "get");
    }
}
