//! A review of every chart's RBAC, as rendered: no component may read Secrets or change
//! Nodes or ConfigMaps cluster-wide unless a ValidatingAdmissionPolicy of the same chart
//! limits what that service account may do with them.
//!
//! A ClusterRole (bound cluster-wide) granting any verb but `create` on Secrets without
//! `resourceNames` is refused outright: one compromised pod would read every Secret in
//! the cluster (webhook CA keys included). Write verbs on Nodes or ConfigMaps are allowed
//! only beside a policy that matches the bound service account. The policies themselves
//! are enforced by the test API server, on the components' requests, in `gateway`,
//! `modelcache_mount`, `kaito` and `providers_rbac`.

use kubeairunway_e2e::helm;
use serde_json::Value;

const CHARTS: &[&str] = &[
    "kubeairunway",
    "kaito-provider",
    "dynamo-provider",
    "kuberay-provider",
    "deployment-provider",
    "kernelcache-provider",
];

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The service accounts (`system:serviceaccount:<ns>:<name>`) a ClusterRole is bound to.
fn bound_to(objects: &[Value], role: &str) -> Vec<String> {
    helm::of_kind(objects, "ClusterRoleBinding")
        .into_iter()
        .filter(|b| b["roleRef"]["name"] == role)
        .flat_map(|b| b["subjects"].as_array().cloned().unwrap_or_default())
        .map(|s| {
            format!(
                "system:serviceaccount:{}:{}",
                s["namespace"].as_str().unwrap_or_default(),
                s["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// Whether a ValidatingAdmissionPolicy of the chart, bound with Deny, governs `resource`
/// for `user`.
fn policed(objects: &[Value], resource: &str, user: &str) -> bool {
    helm::of_kind(objects, "ValidatingAdmissionPolicy")
        .into_iter()
        .filter(|p| {
            helm::of_kind(objects, "ValidatingAdmissionPolicyBinding")
                .iter()
                .any(|b| {
                    b["spec"]["policyName"] == p["metadata"]["name"]
                        && strings(&b["spec"]["validationActions"]).contains(&"Deny".to_string())
                })
        })
        .any(|p| {
            let rules = p["spec"]["matchConstraints"]["resourceRules"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let matches_resource = rules
                .iter()
                .any(|r| strings(&r["resources"]).contains(&resource.to_string()));
            let matches_user = p["spec"]["matchConditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["expression"].as_str().is_some_and(|e| e.contains(user)));
            matches_resource && matches_user
        })
}

fn review(chart: &str, objects: &[Value]) -> Vec<String> {
    let mut findings = Vec::new();
    for role in helm::of_kind(objects, "ClusterRole") {
        let name = role["metadata"]["name"].as_str().unwrap_or_default();
        let users = bound_to(objects, name);
        for rule in role["rules"].as_array().into_iter().flatten() {
            if !strings(&rule["apiGroups"]).contains(&String::new()) {
                continue;
            }
            let verbs = strings(&rule["verbs"]);
            let named = rule.get("resourceNames").is_some();
            for resource in strings(&rule["resources"]) {
                let writes: Vec<&String> = verbs
                    .iter()
                    .filter(|v| {
                        ["update", "patch", "delete", "deletecollection", "*"].contains(&v.as_str())
                    })
                    .collect();
                match resource.as_str() {
                    "secrets" if !named && verbs.iter().any(|v| v != "create") => findings.push(
                        format!("{chart}: ClusterRole {name} grants {verbs:?} on every Secret"),
                    ),
                    "nodes" | "configmaps" if !named && !writes.is_empty() => {
                        for user in &users {
                            if !policed(objects, &resource, user) {
                                findings.push(format!(
                                    "{chart}: ClusterRole {name} lets {user} {writes:?} every {resource} with no ValidatingAdmissionPolicy limiting it"
                                ));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    findings
}

#[test]
fn no_chart_reads_every_secret_or_writes_nodes_or_configmaps_unchecked() {
    let Some(helm) = helm::require() else {
        return;
    };
    let mut findings = Vec::new();
    for chart in CHARTS {
        let objects = helm::template(&helm, &helm::chart(chart), &[]).unwrap();
        assert!(
            !helm::of_kind(&objects, "ClusterRole").is_empty(),
            "{chart}"
        );
        findings.extend(review(chart, &objects));
    }
    assert!(findings.is_empty(), "{findings:#?}");
}

#[test]
fn the_kernel_cache_agent_reads_secrets_only_in_the_credentials_namespace() {
    let Some(helm) = helm::require() else {
        return;
    };
    let objects = helm::template(&helm, &helm::chart("kernelcache-provider"), &[]).unwrap();
    let agent_roles: Vec<&Value> = helm::of_kind(&objects, "Role")
        .into_iter()
        .filter(|r| r["metadata"]["labels"]["app.kubernetes.io/component"] == "agent")
        .collect();
    let secret_rules: Vec<(String, Vec<String>)> = agent_roles
        .iter()
        .flat_map(|r| {
            r["rules"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|rule| {
                    strings(&rule["resources"])
                        .contains(&"secrets".to_string())
                        .then(|| {
                            (
                                r["metadata"]["namespace"]
                                    .as_str()
                                    .unwrap_or_default()
                                    .to_string(),
                                strings(&rule["verbs"]),
                            )
                        })
                })
        })
        .collect();
    assert_eq!(
        secret_rules,
        [(
            "kernelcache-credentials".to_string(),
            vec!["get".to_string()]
        )]
    );
    // The controller reads users' pull Secrets only where it is told to.
    let told = helm::template(
        &helm,
        &helm::chart("kernelcache-provider"),
        &[
            ("controller.pullSecrets[0].namespace", "ml"),
            ("controller.pullSecrets[0].names[0]", "regcred"),
        ],
    )
    .unwrap();
    let pull: Vec<&Value> = helm::of_kind(&told, "Role")
        .into_iter()
        .filter(|r| r["metadata"]["namespace"] == "ml")
        .collect();
    assert_eq!(pull.len(), 1);
    assert_eq!(
        pull[0]["rules"][0]["resourceNames"],
        serde_json::json!(["regcred"])
    );
    assert_eq!(pull[0]["rules"][0]["verbs"], serde_json::json!(["get"]));
}

/// No component may create Secrets in the namespace the charts install into: `create`
/// cannot be limited to a name, and there it would let a component make a
/// service-account token Secret for a stronger account of that namespace. The webhooks'
/// certificate Secrets are made by the charts instead (`kubeairunway-lib.webhookSecret`),
/// and the components only get and update them by name. The kernel-cache controller's
/// copies of pull Secrets go to the credentials namespace, which holds no service account.
#[test]
fn no_component_creates_secrets_in_the_release_namespace() {
    let Some(helm) = helm::require() else {
        return;
    };
    let release = "kubeairunway-system";
    let mut found = Vec::new();
    for chart in CHARTS {
        let objects = helm::template(&helm, &helm::chart(chart), &[]).unwrap();
        for role in helm::of_kind(&objects, "Role")
            .into_iter()
            .chain(helm::of_kind(&objects, "ClusterRole"))
        {
            let namespace = role["metadata"]["namespace"].as_str();
            let in_release = namespace.is_none_or(|ns| ns == release);
            for rule in role["rules"].as_array().into_iter().flatten() {
                let secrets = strings(&rule["resources"])
                    .iter()
                    .any(|r| r == "secrets" || r == "*");
                let creates = strings(&rule["verbs"])
                    .iter()
                    .any(|v| v == "create" || v == "*");
                if in_release && secrets && creates {
                    found.push(format!(
                        "{chart}: {} {}",
                        role["kind"], role["metadata"]["name"]
                    ));
                }
            }
        }
        // The charts make their webhooks' certificate Secrets themselves (checked by
        // a_webhook_gets_and_patches_only_its_two_certificate_secrets).
        for secret in helm::of_kind(&objects, "Secret") {
            assert!(
                ["kubernetes.io/tls", "Opaque"].contains(&secret["type"].as_str().unwrap_or("")),
                "{chart}: {secret}"
            );
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}

/// The value of `--<flag>=` among a container's args.
fn flag(container: &Value, flag: &str) -> Option<String> {
    let prefix = format!("--{flag}=");
    strings(&container["args"])
        .into_iter()
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
}

/// A component serving a webhook keeps its serving pair and its CA in two Secrets the
/// chart makes (the serving one `kubernetes.io/tls`, the CA one `Opaque`, both empty), and
/// may only get and patch those two, by name, in its own namespace: no other Secret, no
/// other verb, nowhere else.
#[test]
fn a_webhook_gets_and_patches_only_its_two_certificate_secrets() {
    use kubeairunway_e2e::rbac;
    let Some(helm) = helm::require() else {
        return;
    };
    let release = "kubeairunway-system";
    let mut webhooks = 0;
    for chart in CHARTS {
        let objects = helm::template(&helm, &helm::chart(chart), &[]).unwrap();
        for deployment in helm::of_kind(&objects, "Deployment") {
            let pod = &deployment["spec"]["template"]["spec"];
            for container in pod["containers"].as_array().into_iter().flatten() {
                let Some(serving) = flag(container, "webhook-secret-name") else {
                    continue;
                };
                webhooks += 1;
                let ca = flag(container, "webhook-ca-secret-name")
                    .unwrap_or_else(|| panic!("{chart}: no --webhook-ca-secret-name"));
                assert_ne!(serving, ca, "{chart}");
                let secret = |name: &str| {
                    helm::of_kind(&objects, "Secret")
                        .into_iter()
                        .find(|s| s["metadata"]["name"] == name)
                        .unwrap_or_else(|| panic!("{chart}: the chart makes no Secret {name}"))
                };
                assert_eq!(secret(&serving)["type"], "kubernetes.io/tls", "{chart}");
                assert_eq!(secret(&ca)["type"], "Opaque", "{chart}");
                assert!(
                    secret(&ca)["data"]
                        .as_object()
                        .is_none_or(serde_json::Map::is_empty),
                    "{chart}: the CA Secret is made empty"
                );
                let account = pod["serviceAccountName"].as_str().unwrap();
                let rules: Vec<_> = rbac::granted_rules(&objects, release, account)
                    .into_iter()
                    .filter(|r| r.resources.iter().any(|x| x == "secrets" || x == "*"))
                    .collect();
                assert!(
                    !rules.is_empty(),
                    "{chart}: {account} cannot reach its Secrets"
                );
                for rule in rules {
                    let mut names = rule.resource_names.clone();
                    names.sort();
                    let mut want = vec![serving.clone(), ca.clone()];
                    want.sort();
                    assert_eq!(names, want, "{chart}: {}", rule.source);
                    assert_eq!(
                        rule.namespace.as_deref(),
                        Some(release),
                        "{chart}: {}",
                        rule.source
                    );
                    assert!(
                        rule.verbs.iter().all(|v| v == "get" || v == "patch"),
                        "{chart}: {} grants {:?}",
                        rule.source,
                        rule.verbs
                    );
                }
            }
        }
    }
    assert_eq!(webhooks, 2, "core and the kernel-cache webhook");
}
