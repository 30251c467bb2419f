//! What a custom action's pod may do. The warmup controller creates it with its own
//! identity, in the Warmup's namespace, on every node the target reaches: without a
//! policy, anyone who may write a Warmup (or a ModelDeployment's inline `spec.warmup`)
//! could run a privileged pod with the node's namespaces and disk on every GPU node, and
//! admission policies keyed on the user would never see it. So a pod template is held to
//! the rules of the Pod Security Standards' `baseline` profile that keep a pod off its
//! node (host namespaces, privileged containers, capabilities beyond the default set,
//! hostPath volumes, host ports, unmasked `/proc`, unsafe sysctls, Windows host
//! processes), may not name a node or a service account of its own, and may not carry
//! the labels the platform's controllers select by. The cluster operator can allow more:
//! privileged custom actions, hostPath prefixes, service accounts ([`Policy`]).
//!
//! Checked when the Warmup is resolved: a template that breaks a rule fails the Warmup
//! (`InvalidSpec`) naming every rule it breaks, and no pod is created.

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, SecurityContext};

/// Label prefixes and labels of the platform's own: serving pods are found by
/// `kubeairunway.ai/model-deployment` (and injected with caches by it), warmup pods by
/// `cache.kubeairunway.ai/warmup-uid` (and deleted by it).
const RESERVED_LABEL_DOMAINS: [&str; 3] = [
    "kubeairunway.ai/",
    "cache.kubeairunway.ai/",
    "kernelcache.kubeairunway.ai/",
];
const RESERVED_LABELS: [&str; 1] = ["app.kubernetes.io/managed-by"];

/// Capabilities the `baseline` profile lets a container add (the container runtime's
/// default set).
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Sysctls the `baseline` profile allows (namespaced, safe).
const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// What the cluster operator allows custom actions beyond the `baseline` rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Host namespaces, privileged containers, any capability, host ports, unmasked
    /// `/proc`, any sysctl and any hostPath: a custom action as privileged as its
    /// template says (`--allow-privileged-custom-actions`).
    pub privileged: bool,
    /// hostPath volumes under these paths (`--custom-action-host-path`).
    pub host_paths: Vec<String>,
    /// Service accounts a custom pod may run as besides its namespace's `default`
    /// (`--custom-action-service-account`).
    pub service_accounts: Vec<String>,
}

/// Every rule `template` breaks under `policy` (empty: it may run), each naming its field.
pub fn violations(template: &PodTemplateSpec, policy: &Policy) -> Vec<String> {
    let mut out = Vec::new();
    for key in template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .into_iter()
        .flat_map(|l| l.keys())
    {
        if RESERVED_LABELS.contains(&key.as_str())
            || RESERVED_LABEL_DOMAINS.iter().any(|d| key.starts_with(d))
        {
            out.push(format!(
                "metadata.labels[{key}]: a label the platform's controllers select by"
            ));
        }
    }
    let Some(spec) = &template.spec else {
        return out;
    };
    pod_rules(spec, policy, &mut out);
    let none = Vec::new();
    let containers = [
        ("containers", &spec.containers),
        (
            "initContainers",
            spec.init_containers.as_ref().unwrap_or(&none),
        ),
    ];
    for (field, list) in containers {
        for (i, c) in list.iter().enumerate() {
            container_rules(&format!("spec.{field}[{i}]"), c, policy, &mut out);
        }
    }
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let path = format!("spec.ephemeralContainers[{i}]");
        security_rules(&path, c.security_context.as_ref(), policy, &mut out);
    }
    out
}

fn pod_rules(spec: &PodSpec, policy: &Policy, out: &mut Vec<String>) {
    if spec.node_name.is_some() {
        out.push("spec.nodeName: the warmup chooses each pod's node".into());
    }
    let account = spec
        .service_account_name
        .as_deref()
        .or(spec.service_account.as_deref());
    if let Some(account) = account
        && account != "default"
        && !policy.service_accounts.iter().any(|a| a == account)
    {
        out.push(format!(
            "spec.serviceAccountName: {account} (custom actions run as their namespace's default service account unless the cluster operator allows another)"
        ));
    }
    if policy.privileged {
        return;
    }
    for (field, on) in [
        ("hostNetwork", spec.host_network),
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
    ] {
        if on == Some(true) {
            out.push(format!("spec.{field}: the node's namespaces"));
        }
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if let Some(host) = &v.host_path
            && !under_allowed(&host.path, &policy.host_paths)
        {
            out.push(format!(
                "spec.volumes[{i}].hostPath: {} (the node's disk; allowed: {})",
                host.path,
                if policy.host_paths.is_empty() {
                    "none".to_string()
                } else {
                    policy.host_paths.join(", ")
                }
            ));
        }
    }
    for (i, s) in spec
        .security_context
        .iter()
        .flat_map(|s| s.sysctls.iter().flatten())
        .enumerate()
    {
        if !SAFE_SYSCTLS.contains(&s.name.as_str()) {
            out.push(format!(
                "spec.securityContext.sysctls[{i}]: {} is not a safe sysctl",
                s.name
            ));
        }
    }
    if spec
        .security_context
        .as_ref()
        .and_then(|s| s.windows_options.as_ref())
        .and_then(|w| w.host_process)
        == Some(true)
    {
        out.push("spec.securityContext.windowsOptions.hostProcess: a host process".into());
    }
}

fn container_rules(path: &str, c: &Container, policy: &Policy, out: &mut Vec<String>) {
    security_rules(path, c.security_context.as_ref(), policy, out);
    if policy.privileged {
        return;
    }
    for (i, p) in c.ports.iter().flatten().enumerate() {
        if p.host_port.is_some_and(|h| h != 0) {
            out.push(format!("{path}.ports[{i}].hostPort: a port of the node"));
        }
    }
}

fn security_rules(
    path: &str,
    security: Option<&SecurityContext>,
    policy: &Policy,
    out: &mut Vec<String>,
) {
    let Some(s) = security else {
        return;
    };
    if policy.privileged {
        return;
    }
    if s.privileged == Some(true) {
        out.push(format!(
            "{path}.securityContext.privileged: a privileged container"
        ));
    }
    for cap in s.capabilities.iter().flat_map(|c| c.add.iter().flatten()) {
        let bare = cap.trim_start_matches("CAP_");
        if !BASELINE_CAPABILITIES.contains(&bare) {
            out.push(format!(
                "{path}.securityContext.capabilities.add: {cap} is beyond the default set"
            ));
        }
    }
    if s.proc_mount.as_deref().is_some_and(|m| m != "Default") {
        out.push(format!(
            "{path}.securityContext.procMount: an unmasked /proc"
        ));
    }
    if s.windows_options.as_ref().and_then(|w| w.host_process) == Some(true) {
        out.push(format!(
            "{path}.securityContext.windowsOptions.hostProcess: a host process"
        ));
    }
}

/// Whether `path` is one of `allowed` or below one (by whole path components, so
/// `/data-evil` is not below `/data`, and `..` never climbs out).
fn under_allowed(path: &str, allowed: &[String]) -> bool {
    if path.split('/').any(|c| c == "..") {
        return false;
    }
    let path = path.trim_end_matches('/');
    allowed.iter().any(|a| {
        let a = a.trim_end_matches('/');
        !a.is_empty() && (path == a || path.strip_prefix(a).is_some_and(|r| r.starts_with('/')))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(value: serde_json::Value) -> PodTemplateSpec {
        serde_json::from_value(value).unwrap()
    }

    fn root_on_every_node() -> PodTemplateSpec {
        template(json!({
            "metadata": {"labels": {"kubeairunway.ai/model-deployment": "someone-elses",
                                     "cache.kubeairunway.ai/warmup-uid": "u", "team": "ml"}},
            "spec": {
                "hostPID": true, "hostNetwork": true, "hostIPC": true,
                "nodeName": "control-plane-1",
                "serviceAccountName": "cluster-admin-sa",
                "volumes": [{"name": "root", "hostPath": {"path": "/"}},
                            {"name": "ok", "emptyDir": {}}],
                "securityContext": {"sysctls": [{"name": "kernel.core_pattern", "value": "|/x"}]},
                "initContainers": [{"name": "i", "image": "x",
                                    "securityContext": {"capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}}}],
                "containers": [{"name": "c", "image": "x",
                                "ports": [{"containerPort": 80, "hostPort": 80}],
                                "securityContext": {"privileged": true, "procMount": "Unmasked"}}],
            },
        }))
    }

    #[test]
    fn a_pod_that_would_own_its_node_is_refused_naming_each_rule() {
        let found = violations(&root_on_every_node(), &Policy::default());
        let fields: Vec<&str> = found.iter().map(|v| v.split(':').next().unwrap()).collect();
        assert_eq!(
            fields,
            [
                "metadata.labels[cache.kubeairunway.ai/warmup-uid]",
                "metadata.labels[kubeairunway.ai/model-deployment]",
                "spec.nodeName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "spec.hostPID",
                "spec.hostIPC",
                "spec.volumes[0].hostPath",
                "spec.securityContext.sysctls[0]",
                "spec.containers[0].securityContext.privileged",
                "spec.containers[0].securityContext.procMount",
                "spec.containers[0].ports[0].hostPort",
                "spec.initContainers[0].securityContext.capabilities.add",
            ],
            "{found:#?}"
        );
        assert!(found[12].contains("SYS_ADMIN") && !found[12].contains("CHOWN"));
    }

    #[test]
    fn the_operator_can_allow_more_but_never_the_platforms_labels_or_a_node_name() {
        let privileged = Policy {
            privileged: true,
            host_paths: Vec::new(),
            service_accounts: vec!["cluster-admin-sa".into()],
        };
        let found = violations(&root_on_every_node(), &privileged);
        let fields: Vec<&str> = found.iter().map(|v| v.split(':').next().unwrap()).collect();
        assert_eq!(
            fields,
            [
                "metadata.labels[cache.kubeairunway.ai/warmup-uid]",
                "metadata.labels[kubeairunway.ai/model-deployment]",
                "spec.nodeName",
            ]
        );
    }

    #[test]
    fn a_plain_download_pod_runs_and_host_paths_are_allowed_by_whole_components() {
        let download = template(json!({
            "metadata": {"labels": {"team": "ml"}},
            "spec": {"restartPolicy": "Never",
                     "volumes": [{"name": "models", "hostPath": {"path": "/data/models/llama"}}],
                     "containers": [{"name": "c", "image": "hf-cli",
                                     "securityContext": {"runAsNonRoot": true,
                                                         "capabilities": {"add": ["CHOWN"], "drop": ["ALL"]}}}]},
        }));
        let allowed = Policy {
            host_paths: vec!["/data/models/".into()],
            ..Policy::default()
        };
        assert!(violations(&download, &allowed).is_empty());
        assert_eq!(violations(&download, &Policy::default()).len(), 1);
        assert!(!under_allowed(
            "/data/models-evil",
            &["/data/models".into()]
        ));
        assert!(!under_allowed(
            "/data/models/../../etc",
            &["/data/models".into()]
        ));
        assert!(under_allowed("/data/models", &["/data/models".into()]));
        assert!(!under_allowed("/anything", &[String::new()]));
    }
}
