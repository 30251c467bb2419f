//! A component's chart's RBAC, enforced and measured.
//!
//! Enforced: the test API server authorizes requests with RBAC, as kube-apiserver does.
//! [`ChartIdentity::apply`] applies a chart's ServiceAccounts, Roles, ClusterRoles and
//! bindings from `helm template` output and gives a client that authenticates as the
//! component's service account; a request the chart does not grant is refused with 403,
//! and the guard fails the test naming the component, the verb and the resource of every
//! refused request ([`refused`]).
//!
//! Measured: a component's requests, as the audit log recorded them under its identity,
//! against the RBAC rules its chart grants that identity: every request must be allowed
//! by some rule, and every verb of every rule must be used on every resource of the rule
//! by some request (an unused grant is a privilege the component does not need).
//!
//! The matching follows RBAC's rules (k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac):
//! a rule allows a request when its apiGroups, resources (`resource/subresource`) and
//! verbs contain the request's (or `*`), and its resourceNames are empty or contain the
//! request's name; a `create` carries no name at authorization time; a Role binds only in
//! its own namespace, a ClusterRole bound by a ClusterRoleBinding everywhere; a server-side
//! apply that creates its object is also authorized as `create` ([`authorizations`]).

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use kubeairunway_testcluster::{AuditEvent, TestCluster};
use serde_json::{Value, json};

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

/// [`measure`] the requests the service account `namespace/account` made on `cluster`
/// against what the chart's `objects` grant it, asserting that none was denied.
pub fn measure_chart_account(
    cluster: &kubeairunway_testcluster::TestCluster,
    objects: &[Value],
    namespace: &str,
    account: &str,
) -> anyhow::Result<Measured> {
    let rules = granted_rules(objects, namespace, account);
    let measured = measure(
        &rules,
        &cluster.audit_events()?,
        &kubeairunway_testcluster::service_account_user(namespace, account),
    );
    assert!(
        measured.denied.is_empty(),
        "requests the chart does not allow: {:#?}",
        measured.denied
    );
    Ok(measured)
}

/// The requests of `user` in `events` that the API server refused with 403 Forbidden.
pub fn refused(events: &[AuditEvent], user: &str) -> BTreeSet<Request> {
    events
        .iter()
        .filter(|e| {
            e.user.username == user
                && e.stage == "ResponseComplete"
                && e.response_status.as_ref().is_some_and(|s| s.code == 403)
        })
        .filter_map(Request::from_audit)
        .collect()
}

/// The RBAC kinds a chart renders, applied by [`ChartIdentity::apply`].
pub const RBAC_KINDS: &[&str] = &[
    "ServiceAccount",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
];

/// A component running as its chart's service account, under the RBAC its chart grants.
/// When dropped outside a panic it fails the test if the API server refused any request
/// of the component (and prints them when the test fails otherwise), naming the component,
/// the verb and the resource.
#[derive(Debug)]
pub struct ChartIdentity {
    /// What the test calls the component (`kernelcache-provider warmup`, say).
    pub component: String,
    /// The service account's namespace.
    pub namespace: String,
    /// The service account.
    pub account: String,
    /// Its user name, `system:serviceaccount:<namespace>:<account>`.
    pub user: String,
    /// The rules the chart grants it.
    pub rules: Vec<Rule>,
    audit_log: PathBuf,
    /// Whether dropping it checks for refused requests.
    armed: bool,
}

impl ChartIdentity {
    /// Apply the RBAC objects of the rendered chart `objects` ([`RBAC_KINDS`]) as `admin`,
    /// creating the namespaces they go in, and wait until the API server's authorizer
    /// has them: until a SubjectAccessReview of each rule granted to `namespace/account`
    /// is allowed.
    pub async fn apply(
        cluster: &TestCluster,
        admin: &Client,
        objects: &[Value],
        component: &str,
        namespace: &str,
        account: &str,
    ) -> anyhow::Result<Self> {
        let mut namespaces: BTreeSet<&str> = objects
            .iter()
            .filter(|o| RBAC_KINDS.iter().any(|k| o["kind"] == *k))
            .filter_map(|o| o["metadata"]["namespace"].as_str())
            .collect();
        namespaces.insert(namespace);
        for ns in namespaces {
            kubeairunway_testcluster::ensure_namespace(admin, ns).await?;
        }
        crate::helm::apply_kinds(admin, objects, RBAC_KINDS).await?;
        let identity = Self {
            component: component.to_string(),
            namespace: namespace.to_string(),
            account: account.to_string(),
            user: kubeairunway_testcluster::service_account_user(namespace, account),
            rules: granted_rules(objects, namespace, account),
            audit_log: cluster.dir().join("audit.log"),
            armed: true,
        };
        anyhow::ensure!(
            !identity.rules.is_empty(),
            "{component}: the chart grants {namespace}/{account} nothing"
        );
        for rule in &identity.rules {
            let review = identity.review(rule);
            until_allowed(
                admin,
                &review,
                &format!("{component}: {} in effect", rule.source),
            )
            .await?;
        }
        Ok(identity)
    }

    /// A SubjectAccessReview of the first verb, resource and name of `rule` for this
    /// identity, in the rule's namespace (a namespace of its own for a cluster-wide rule:
    /// a ClusterRoleBinding grants in every namespace).
    fn review(&self, rule: &Rule) -> Value {
        let first = |list: &[String]| list.first().cloned().unwrap_or_default();
        let (resource, subresource) = match first(&rule.resources).split_once('/') {
            Some((r, s)) => (r.to_string(), s.to_string()),
            None => (first(&rule.resources), String::new()),
        };
        let group = first(&rule.api_groups);
        json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {
                "user": self.user,
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "resourceAttributes": {
                    "namespace": rule.namespace.clone().unwrap_or_else(|| "default".into()),
                    "group": if group == "*" { String::new() } else { group },
                    "resource": if resource == "*" { "pods".into() } else { resource },
                    "subresource": subresource,
                    "verb": first(&rule.verbs),
                    "name": first(&rule.resource_names),
                },
            },
        })
    }

    /// A client that authenticates as the service account, as the component's pod would.
    pub async fn client(&self, cluster: &TestCluster) -> anyhow::Result<Client> {
        cluster
            .client_as_service_account(&self.namespace, &self.account)
            .await
    }

    /// A client that authenticates as the service account of a pod on `node`, with the
    /// token the kubelet would mount there (the node in the user's extra, as a bound
    /// token carries it): a pod `<account>-<node>` is created as `admin` for it.
    pub async fn client_on_node(
        &self,
        cluster: &TestCluster,
        admin: &Client,
        node: &str,
    ) -> anyhow::Result<Client> {
        let pods: Api<Pod> = Api::namespaced(admin.clone(), &self.namespace);
        let name = format!("{}-{node}", self.account);
        let pod = if let Some(pod) = pods.get_opt(&name).await? {
            pod
        } else {
            let pod = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"serviceAccountName": self.account, "nodeName": node,
                    "containers": [{"name": "c", "image": "component:test"}]},
            }))?;
            pods.create(&PostParams::default(), &pod).await?
        };
        cluster.client_for_pod(&pod).await
    }

    /// The component's requests the API server refused so far.
    pub fn refused(&self) -> anyhow::Result<BTreeSet<Request>> {
        let events = kubeairunway_testcluster::audit::read(&self.audit_log)?;
        Ok(refused(&events, &self.user))
    }

    /// Fail naming every request of the component that was refused.
    pub fn assert_none_refused(&self) {
        let refused = self
            .refused()
            .unwrap_or_else(|e| panic!("{}: reading the audit log: {e:#}", self.component));
        assert!(refused.is_empty(), "{}", self.describe_refusals(&refused));
    }

    /// Drop it without failing on refused requests: for a test that means them.
    pub fn expect_refusals(mut self) {
        self.armed = false;
    }

    fn describe_refusals(&self, refused: &BTreeSet<Request>) -> String {
        let list: Vec<String> = refused.iter().map(|r| format!("  {r}")).collect();
        format!(
            "{} ({}) was refused (403) by the API server; its chart does not grant:\n{}",
            self.component,
            self.user,
            list.join("\n")
        )
    }
}

impl Drop for ChartIdentity {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if std::thread::panicking() {
            if let Ok(refused) = self.refused()
                && !refused.is_empty()
            {
                eprintln!("{}", self.describe_refusals(&refused));
            }
            return;
        }
        self.assert_none_refused();
    }
}

/// Whether the API server's authorizer allows what the SubjectAccessReview `review` asks.
pub async fn subject_access_review(client: &Client, review: &Value) -> anyhow::Result<bool> {
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource {
            group: "authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "authorization.k8s.io/v1".into(),
            kind: "SubjectAccessReview".into(),
            plural: "subjectaccessreviews".into(),
        },
    );
    let answer = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(review.clone())?,
        )
        .await
        .context("creating a SubjectAccessReview")?;
    Ok(answer.data["status"]["allowed"] == true)
}

/// Wait (up to 30 s) until the API server's authorizer allows what `review` asks: RBAC
/// objects just applied reach the authorizer through its informers.
async fn until_allowed(admin: &Client, review: &Value, what: &str) -> anyhow::Result<()> {
    crate::eventually(30, what, || async {
        subject_access_review(admin, review)
            .await
            .ok()?
            .then_some(())
    })
    .await
}

/// Grant `rules` in `namespace` to `subjects` (RBAC subjects: `{"kind": "User" | "Group" |
/// "ServiceAccount", "name": ..., ...}`) with a Role and a RoleBinding named `name`,
/// applied as `admin`, and wait until the API server's authorizer allows each subject the
/// first verb of each rule: for a test's own identities that are no chart's.
pub async fn grant(
    admin: &Client,
    namespace: &str,
    name: &str,
    subjects: Value,
    rules: Value,
) -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams};
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": namespace}, "rules": rules});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subjects});
    let pp = PatchParams::apply("kubeairunway-tests").force();
    for (kind, plural, body) in [
        ("Role", "roles", &role),
        ("RoleBinding", "rolebindings", &binding),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(
            admin.clone(),
            namespace,
            &ApiResource {
                group: "rbac.authorization.k8s.io".into(),
                version: "v1".into(),
                api_version: "rbac.authorization.k8s.io/v1".into(),
                kind: kind.into(),
                plural: plural.into(),
            },
        );
        api.patch(name, &pp, &Patch::Apply(body))
            .await
            .with_context(|| format!("applying {kind} {namespace}/{name}"))?;
    }
    for subject in subjects.as_array().into_iter().flatten() {
        let subject_name = subject["name"].as_str().unwrap_or_default();
        let (user, groups) = match subject["kind"].as_str() {
            Some("Group") => (String::new(), vec![subject_name.to_string()]),
            Some("ServiceAccount") => (
                kubeairunway_testcluster::service_account_user(
                    subject["namespace"].as_str().unwrap_or(namespace),
                    subject_name,
                ),
                Vec::new(),
            ),
            _ => (subject_name.to_string(), Vec::new()),
        };
        for rule in rules.as_array().into_iter().flatten() {
            let first = |field: &str| rule[field][0].as_str().unwrap_or_default().to_string();
            let review = json!({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": user, "groups": groups, "resourceAttributes": {
                    "namespace": namespace, "group": first("apiGroups"),
                    "resource": first("resources"), "verb": first("verbs"),
                    "name": first("resourceNames"),
                }},
            });
            until_allowed(admin, &review, &format!("{name} granted to {subject}")).await?;
        }
    }
    Ok(())
}
