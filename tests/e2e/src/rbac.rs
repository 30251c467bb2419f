//! Least privilege, measured: a component's requests, as the test API server's audit log
//! recorded them under the component's own identity, against the RBAC rules its chart
//! grants that identity (`helm template` output). The test server authorizes everything
//! (the RBAC authorizer lives in k8s.io/kubernetes), so this is where a chart's Roles are
//! checked: every request must be allowed by some rule, and every verb of every rule must
//! be used on every resource of the rule by some request (an unused grant is a privilege
//! the component does not need).
//!
//! The matching follows RBAC's rules (k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac):
//! a rule allows a request when its apiGroups, resources (`resource/subresource`) and
//! verbs contain the request's (or `*`), and its resourceNames are empty or contain the
//! request's name; a `create` carries no name at authorization time; a Role binds only in
//! its own namespace, a ClusterRole bound by a ClusterRoleBinding everywhere; a server-side
//! apply that creates its object is also authorized as `create` ([`authorizations`]).

use std::collections::BTreeSet;
use std::fmt;

use kubeairunway_testcluster::AuditEvent;
use serde_json::Value;

/// One rule of a Role or ClusterRole, with where it applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// `Role <ns>/<name>` or `ClusterRole <name>`: where the rule comes from.
    pub source: String,
    /// The namespace a Role binds in; `None` for a ClusterRole bound cluster-wide.
    pub namespace: Option<String>,
    /// apiGroups.
    pub api_groups: Vec<String>,
    /// resources (`resource` or `resource/subresource`).
    pub resources: Vec<String>,
    /// verbs.
    pub verbs: Vec<String>,
    /// resourceNames (empty: any name).
    pub resource_names: Vec<String>,
}

/// A request as RBAC sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    /// Verb.
    pub verb: String,
    /// API group.
    pub api_group: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// Namespace, empty for cluster-scoped requests.
    pub namespace: String,
    /// Object name as the authorizer sees it (empty for create, list, watch of a collection).
    pub name: String,
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.api_group.is_empty() {
            "core"
        } else {
            &self.api_group
        };
        write!(f, "{} {group}/{}", self.verb, self.resource)?;
        if !self.namespace.is_empty() {
            write!(f, " in {}", self.namespace)?;
        }
        if !self.name.is_empty() {
            write!(f, " named {}", self.name)?;
        }
        Ok(())
    }
}

impl Request {
    /// The request of an audit event; `None` for a non-resource request (discovery).
    pub fn from_audit(event: &AuditEvent) -> Option<Self> {
        let r = event.object_ref.as_ref()?;
        let resource = event.resource_path()?;
        let name = if event.verb == "create" && r.subresource.as_deref().unwrap_or("").is_empty() {
            String::new()
        } else {
            r.name.clone().unwrap_or_default()
        };
        Some(Self {
            verb: event.verb.clone(),
            api_group: r.api_group.clone(),
            resource,
            namespace: r.namespace.clone().unwrap_or_default(),
            name,
        })
    }
}

/// Every authorization an audited request passed: the request itself and, for a patch
/// that created its object (server-side apply of an object that did not exist, answered
/// `201 Created`), a `create` of that name too, which the API server authorizes before it
/// stores the object (`createAuthorizerAttributes` and `withAuthorization` in
/// k8s.io/apiserver `pkg/endpoints/handlers/patch.go`@v0.36.4).
pub fn authorizations(event: &AuditEvent) -> Vec<Request> {
    let Some(request) = Request::from_audit(event) else {
        return Vec::new();
    };
    let created = event.verb == "patch"
        && event
            .response_status
            .as_ref()
            .is_some_and(|s| s.code == 201);
    let mut out = vec![request.clone()];
    if created {
        out.push(Request {
            verb: "create".into(),
            ..request
        });
    }
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn contains(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}

impl Rule {
    /// Whether this rule allows `req`.
    pub fn allows(&self, req: &Request) -> bool {
        if let Some(ns) = &self.namespace
            && ns != &req.namespace
        {
            return false;
        }
        contains(&self.api_groups, &req.api_group)
            && contains(&self.resources, &req.resource)
            && contains(&self.verbs, &req.verb)
            && (self.resource_names.is_empty()
                || (!req.name.is_empty() && self.resource_names.contains(&req.name)))
    }
}

/// The rules the rendered chart `objects` grant the service account `namespace/name`,
/// through RoleBindings and ClusterRoleBindings.
pub fn granted_rules(objects: &[Value], namespace: &str, name: &str) -> Vec<Rule> {
    let binds_sa = |binding: &Value| {
        binding["subjects"].as_array().is_some_and(|subjects| {
            subjects.iter().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == name && s["namespace"] == namespace
            })
        })
    };
    let role = |kind: &str, role_name: &str, role_ns: Option<&str>| {
        objects.iter().find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"] == role_name
                && role_ns.is_none_or(|ns| o["metadata"]["namespace"] == ns)
        })
    };
    let mut rules = Vec::new();
    for binding in objects.iter().filter(|o| binds_sa(o)) {
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default();
        let (found, scope) = match (binding["kind"].as_str(), role_kind) {
            (Some("ClusterRoleBinding"), "ClusterRole") => {
                (role("ClusterRole", role_name, None), None)
            }
            (Some("RoleBinding"), "ClusterRole") => (
                role("ClusterRole", role_name, None),
                binding["metadata"]["namespace"]
                    .as_str()
                    .map(str::to_string),
            ),
            (Some("RoleBinding"), "Role") => {
                let ns = binding["metadata"]["namespace"].as_str();
                (role("Role", role_name, ns), ns.map(str::to_string))
            }
            _ => (None, None),
        };
        let Some(found) = found else { continue };
        let source = match &scope {
            Some(ns) => format!("{role_kind} {ns}/{role_name}"),
            None => format!("{role_kind} {role_name}"),
        };
        for r in found["rules"].as_array().into_iter().flatten() {
            rules.push(Rule {
                source: source.clone(),
                namespace: scope.clone(),
                api_groups: strings(&r["apiGroups"]),
                resources: strings(&r["resources"]),
                verbs: strings(&r["verbs"]),
                resource_names: strings(&r["resourceNames"]),
            });
        }
    }
    rules
}

/// The outcome of a measurement.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Measured {
    /// Requests no rule allows.
    pub denied: BTreeSet<Request>,
    /// `(rule source, apiGroups, resource, verb, resourceNames)` of every verb on every
    /// resource of a rule that no request used.
    pub unused: BTreeSet<String>,
}

impl Measured {
    /// Nothing denied and nothing unused.
    pub fn is_least_privilege(&self) -> bool {
        self.denied.is_empty() && self.unused.is_empty()
    }
}

/// Compare the requests of `user` in `events` with `rules`.
pub fn measure(rules: &[Rule], events: &[AuditEvent], user: &str) -> Measured {
    let requests: BTreeSet<Request> = events
        .iter()
        .filter(|e| e.user.username == user)
        .flat_map(authorizations)
        .collect();
    let mut out = Measured::default();
    for req in &requests {
        if !rules.iter().any(|r| r.allows(req)) {
            out.denied.insert(req.clone());
        }
    }
    for rule in rules {
        for resource in &rule.resources {
            for verb in &rule.verbs {
                let narrowed = Rule {
                    verbs: vec![verb.clone()],
                    resources: vec![resource.clone()],
                    ..rule.clone()
                };
                if !requests.iter().any(|req| narrowed.allows(req)) {
                    out.unused.insert(format!(
                        "{}: {verb} {:?}/{:?} names {:?}",
                        rule.source, rule.api_groups, narrowed.resources, rule.resource_names
                    ));
                }
            }
        }
    }
    out
}
