//! The core Helm chart (`charts/kubeairunway`): `helm lint`, and the objects `helm
//! template` renders: least-privilege RBAC, the webhook configurations, the Deployment's
//! flags and the CRDs (the generated ones).
//!
//! helm comes from `scripts/install-helm.sh` (run by `scripts/test.sh`). Without it the
//! test is skipped with a message, except in CI (`CI=true`), where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn chart() -> PathBuf {
    kubeairunway_e2e::helm::chart("kubeairunway")
}

fn template(helm: &Path, args: &[&str]) -> Vec<Value> {
    let out = Command::new(helm)
        .args(["template", "kubeairunway"])
        .arg(chart())
        .args(["--namespace", "kubeairunway-system"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter().filter(Value::is_object).collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
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

fn arg(deployment: &Value, flag: &str) -> Option<String> {
    strings(&deployment["spec"]["template"]["spec"]["containers"][0]["args"])
        .into_iter()
        .find_map(|a| a.strip_prefix(&format!("--{flag}=")).map(str::to_string))
}

#[test]
fn core_chart_lints_and_renders_least_privilege_rbac_and_webhooks() {
    let Some(helm) = kubeairunway_e2e::helm::require() else {
        return;
    };
    kubeairunway_e2e::helm::lint(&helm, &chart()).unwrap();

    let docs = template(&helm, &[]);
    let deployment = find(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(
        arg(deployment, "enable-provider-selector").as_deref(),
        Some("true")
    );
    let secret = arg(deployment, "webhook-secret-name").unwrap();
    let ca_secret = arg(deployment, "webhook-ca-secret-name").unwrap();
    let lease = arg(deployment, "leader-elect-resource-name").unwrap();
    let service_name = arg(deployment, "webhook-service-name").unwrap();
    let vwc_name = arg(deployment, "validating-webhook-configuration").unwrap();
    let mwc_name = arg(deployment, "mutating-webhook-configuration").unwrap();
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();

    // ClusterRole: read our kinds, apply our status, events, our two webhook configs, and
    // ask SubjectAccessReviews (a custom action's author may create pods).
    let cluster_role = docs
        .iter()
        .find(|d| {
            d["kind"] == "ClusterRole" && d["metadata"]["name"] == deployment["metadata"]["name"]
        })
        .expect("core's ClusterRole");
    for rule in cluster_role["rules"].as_array().unwrap() {
        for key in ["apiGroups", "resources", "verbs"] {
            assert!(
                !strings(&rule[key]).contains(&"*".to_string()),
                "wildcard in {rule}"
            );
        }
        let resources = strings(&rule["resources"]);
        let verbs = strings(&rule["verbs"]);
        assert!(
            !resources.contains(&"secrets".to_string()),
            "cluster-wide secrets: {rule}"
        );
        for group in strings(&rule["apiGroups"]) {
            assert!(
                [
                    "kubeairunway.ai",
                    "events.k8s.io",
                    "admissionregistration.k8s.io",
                    "authorization.k8s.io",
                    // The gateway (docs/gateway.md): the Gateway API, GAIE, and the
                    // endpoint picker's objects.
                    "apiextensions.k8s.io",
                    "gateway.networking.k8s.io",
                    "inference.networking.k8s.io",
                    "inference.networking.x-k8s.io",
                    "",
                    "apps",
                    "rbac.authorization.k8s.io",
                ]
                .contains(&group.as_str()),
                "core needs no {group} (no provider knowledge): {rule}"
            );
        }
        // What the gateway only reads: CRDs, Gateways, pods and the x-k8s kinds (pods and
        // those kinds because the endpoint picker's Role grants them, and the API server
        // lets core grant only what it holds).
        let read_only = [
            "customresourcedefinitions",
            "gateways",
            "pods",
            "inferenceobjectives",
        ];
        if resources.iter().any(|r| read_only.contains(&r.as_str())) {
            assert!(
                verbs
                    .iter()
                    .all(|v| ["get", "list", "watch"].contains(&v.as_str())),
                "{rule}"
            );
        }
        if resources.iter().any(|r| r.ends_with("/status")) {
            assert_eq!(verbs, ["patch"], "{rule}");
        } else if strings(&rule["apiGroups"]) == ["authorization.k8s.io"] {
            assert_eq!(resources, ["subjectaccessreviews"], "{rule}");
            assert_eq!(verbs, ["create"], "{rule}");
        } else if resources == ["modeldeployments"] {
            // Finalizers of providers that never served or are gone.
            assert_eq!(verbs, ["patch"], "{rule}");
        } else if resources.contains(&"modeldeployments".to_string()) {
            assert_eq!(verbs, ["list", "watch"], "{rule}");
        }
        if resources
            .iter()
            .any(|r| r.ends_with("webhookconfigurations"))
        {
            let names = strings(&rule["resourceNames"]);
            assert!(
                names == [vwc_name.clone()] || names == [mwc_name.clone()],
                "{rule}"
            );
            assert_eq!(verbs, ["get", "patch"]);
        }
    }
    let binding = docs
        .iter()
        .find(|d| {
            d["kind"] == "ClusterRoleBinding"
                && d["metadata"]["name"] == deployment["metadata"]["name"]
        })
        .expect("core's ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["name"], sa);
    assert_eq!(binding["subjects"][0]["namespace"], "kubeairunway-system");

    // Role: the two Secrets, serving pair and CA (made by the chart: get and patch them by
    // name, never create) and
    // the one Lease (create cannot be named; get and update by name).
    let role = find(&docs, "Role");
    assert_eq!(role["metadata"]["namespace"], "kubeairunway-system");
    for rule in role["rules"].as_array().unwrap() {
        let verbs = strings(&rule["verbs"]);
        let resources = strings(&rule["resources"]);
        if verbs == ["create"] {
            assert!(rule.get("resourceNames").is_none());
            assert_eq!(resources, ["leases"], "{rule}");
            continue;
        }
        let names = strings(&rule["resourceNames"]);
        match resources.as_slice() {
            [r] if r == "secrets" => {
                assert_eq!(verbs, ["get", "patch"], "{rule}");
                assert_eq!(names, [secret.clone(), ca_secret.clone()]);
            }
            [r] if r == "leases" => {
                assert_eq!(verbs, ["get", "update"], "{rule}");
                assert_eq!(names, std::slice::from_ref(&lease));
            }
            other => panic!("unexpected namespaced rule for {other:?}"),
        }
    }

    // Webhooks: our Service and paths, Fail for validation, CA bundle left to the controller.
    let service = find(&docs, "Service");
    assert_eq!(service["metadata"]["name"], service_name.as_str());
    let vwc = find(&docs, "ValidatingWebhookConfiguration");
    let mwc = find(&docs, "MutatingWebhookConfiguration");
    assert_eq!(vwc["metadata"]["name"], vwc_name.as_str());
    assert_eq!(mwc["metadata"]["name"], mwc_name.as_str());
    for (cfg, path) in [
        (vwc, "/validate-modeldeployment"),
        (mwc, "/mutate-modeldeployment"),
    ] {
        let hook = &cfg["webhooks"][0];
        assert_eq!(
            hook["clientConfig"]["service"]["name"],
            service_name.as_str()
        );
        assert_eq!(
            hook["clientConfig"]["service"]["namespace"],
            "kubeairunway-system"
        );
        assert_eq!(hook["clientConfig"]["service"]["path"], path);
        assert!(hook["clientConfig"].get("caBundle").is_none());
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["admissionReviewVersions"], serde_json::json!(["v1"]));
        assert_eq!(
            hook["rules"][0]["resources"],
            serde_json::json!(["modeldeployments"])
        );
    }
    // Both fail closed; creations are validated by the mutating webhook (called again
    // after later mutations), the validating one checks changes of the spec, and
    // creations too when asked.
    assert_eq!(vwc["webhooks"][0]["failurePolicy"], "Fail");
    assert_eq!(mwc["webhooks"][0]["failurePolicy"], "Fail");
    assert_eq!(mwc["webhooks"][0]["reinvocationPolicy"], "IfNeeded");
    assert_eq!(
        mwc["webhooks"][0]["rules"][0]["operations"],
        serde_json::json!(["CREATE", "UPDATE"])
    );
    assert_eq!(
        vwc["webhooks"][0]["rules"][0]["operations"],
        serde_json::json!(["UPDATE"])
    );
    let both = template(&helm, &["--set", "webhook.validateCreations=true"]);
    assert_eq!(
        find(&both, "ValidatingWebhookConfiguration")["webhooks"][0]["rules"][0]["operations"],
        serde_json::json!(["CREATE", "UPDATE"])
    );

    // Two replicas: a disruption budget keeps one serving the webhooks.
    let pdb = find(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let single = template(&helm, &["--set", "replicaCount=1"]);
    assert!(single.iter().all(|d| d["kind"] != "PodDisruptionBudget"));

    // Values flow into the flags.
    let docs = template(
        &helm,
        &["--set", "enableProviderSelector=false,replicaCount=3"],
    );
    let deployment = find(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        arg(deployment, "enable-provider-selector").as_deref(),
        Some("false")
    );

    // The chart's CRDs are the generated ones.
    let docs = template(&helm, &["--include-crds"]);
    let mut crds: Vec<String> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    crds.sort();
    assert_eq!(
        crds,
        [
            "inferenceproviderconfigs.kubeairunway.ai",
            "modeldeployments.kubeairunway.ai"
        ]
    );
}
