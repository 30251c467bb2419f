//! Every chart against the conventions the charts share: each lints against its
//! `values.schema.json`, which refuses wrong types, unknown keys and more than one replica
//! without leader election; every container of every Deployment and DaemonSet runs a
//! binary of the platform's image (`image/binaries.txt`) whose real flag parser accepts the
//! chart's arguments, as rendered with the defaults and with the shared keys set; every
//! image is the one the release workflow publishes (`.github/workflows/release.yml`) under
//! the chart's appVersion; PodMonitors select their component's pods; the CRDs are
//! templates kept on uninstall; ModelDeployments join Kubernetes' admin, edit and view
//! roles.
//!
//! helm comes from `scripts/install-helm.sh` (run by `scripts/test.sh`); without it the
//! tests are skipped with a message, except in CI, where they fail.

use std::path::{Path, PathBuf};

use kubeairunway_e2e::helm;
use serde_json::{Value, json};

/// The charts that install something (the library chart renders nothing by itself).
const CHARTS: [&str; 6] = [
    "kubeairunway",
    "kaito-provider",
    "dynamo-provider",
    "kuberay-provider",
    "deployment-provider",
    "kernelcache-provider",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The binaries of the platform's image.
fn image_binaries() -> Vec<String> {
    std::fs::read_to_string(repo().join("image/binaries.txt"))
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// `--set` pairs that turn on every shared key of a workload under `prefix`.
fn shared_keys(prefix: &str) -> Vec<(String, String)> {
    [
        ("extraArgs[0]", "--pod-name=from-extra-args"),
        ("extraEnv[0].name", "EXTRA"),
        ("extraEnv[0].value", "on"),
        ("podLabels.team", "ml"),
        ("podAnnotations.note", "x"),
        ("nodeSelector.pool", "system"),
        ("tolerations[0].key", "dedicated"),
        ("tolerations[0].operator", "Exists"),
        ("resources.limits.cpu", "500m"),
        ("priorityClassName", "high"),
        ("metrics.port", "9090"),
        ("metrics.podMonitor.enabled", "true"),
        ("metrics.podMonitor.interval", "30s"),
    ]
    .into_iter()
    .map(|(k, v)| (format!("{prefix}{k}"), v.to_string()))
    .collect()
}

/// The workload prefixes of a chart: top level, or one per component.
fn workloads(chart: &str) -> Vec<&'static str> {
    if chart == "kernelcache-provider" {
        vec!["controller.", "agent.", "webhook.", "warmup."]
    } else {
        vec![""]
    }
}

fn render(helm: &Path, chart: &str, set: &[(String, String)]) -> anyhow::Result<Vec<Value>> {
    let set: Vec<(&str, &str)> = set.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    helm::template(helm, &helm::chart(chart), &set)
}

/// Parse `args` with the real flag parser of `binary`; the Downward API values the
/// charts give through the environment are passed as flags.
fn parse(binary: &str, container: &Value) -> Result<(), String> {
    use clap::Parser;
    let mut args = vec![binary.to_string()];
    args.extend(helm::args_with(container, &[]));
    // The CLI (the dashboard in the cluster) has no process runtime and no Downward API.
    if binary == "kubeairunway" {
        return kubeairunway_cli::Cli::try_parse_from(&args)
            .map(drop)
            .map_err(|e| format!("{binary} {args:?}: {e}"));
    }
    let env: Vec<&str> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str())
        .collect();
    for (var, flag) in [("POD_NAMESPACE", "--namespace"), ("POD_NAME", "--pod-name")] {
        assert!(env.contains(&var), "{binary}: the chart sets {var}");
        if !args.iter().any(|a| a.starts_with(&format!("{flag}="))) {
            args.push(format!("{flag}=from-downward-api"));
        }
    }
    if binary == "kernelcache-agent" {
        assert!(
            env.contains(&"NODE_NAME"),
            "the agent's node comes from NODE_NAME"
        );
        args.push("--node-name=node-1".into());
    }
    let result = match binary {
        "kubeairunway-controller" => kubeairunway_core::app::Cli::try_parse_from(&args).map(drop),
        "kaito-provider" => kubeairunway_kaito_provider::cli::Cli::try_parse_from(&args).map(drop),
        "dynamo-provider" => {
            kubeairunway_dynamo_provider::cli::Cli::try_parse_from(&args).map(drop)
        }
        "kuberay-provider" => {
            kubeairunway_kuberay_provider::cli::Cli::try_parse_from(&args).map(drop)
        }
        "deployment-provider" => {
            kubeairunway_deployment_provider::cli::Cli::try_parse_from(&args).map(drop)
        }
        "kernelcache-controller" => {
            kubeairunway_kernelcache_controller::app::Cli::try_parse_from(&args).map(drop)
        }
        "kernelcache-agent" => {
            kubeairunway_kernelcache_agent::app::Cli::try_parse_from(&args).map(drop)
        }
        "kernelcache-webhook" => {
            kubeairunway_kernelcache_webhook::app::Cli::try_parse_from(&args).map(drop)
        }
        "kernelcache-warmup" => {
            kubeairunway_kernelcache_warmup::app::Cli::try_parse_from(&args).map(drop)
        }
        other => panic!("no flag parser known for {other}: add it here"),
    };
    result.map_err(|e| format!("{binary} {args:?}: {e}"))
}

/// Every init container of every Deployment and DaemonSet, with its workload's name.
fn init_containers(objects: &[Value]) -> Vec<(String, &Value)> {
    pod_lists(objects, "initContainers")
}

/// Every container of every Deployment and DaemonSet, with its workload's name.
fn containers(objects: &[Value]) -> Vec<(String, &Value)> {
    pod_lists(objects, "containers")
}

/// The entries of the pod spec's list `field` of every Deployment and DaemonSet, with
/// its workload's name.
fn pod_lists<'a>(objects: &'a [Value], field: &'a str) -> Vec<(String, &'a Value)> {
    objects
        .iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("Deployment" | "DaemonSet")))
        .flat_map(|o| {
            let name = o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            o["spec"]["template"]["spec"][field]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |c| (name.clone(), c))
        })
        .collect()
}

#[test]
fn every_container_of_every_chart_runs_an_image_binary_that_accepts_its_flags() {
    let Some(helm) = helm::require() else { return };
    let binaries = image_binaries();
    let mut seen = std::collections::BTreeSet::new();
    for chart in CHARTS {
        helm::lint(&helm, &helm::chart(chart)).unwrap();
        let all_set: Vec<(String, String)> =
            workloads(chart).into_iter().flat_map(shared_keys).collect();
        let mut cases = vec![("defaults", Vec::new()), ("shared keys set", all_set)];
        if chart == "kubeairunway" {
            cases.push((
                "dashboard on",
                vec![
                    ("dashboard.enabled".to_string(), "true".to_string()),
                    ("dashboard.allowedHosts[0]".into(), "ai.example.com".into()),
                    ("dashboard.offline".into(), "true".into()),
                ],
            ));
        }
        for (case, set) in cases {
            let objects = render(&helm, chart, &set).unwrap();
            // Init containers run image binaries too, with flags their parser accepts.
            for (workload, init) in init_containers(&objects) {
                let command = init["command"][0].as_str().unwrap_or_default();
                let binary = command.strip_prefix('/').unwrap_or(command);
                assert!(
                    binaries.iter().any(|b| b == binary),
                    "{chart} {workload}: init command {command} is not a binary of the image"
                );
                seen.insert(binary.to_string());
                let mut args = vec![binary.to_string()];
                args.extend(helm::args_with(init, &[]));
                let parsed = match binary {
                    "kernelcache-own-roots" => {
                        <kubeairunway_kernelcache_agent::owner::Cli as clap::Parser>::try_parse_from(&args)
                            .map(drop)
                    }
                    other => panic!("no flag parser known for the init binary {other}: add it here"),
                };
                if let Err(e) = parsed {
                    panic!("{chart} {workload}: {binary} refuses the chart's flags {args:?}: {e}");
                }
            }
            let found = containers(&objects);
            assert!(!found.is_empty(), "{chart}: no workload rendered");
            for (workload, container) in found {
                let command = container["command"][0].as_str().unwrap_or_default();
                let binary = command.strip_prefix('/').unwrap_or(command);
                assert!(
                    binaries.iter().any(|b| b == binary),
                    "{chart} {workload}: command {command} is not a binary of the image ({binaries:?})"
                );
                seen.insert(binary.to_string());
                if let Err(e) = parse(binary, container) {
                    panic!(
                        "{chart} {workload} ({case}): the binary refuses the chart's flags: {e}"
                    );
                }
                if case == "shared keys set" {
                    let args = helm::args_with(container, &[]);
                    assert_eq!(
                        args.last().map(String::as_str),
                        Some("--pod-name=from-extra-args"),
                        "{chart} {workload}: extraArgs come last"
                    );
                    assert!(
                        args.contains(&"--metrics-bind-address=0.0.0.0:9090".to_string()),
                        "{chart} {workload}: metrics.port"
                    );
                    assert!(
                        container["env"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|e| e["name"] == "EXTRA"),
                        "{chart} {workload}: extraEnv"
                    );
                    assert_eq!(container["resources"]["limits"]["cpu"], "500m");
                }
            }
        }
        // A flag the binary does not know fails the same check.
        let prefix = workloads(chart)[0];
        let objects = render(
            &helm,
            chart,
            &[(format!("{prefix}extraArgs[0]"), "--no-such-flag=1".into())],
        )
        .unwrap();
        let (workload, container) = containers(&objects)
            .into_iter()
            .find(|(_, c)| helm::args_with(c, &[]).contains(&"--no-such-flag=1".to_string()))
            .unwrap();
        let binary = container["command"][0]
            .as_str()
            .unwrap()
            .trim_start_matches('/');
        assert!(
            parse(binary, container).is_err(),
            "{chart} {workload}: an unknown flag must be refused"
        );
    }
    let unused: Vec<&String> = binaries
        .iter()
        .filter(|b| !seen.contains(*b) && *b != "kernelcache-seed")
        .collect();
    assert!(unused.is_empty(), "binaries no chart runs: {unused:?}");
}

/// The image and tag the release workflow publishes for a version tag `v<version>`, by
/// running the workflow's own version script.
fn released_image(version: &str) -> String {
    let workflow: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join(".github/workflows/release.yml")).unwrap(),
    )
    .unwrap();
    let image = workflow["env"]["IMAGE"]
        .as_str()
        .expect("release.yml sets env.IMAGE");
    let out = std::process::Command::new("bash")
        .arg(repo().join("scripts/release-version.sh"))
        .arg(format!("v{version}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/release-version.sh v{version}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tag = String::from_utf8(out.stdout).unwrap().trim().to_string();
    format!("{image}:{tag}")
}

#[test]
fn every_chart_renders_the_image_the_release_publishes() {
    let Some(helm) = helm::require() else { return };
    // This crate's version is the workspace's (version.workspace = true).
    let version = env!("CARGO_PKG_VERSION");
    let expected = released_image(version);
    for chart in CHARTS.iter().chain(&["kubeairunway-lib"]) {
        let meta: Value = serde_saphyr::from_str(
            &std::fs::read_to_string(helm::chart(chart).join("Chart.yaml")).unwrap(),
        )
        .unwrap();
        assert_eq!(meta["version"], version, "{chart} version");
        assert_eq!(meta["appVersion"], version, "{chart} appVersion");
        assert_eq!(meta["kubeVersion"], ">=1.31.0-0", "{chart} kubeVersion");
        for key in ["home", "sources", "maintainers"] {
            assert!(!meta[key].is_null(), "{chart}: Chart.yaml has no {key}");
        }
        if *chart == "kubeairunway-lib" {
            assert_eq!(meta["type"], "library");
            continue;
        }
        assert!(
            helm::chart(chart).join("templates/NOTES.txt").is_file(),
            "{chart} NOTES.txt"
        );
        let objects = render(&helm, chart, &[]).unwrap();
        let mut images = Vec::new();
        for (_, c) in containers(&objects) {
            images.push(c["image"].as_str().unwrap().to_string());
            // The kernel-cache webhook adds the same image's seed to serving pods.
            if let Some(seed) = helm::args_with(c, &[])
                .iter()
                .find_map(|a| a.strip_prefix("--seed-image="))
            {
                images.push(seed.to_string());
            }
        }
        assert!(!images.is_empty());
        for image in images {
            assert_eq!(image, expected, "{chart}: not the released image");
        }
    }
}

/// A chart, the `--set` pairs, and what the schema error names.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

#[test]
fn schemas_refuse_wrong_types_unknown_keys_and_replicas_without_leader_election() {
    let Some(helm) = helm::require() else { return };
    let cases: &[Case] = &[
        (
            "dynamo-provider",
            &[("replicaCount", "2"), ("leaderElection.enabled", "false")],
            "leaderElection/enabled",
        ),
        (
            "kubeairunway",
            &[("leaderElection.enabled", "false")],
            "leaderElection/enabled",
        ),
        (
            "kernelcache-provider",
            &[
                ("controller.replicaCount", "3"),
                ("controller.leaderElection.enabled", "false"),
            ],
            "leaderElection/enabled",
        ),
        (
            "kaito-provider",
            &[("replicaCount", "many")],
            "replicaCount",
        ),
        ("kuberay-provider", &[("resources.limit.cpu", "1")], "limit"),
        (
            "deployment-provider",
            &[("engineImages.llama", "my/llama:1")],
            "llama",
        ),
        (
            "kaito-provider",
            &[("nodeProvisioning.mode", "manual")],
            "nodeProvisioning/mode",
        ),
        (
            "kernelcache-provider",
            &[("agent.metricsPort", "8080")],
            "metricsPort",
        ),
        ("kubeairunway", &[("logFormat", "yaml")], "logFormat"),
        ("dynamo-provider", &[("image.digest", "latest")], "digest"),
    ];
    for (chart, set, needle) in cases {
        let err = helm::template(&helm, &helm::chart(chart), set)
            .expect_err(&format!("{chart} {set:?} must be refused"))
            .to_string();
        assert!(
            err.contains("values don't meet the specifications of the schema")
                && err.contains(needle),
            "{chart} {set:?}: {err}"
        );
    }
    // The same keys with good values are accepted.
    helm::template(
        &helm,
        &helm::chart("dynamo-provider"),
        &[("replicaCount", "2")],
    )
    .unwrap();
    helm::template(
        &helm,
        &helm::chart("kernelcache-provider"),
        &[
            ("plainHttpRegistries[0]", "mirror:5000"),
            ("controller.replicaCount", "2"),
        ],
    )
    .unwrap();
}

#[test]
fn plain_http_and_allowed_registries_reach_the_controller_and_the_agent() {
    let Some(helm) = helm::require() else { return };
    let objects = helm::template(
        &helm,
        &helm::chart("kernelcache-provider"),
        &[
            ("plainHttpRegistries[0]", "mirror:5000"),
            ("allowedRegistries[0]", "mirror:5000"),
            ("allowedRegistries[1]", "ghcr.io/acme"),
        ],
    )
    .unwrap();
    for (workload, container) in containers(&objects) {
        let args = helm::args_with(container, &[]);
        let has = |flag: &str| args.contains(&flag.to_string());
        // The webhook and the warmup controller never speak to a registry (kubelets
        // pull the images of the pods they make).
        let expected = workload.ends_with("-controller") || workload.ends_with("-agent");
        for flag in [
            "--plain-http-registry=mirror:5000",
            "--allowed-registry=mirror:5000",
            "--allowed-registry=ghcr.io/acme",
        ] {
            assert_eq!(has(flag), expected, "{workload}: {flag}");
        }
    }
}

#[test]
fn pod_monitors_select_their_components_pods_and_metrics_port() {
    let Some(helm) = helm::require() else { return };
    for chart in CHARTS {
        let set: Vec<(String, String)> = workloads(chart)
            .into_iter()
            .map(|p| (format!("{p}metrics.podMonitor.enabled"), "true".to_string()))
            .collect();
        let objects = render(&helm, chart, &set).unwrap();
        let monitors = helm::of_kind(&objects, "PodMonitor");
        let pods: Vec<&Value> = objects
            .iter()
            .filter(|o| matches!(o["kind"].as_str(), Some("Deployment" | "DaemonSet")))
            .collect();
        assert_eq!(
            monitors.len(),
            pods.len(),
            "{chart}: one PodMonitor per workload"
        );
        for monitor in monitors {
            let selector = monitor["spec"]["selector"]["matchLabels"]
                .as_object()
                .unwrap();
            let matching: Vec<&&Value> = pods
                .iter()
                .filter(|p| {
                    let labels = &p["spec"]["template"]["metadata"]["labels"];
                    selector.iter().all(|(k, v)| &labels[k] == v)
                })
                .collect();
            assert_eq!(
                matching.len(),
                1,
                "{chart}: {selector:?} selects one workload"
            );
            let port = &monitor["spec"]["podMetricsEndpoints"][0]["port"];
            assert!(
                matching[0]["spec"]["template"]["spec"]["containers"][0]["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| &p["name"] == port),
                "{chart}: port {port}"
            );
        }
        assert!(helm::of_kind(&render(&helm, chart, &[]).unwrap(), "PodMonitor").is_empty());
    }
}

/// Each chart that serves a webhook can fence it with a NetworkPolicy: ingress to the
/// webhook's pods only from the API server's peers to the webhook port, and from the
/// metrics peers to the metrics port; the peers are the operator's (no policy by default,
/// none without them).
#[test]
fn webhook_network_policies_admit_only_the_api_server_and_the_metrics_peers() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let Some(helm) = helm::require() else { return };
    let api_server = json!({"ipBlock": {"cidr": "10.0.0.0/24"}});
    let scraper = json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}});
    for (chart, prefix, workload) in [
        ("kubeairunway", "", "Deployment"),
        ("kernelcache-provider", "webhook.", "Deployment"),
    ] {
        let values = |key: &str| format!("{prefix}{key}");
        assert!(
            helm::of_kind(&render(&helm, chart, &[]).unwrap(), "NetworkPolicy").is_empty(),
            "{chart}: none by default"
        );
        let without_peers = render(
            &helm,
            chart,
            &[(values("networkPolicy.enabled"), "true".into())],
        )
        .unwrap_err();
        assert!(
            format!("{without_peers:#}").contains("networkPolicy.apiServer"),
            "{chart}: {without_peers:#}"
        );
        let objects = render(
            &helm,
            chart,
            &[
                (values("networkPolicy.enabled"), "true".into()),
                (values("networkPolicy.apiServer[0].ipBlock.cidr"), "10.0.0.0/24".into()),
                (
                    values("networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name"),
                    "monitoring".into(),
                ),
            ],
        )
        .unwrap();
        let policies = helm::of_kind(&objects, "NetworkPolicy");
        assert_eq!(policies.len(), 1, "{chart}");
        let policy: NetworkPolicy = serde_json::from_value(policies[0].clone()).unwrap();
        let spec = policy.spec.unwrap();
        // It selects exactly the pods that serve the webhook.
        let selector = spec.pod_selector.unwrap().match_labels.unwrap();
        let selected: Vec<&Value> = objects
            .iter()
            .filter(|o| o["kind"] == workload)
            .filter(|o| {
                let labels = &o["spec"]["template"]["metadata"]["labels"];
                selector.iter().all(|(k, v)| labels[k] == *v)
            })
            .collect();
        assert_eq!(selected.len(), 1, "{chart}: {selector:?}");
        let ports = &selected[0]["spec"]["template"]["spec"]["containers"][0]["ports"];
        let port_of = |wanted: &[&str]| {
            ports
                .as_array()
                .unwrap()
                .iter()
                .find(|p| wanted.contains(&p["name"].as_str().unwrap_or_default()))
                .map(|p| p["containerPort"].clone())
                .unwrap()
        };
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        let ingress: Vec<(Value, Value)> = spec
            .ingress
            .unwrap()
            .into_iter()
            .map(|rule| {
                let ports = rule.ports.unwrap();
                assert_eq!(ports.len(), 1, "{chart}");
                (
                    serde_json::to_value(rule.from.unwrap()).unwrap(),
                    serde_json::to_value(&ports[0].port).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            ingress,
            [
                (json!([api_server]), port_of(&["webhook", "https"])),
                (json!([scraper]), port_of(&["metrics"])),
            ],
            "{chart}"
        );
    }
}

#[test]
fn crds_are_templates_kept_on_uninstall() {
    let Some(helm) = helm::require() else { return };
    for (chart, count) in [
        ("kubeairunway", 2),
        (
            "kernelcache-provider",
            kubeairunway_kernelcache_api::crds().len(),
        ),
    ] {
        let objects = helm::template(&helm, &helm::chart(chart), &[]).unwrap();
        let crds = helm::of_kind(&objects, "CustomResourceDefinition");
        assert_eq!(crds.len(), count, "{chart}");
        for crd in crds {
            assert_eq!(
                crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
                "{chart}"
            );
        }
        assert!(
            !helm::chart(chart).join("crds").exists(),
            "{chart}: no crds/ (never upgraded)"
        );
        let objects =
            helm::template(&helm, &helm::chart(chart), &[("crds.install", "false")]).unwrap();
        assert!(helm::of_kind(&objects, "CustomResourceDefinition").is_empty());
    }
}

#[test]
fn model_deployments_join_the_default_admin_edit_and_view_roles() {
    let Some(helm) = helm::require() else { return };
    let objects = helm::template(&helm, &helm::chart("kubeairunway"), &[]).unwrap();
    let aggregated = |role: &str| {
        helm::of_kind(&objects, "ClusterRole")
            .into_iter()
            .find(|r| {
                r["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{role}")]
                    == "true"
            })
            .unwrap_or_else(|| panic!("no ClusterRole aggregated to {role}"))
    };
    let verbs = |role: &Value, resource: &str| -> Vec<String> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == resource)
            })
            .flat_map(|r| {
                r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
            })
            .collect()
    };
    for role in ["admin", "edit"] {
        let r = aggregated(role);
        for verb in ["create", "update", "patch", "delete"] {
            assert!(
                verbs(r, "modeldeployments").iter().any(|v| v == verb),
                "{role} {verb}"
            );
            assert!(
                verbs(r, "modeldeployments/scale").iter().any(|v| v == verb),
                "{role} scale {verb}"
            );
        }
        assert_eq!(
            verbs(r, "modeldeployments/status"),
            ["get"],
            "{role}: status is the controllers'"
        );
    }
    let view = aggregated("view");
    for resource in [
        "modeldeployments",
        "modeldeployments/status",
        "modeldeployments/scale",
    ] {
        assert_eq!(
            verbs(view, resource),
            ["get", "list", "watch"],
            "view {resource}"
        );
    }
    let objects = helm::template(
        &helm,
        &helm::chart("kubeairunway"),
        &[("rbac.aggregateToDefaultRoles", "false")],
    )
    .unwrap();
    assert_eq!(helm::of_kind(&objects, "ClusterRole").len(), 1);
}

/// A webhook told to answer only the API server (`webhook.clientCaConfigMap`): the
/// ConfigMap's `ca.crt` is mounted read-only and passed as `--webhook-client-ca-file`,
/// which the binary accepts; without the value, neither (webhook_client_auth.rs tests the
/// handshake itself).
#[test]
fn a_webhook_client_ca_is_mounted_and_passed_when_named() {
    let Some(helm) = helm::require() else { return };
    for chart in ["kubeairunway", "kernelcache-provider"] {
        let set = [(
            "webhook.clientCaConfigMap".to_string(),
            "apiserver-webhook-client-ca".to_string(),
        )];
        let objects = render(&helm, chart, &set).unwrap();
        let deployment = objects
            .iter()
            .find(|o| {
                o["kind"] == "Deployment" && o.to_string().contains("--webhook-client-ca-file=")
            })
            .unwrap_or_else(|| panic!("{chart}: no webhook Deployment with the flag"));
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let flag = helm::args_with(container, &[])
            .into_iter()
            .find_map(|a| {
                a.strip_prefix("--webhook-client-ca-file=")
                    .map(str::to_string)
            })
            .unwrap();
        let mount = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "webhook-client-ca")
            .unwrap();
        assert_eq!(mount["readOnly"], true);
        assert_eq!(
            format!("{}/ca.crt", mount["mountPath"].as_str().unwrap()),
            flag,
            "{chart}: the flag names the mounted file"
        );
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "webhook-client-ca")
            .unwrap();
        assert_eq!(
            volume["configMap"]["name"], "apiserver-webhook-client-ca",
            "{chart}"
        );
        let command = container["command"][0].as_str().unwrap();
        parse(command.trim_start_matches('/'), container)
            .unwrap_or_else(|e| panic!("{chart}: {e}"));
        let defaults = render(&helm, chart, &[]).unwrap();
        assert!(
            !serde_json::to_string(&defaults)
                .unwrap()
                .contains("webhook-client-ca"),
            "{chart}: nothing without the value"
        );
    }
}
