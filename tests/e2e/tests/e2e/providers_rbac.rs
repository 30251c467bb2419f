//! Least privilege, measured, for the four provider charts (KAITO, Dynamo, KubeRay and the
//! Deployment provider). Each provider runs in-process with the flags its chart renders,
//! under the chart's service account (the API server's audit log records its requests
//! under that user), on one private cluster with the real upstream CRDs and the Warmup
//! CRD installed, the four at once. Each goes through its whole life: it registers and
//! heartbeats its InferenceProviderConfig, takes its leader-election Lease, serves a
//! ModelDeployment held by the warmup gate until the Warmup it makes for the inline
//! `spec.warmup` completes (read from the gate's Warmup watch), applies the upstream objects and writes the status, follows a
//! spec change, restores a directly edited upstream object twice (one event, then the
//! same event again: kube's recorder patches its series), and on deletion deletes the
//! upstream objects and its Warmup and removes its finalizer; on shutdown it releases the Lease. Then
//! its requests are matched against the RBAC its chart grants
//! (`kubeairunway_e2e::rbac`): every request must be allowed, and every granted verb used,
//! but for the grants in [`UNEXERCISED`], each with the path that needs it and why this
//! walk does not take it. KAITO's walk runs under its chart's ValidatingAdmissionPolicies
//! on ConfigMaps and on what it renders, and the Deployment provider's under its chart's
//! on Deployments and Services, enforced by the API server: none of their writes is
//! refused.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_e2e::{eventually, fixtures_dir, helm, rbac, read_crd};
use kubeairunway_sdk::api::{DeploymentWarmup, ModelDeployment};
use kubeairunway_sdk::conditions::{RESOURCE_CREATED, WARMED_UP, reasons};
use kubeairunway_sdk::runtime::ProviderFlags as _;
use kubeairunway_sdk::testing::{self, ModelDeploymentBuilder, TestCluster, condition};
use serde_json::{Value, json};

/// The namespace `helm template` renders the charts for.
const SYSTEM: &str = "kubeairunway-system";
/// How long each step may take (four providers share two cores in CI).
const WAIT: u64 = 90;

/// Grants no request of this walk uses, as `(chart, the grant as rbac::measure names it,
/// the path that needs it and why the walk does not take it)`.
///
/// A provider reads an object only when its first write (an apply that only creates)
/// finds the name taken, to tell one of its own from someone else's; the walk takes that
/// path for the primary kind, not for each supporting kind.
const TAKEN_NAME: &str = "the first write of an object whose name is taken reads it; the walk takes a name of the primary kind only";
const UNEXERCISED: &[(&str, &str, &str)] = &[
    (
        "deployment-provider",
        "ClusterRole release-deployment-provider: get [\"\"]/[\"services\"] names []",
        TAKEN_NAME,
    ),
    (
        "kaito-provider",
        "ClusterRole release-kaito-provider: get [\"\"]/[\"configmaps\"] names []",
        TAKEN_NAME,
    ),
    (
        "kaito-provider",
        "ClusterRole release-kaito-provider: get [\"\"]/[\"services\"] names []",
        TAKEN_NAME,
    ),
    (
        "kaito-provider",
        "ClusterRole release-kaito-provider: get [\"kaito.sh\"]/[\"workspaces\"] names []",
        "the first write of a Workspace whose name is taken reads it; the walk takes a name of the primary kind (an InferenceSet) only",
    ),
];

/// A ModelDeployment in a namespace.
type MdIn = fn(&str) -> ModelDeployment;

/// One provider chart and how the walk drives its provider.
struct Case {
    chart: &'static str,
    /// The provider's name (its InferenceProviderConfig).
    provider: &'static str,
    /// `--set` values a user installing it gives.
    values: &'static [(&'static str, &'static str)],
    /// The kind of the primary upstream object, named as the ModelDeployment.
    primary: ApiResource,
    /// The ModelDeployment it serves in the walk.
    md: MdIn,
    /// A change of the ModelDeployment's spec the provider must follow.
    update: fn(&mut ModelDeployment),
    /// A direct edit of the primary object (a merge patch of a field the provider renders).
    drift: Value,
    /// A second ModelDeployment served alongside the first, for a provider that renders
    /// another primary kind for some (its name, its primary kind).
    also: Option<(MdIn, ApiResource)>,
}

fn resource_of(crd: &CustomResourceDefinition) -> ApiResource {
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .expect("a storage version");
    ApiResource {
        group: crd.spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", crd.spec.group, version.name),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    }
}

fn upstream_crd(file: &str) -> CustomResourceDefinition {
    read_crd(&fixtures_dir().join("crds/upstream").join(file)).unwrap()
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            chart: "deployment-provider",
            provider: kubeairunway_deployment_provider::NAME,
            values: &[],
            primary: ApiResource::erase::<Deployment>(&()),
            md: |ns| ModelDeploymentBuilder::new("served").namespace(ns).build(),
            update: |md| md.spec.scaling.replicas = 2,
            drift: json!({"spec": {"replicas": 7}}),
            also: None,
        },
        Case {
            chart: "dynamo-provider",
            provider: kubeairunway_dynamo_provider::NAME,
            values: &[],
            primary: resource_of(&upstream_crd("nvidia.com_dynamographdeployments.yaml")),
            md: |ns| ModelDeploymentBuilder::new("served").namespace(ns).build(),
            update: |md| md.spec.scaling.replicas = 2,
            drift: json!({"spec": {"backendFramework": "sglang"}}),
            also: None,
        },
        Case {
            chart: "kaito-provider",
            provider: kubeairunway_kaito_provider::NAME,
            values: &[(
                "nodeProvisioning.gpuInstanceType",
                "Standard_NC24ads_A100_v4",
            )],
            // Two replicas: an InferenceSet, its Service and the vLLM inference ConfigMap.
            primary: resource_of(&upstream_crd("kaito.sh_inferencesets.yaml")),
            md: |ns| {
                ModelDeploymentBuilder::new("served")
                    .namespace(ns)
                    .replicas(2)
                    .build()
            },
            update: |md| {
                md.spec.scaling.replicas = 3;
                md.spec.engine.args = Some(BTreeMap::from([(
                    "max-model-len".to_string(),
                    "4096".to_string(),
                )]));
            },
            drift: json!({"spec": {"replicas": 7}}),
            // One replica: a Workspace.
            also: Some((
                |ns| ModelDeploymentBuilder::new("single").namespace(ns).build(),
                resource_of(&upstream_crd("kaito.sh_workspaces.yaml")),
            )),
        },
        Case {
            chart: "kuberay-provider",
            provider: kubeairunway_kuberay_provider::NAME,
            values: &[],
            primary: resource_of(&upstream_crd("ray.io_rayservices.yaml")),
            md: |ns| ModelDeploymentBuilder::new("served").namespace(ns).build(),
            update: |md| md.spec.scaling.replicas = 2,
            drift: json!({"spec": {"serveConfigV2": "applications: []\n"}}),
            also: None,
        },
    ]
}

/// Start the provider binary `chart` names, as its `main` does, with `args` on `client`,
/// until `stop`.
async fn start(
    chart: &str,
    args: &[String],
    client: Client,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    use clap::Parser;
    use kubeairunway_sdk::process::{Runtime, Shutdown};
    use kubeairunway_sdk::runtime::run;
    let rt = |process| {
        Runtime::with_client(
            chart,
            process,
            client.clone(),
            Shutdown::on(async {
                let _ = stop.await;
            }),
        )
    };
    match chart {
        "deployment-provider" => {
            let cli = kubeairunway_deployment_provider::cli::Cli::try_parse_from(args).unwrap();
            tokio::spawn(run(
                cli.flags.provider(),
                rt(cli.options.process.clone()),
                cli.options,
            ))
        }
        "dynamo-provider" => {
            let cli = kubeairunway_dynamo_provider::cli::Cli::try_parse_from(args).unwrap();
            tokio::spawn(run(
                cli.flags.provider(),
                rt(cli.options.process.clone()),
                cli.options,
            ))
        }
        "kaito-provider" => {
            let cli = kubeairunway_kaito_provider::cli::Cli::try_parse_from(args).unwrap();
            let provider = cli.flags.provider_for(&client).await.unwrap();
            tokio::spawn(run(provider, rt(cli.options.process.clone()), cli.options))
        }
        "kuberay-provider" => {
            let cli = kubeairunway_kuberay_provider::cli::Cli::try_parse_from(args).unwrap();
            tokio::spawn(run(
                cli.flags.provider(),
                rt(cli.options.process.clone()),
                cli.options,
            ))
        }
        other => panic!("no provider binary known for {other}"),
    }
}

/// The events.k8s.io Events `reason` about the ModelDeployment `name` in `ns`.
async fn events(admin: &Client, ns: &str, name: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(admin.clone(), ns);
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect()
}

/// The service account the provider of the rendered `chart` runs as, its command line
/// (the chart's flags, with timings short enough for a test, no metrics server, and the
/// Downward API values of its env as flags; its pod is `<chart>-0`), and its Lease.
fn provider_args(chart: &str, objects: &[Value]) -> (String, Vec<String>, String) {
    let deployment = helm::of_kind(objects, "Deployment")[0];
    let pod = &deployment["spec"]["template"]["spec"];
    let account = pod["serviceAccountName"].as_str().unwrap().to_string();
    let container = &pod["containers"][0];
    let mut args = vec![chart.to_string()];
    args.extend(helm::args_with(
        container,
        &[
            ("metrics-bind-address", String::new()),
            ("heartbeat-interval", "1s".into()),
            ("resync-period", "5s".into()),
            ("finalizer-timeout", "10s".into()),
        ],
    ));
    args.push(format!("--namespace={SYSTEM}"));
    args.push(format!("--pod-name={chart}-0"));
    let lease = args
        .iter()
        .find_map(|a| a.strip_prefix("--leader-elect-resource-name="))
        .unwrap_or_else(|| panic!("{chart}: the chart elects a leader"))
        .to_string();
    (account, args, lease)
}

/// Run `case`'s provider through its life; the chart's rules for its account and the
/// account's user name.
async fn walk(
    helm_bin: &std::path::Path,
    cluster: &TestCluster,
    admin: &Client,
    case: &Case,
) -> (Vec<rbac::Rule>, String) {
    let chart = case.chart;
    let objects = helm::template(helm_bin, &helm::chart(chart), case.values).unwrap();
    let (account, args, lease) = provider_args(chart, &objects);
    let pod_name = format!("{chart}-0");

    // The provider runs as its chart's service account, under the RBAC the chart grants it.
    let chart_identity =
        rbac::ChartIdentity::apply(cluster, admin, &objects, chart, SYSTEM, &account)
            .await
            .unwrap();
    let client = chart_identity.client(cluster).await.unwrap();
    // KAITO's chart fences the provider's ConfigMaps with an admission policy, enforced
    // before the provider starts: every ConfigMap write of its walk passes it.
    if chart == "kaito-provider" {
        super::kaito::enforce_configmap_policy(admin, &client, &objects, SYSTEM).await;
    }
    // Each provider's chart fences what it renders likewise.
    enforce_upstream_policy(admin, &client, &objects, chart).await;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let running = start(chart, &args, client, stopped).await;

    // Leader election, then registration and heartbeat.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), SYSTEM);
    eventually(
        WAIT,
        &format!("{chart} holds the Lease {lease}"),
        || async {
            let l = leases.get_opt(&lease).await.ok()??;
            (l.spec?.holder_identity? == pod_name).then_some(())
        },
    )
    .await
    .unwrap();
    testing::registered(admin, case.provider).await;

    // A ModelDeployment held by the warmup gate until its Warmup completes: an inline
    // spec.warmup, so the provider makes that Warmup (named after the ModelDeployment).
    let ns = cluster.namespace(case.provider);
    let mut md = (case.md)(&ns);
    let name = md.name_any();
    md.spec.provider.get_or_insert_with(Default::default).name = Some(case.provider.into());
    md.spec.warmup = Some(DeploymentWarmup::default());
    let warmups = Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        &ns,
        &ApiResource {
            group: DeploymentWarmup::GROUP.into(),
            version: DeploymentWarmup::VERSION.into(),
            api_version: format!("{}/{}", DeploymentWarmup::GROUP, DeploymentWarmup::VERSION),
            kind: DeploymentWarmup::KIND.into(),
            plural: DeploymentWarmup::PLURAL.into(),
        },
    );
    testing::deploy(admin, &md, case.provider).await.unwrap();
    let mds: Api<ModelDeployment> = Api::namespaced(admin.clone(), &ns);
    testing::md_where(admin, &ns, &name, "held by the warmup gate", |m| {
        condition(m, WARMED_UP).is_some_and(|c| c.reason == reasons::AWAITING_WARMUP)
    })
    .await;
    eventually(WAIT, &format!("{chart}: the Warmup made"), || async {
        warmups.get_opt(&name).await.ok().flatten()
    })
    .await
    .unwrap();
    let primaries = Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, &case.primary);
    assert!(
        primaries.get_opt(&name).await.unwrap().is_none(),
        "{chart}: nothing is applied before the Warmup completes"
    );
    // The warmup controller completes it.
    warmups
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Completed"}})),
        )
        .await
        .unwrap();
    let generation = || async {
        primaries
            .get_opt(&name)
            .await
            .ok()
            .flatten()
            .and_then(|o| o.metadata.generation)
    };
    let first = eventually(
        WAIT,
        &format!("{chart}: {} applied", case.primary.kind),
        || async { generation().await },
    )
    .await
    .unwrap();
    testing::md_where(admin, &ns, &name, "status written, warmed up", |m| {
        m.status.as_ref().is_some_and(|s| s.phase.is_some())
            && condition(m, WARMED_UP).is_some_and(|c| c.status == "True")
    })
    .await;

    // The other primary kind, if any (the Warmup has completed: no gate holds it).
    let also = match &case.also {
        Some((md, primary)) => {
            let mut md = md(&ns);
            md.spec.provider.get_or_insert_with(Default::default).name = Some(case.provider.into());
            md.spec.warmup = Some(DeploymentWarmup::named(name.clone()));
            testing::deploy(admin, &md, case.provider).await.unwrap();
            let api = Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, primary);
            let other = md.name_any();
            eventually(
                WAIT,
                &format!("{chart}: {} applied", primary.kind),
                || async { api.get_opt(&other).await.ok().flatten() },
            )
            .await
            .unwrap();
            Some((other, api))
        }
        None => None,
    };

    // A name someone else's object holds: the first apply only creates, so it fails;
    // the provider reads the object (`get`), finds it is not its own and leaves it alone.
    let taken = format!("{name}-taken");
    let mut theirs = primaries.get(&name).await.unwrap();
    theirs.metadata = ObjectMeta {
        name: Some(taken.clone()),
        namespace: Some(ns.clone()),
        ..ObjectMeta::default()
    };
    primaries
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    let mut other = (case.md)(&ns);
    other.metadata.name = Some(taken.clone());
    other
        .spec
        .provider
        .get_or_insert_with(Default::default)
        .name = Some(case.provider.into());
    testing::deploy(admin, &other, case.provider).await.unwrap();
    testing::md_where(admin, &ns, &taken, "refused: the name is taken", |m| {
        condition(m, RESOURCE_CREATED).is_some_and(|c| c.reason == reasons::RESOURCE_CONFLICT)
    })
    .await;
    let left = primaries.get(&taken).await.unwrap();
    assert!(
        left.owner_references().is_empty(),
        "{chart}: someone else's {} is left alone",
        case.primary.kind
    );
    mds.delete(&taken, &DeleteParams::default()).await.unwrap();

    // A spec change reaches the upstream object.
    let mut changed = md.clone();
    (case.update)(&mut changed);
    testing::deploy(admin, &changed, case.provider)
        .await
        .unwrap();
    let second = eventually(
        WAIT,
        &format!("{chart}: the spec change applied"),
        || async { generation().await.filter(|g| *g > first) },
    )
    .await
    .unwrap();

    // A direct edit is restored, twice: the same event twice is one event with a series.
    let drift = || async {
        primaries
            .patch(
                &name,
                &PatchParams {
                    field_manager: Some("drifter".into()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&case.drift),
            )
            .await
            .unwrap()
            .metadata
            .generation
            .unwrap()
    };
    // Edit until the event repeats (an event the API server refused, under load, is
    // not in the recorder's cache and is created anew the next time).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(WAIT);
    let mut last = second;
    for edits in 1.. {
        let edited = drift().await;
        assert!(edited > last, "{chart}: the edit changed the spec");
        last = eventually(WAIT, &format!("{chart}: edit {edits} restored"), || async {
            generation().await.filter(|g| *g > edited)
        })
        .await
        .unwrap();
        // The event is published before the object is restored.
        let repeated = events(admin, &ns, &name, "DriftDetected")
            .await
            .iter()
            .any(|e| e.series.as_ref().is_some_and(|s| s.count >= 2));
        if repeated {
            break;
        }
        assert!(
            edits < 2 || tokio::time::Instant::now() < deadline,
            "{chart}: DriftDetected never repeated as a series after {edits} edits"
        );
    }

    // Deletion: the upstream objects go, then the finalizer.
    let mut gone = vec![(name.clone(), primaries.clone())];
    gone.extend(also);
    for (name, primaries) in &gone {
        mds.delete(name, &DeleteParams::default()).await.unwrap();
        eventually(WAIT, &format!("{chart}: {name} gone"), || async {
            mds.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await
        .unwrap();
        assert!(
            primaries.get_opt(name).await.unwrap().is_none(),
            "{chart}: the upstream object of {name} is deleted before the finalizer goes"
        );
    }
    assert!(
        warmups.get_opt(&name).await.unwrap().is_none(),
        "{chart}: the Warmup made for the inline spec.warmup is deleted with its ModelDeployment"
    );

    let _ = stop.send(());
    running.await.unwrap().unwrap();
    let released = leases.get(&lease).await.unwrap().spec.unwrap();
    assert_eq!(
        released.holder_identity, None,
        "{chart}: the Lease is released on shutdown"
    );
    chart_identity.assert_none_refused();
    (
        rbac::granted_rules(&objects, SYSTEM, &account),
        kubeairunway_testcluster::service_account_user(SYSTEM, &account),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_charts_grant_what_the_providers_use_and_nothing_more() {
    let Some(helm_bin) = helm::require() else {
        return;
    };
    let mut crds: Vec<CustomResourceDefinition> = [
        "nvidia.com_dynamographdeployments.yaml",
        "kaito.sh_workspaces.yaml",
        "kaito.sh_inferencesets.yaml",
        "ray.io_rayservices.yaml",
    ]
    .iter()
    .map(|f| upstream_crd(f))
    .collect();
    crds.extend(kubeairunway_kernelcache_api::crds());
    let (cluster, admin) = testing::private_cluster("providers-rbac", &crds)
        .await
        .unwrap();
    cluster.ensure_namespace(SYSTEM);

    let cases = cases();
    let walked = futures::future::join_all(
        cases
            .iter()
            .map(|case| walk(&helm_bin, &cluster, &admin, case)),
    )
    .await;

    // The providers' requests, less the test's probe of KAITO's policy (made under the
    // provider's name).
    let audit: Vec<_> = cluster
        .audit_events()
        .unwrap()
        .into_iter()
        .filter(|e| {
            e.object_ref.as_ref().and_then(|r| r.name.as_deref())
                != Some(super::kaito::POLICY_PROBE)
                && e.object_ref.as_ref().and_then(|r| r.name.as_deref()) != Some(POLICY_PROBE)
        })
        .collect();
    let mut findings = Vec::new();
    for (case, (rules, user)) in cases.iter().zip(walked) {
        assert!(
            !rules.is_empty(),
            "{}: the chart binds its account",
            case.chart
        );
        // No write refused by an admission policy (the plugin answers 422, which the
        // 403 guard of rbac::ChartIdentity does not see).
        for e in audit.iter().filter(|e| {
            e.user.username == user && e.response_status.as_ref().is_some_and(|s| s.code == 422)
        }) {
            findings.push(format!(
                "{}: refused: {:?}",
                case.chart,
                rbac::Request::from_audit(e)
            ));
        }
        let measured = rbac::measure(&rules, &audit, &user);
        for denied in &measured.denied {
            findings.push(format!("{}: not allowed: {denied}", case.chart));
        }
        for unused in &measured.unused {
            if !UNEXERCISED
                .iter()
                .any(|(chart, grant, _)| *chart == case.chart && grant == unused)
            {
                findings.push(format!("{}: never used: {unused}", case.chart));
            }
        }
        // Each listed grant is still granted and still unused (else it is not listed).
        for (_, grant, _) in UNEXERCISED.iter().filter(|(c, _, _)| *c == case.chart) {
            if !measured.unused.contains(*grant) {
                findings.push(format!(
                    "{}: listed as unexercised but used or not granted: {grant}",
                    case.chart
                ));
            }
        }
    }
    assert!(findings.is_empty(), "{findings:#?}");
}

/// Enforcement, proved: the Deployment provider's chart without the rule that lets it read
/// and renew its leader-election Lease. The provider runs under exactly that RBAC: the API
/// server refuses its Lease read with 403, and the guard every chart test runs its
/// component under fails the test naming the component, the verb and the resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_missing_a_grant_is_refused_and_its_test_fails_naming_the_grant() {
    let Some(helm_bin) = helm::require() else {
        return;
    };
    let chart = "deployment-provider";
    let mut objects = helm::template(&helm_bin, &helm::chart(chart), &[]).unwrap();
    let (account, args, lease) = provider_args(chart, &objects);
    let names_lease = |r: &Value| {
        r["resources"] == json!(["leases"]) && r["resourceNames"] == json!([lease.as_str()])
    };
    let role = objects
        .iter_mut()
        .find(|o| {
            o["kind"] == "Role"
                && o["rules"]
                    .as_array()
                    .is_some_and(|rules| rules.iter().any(names_lease))
        })
        .expect("the chart grants get and update of its Lease");
    let rules = role["rules"].as_array_mut().unwrap();
    rules.retain(|r| !names_lease(r));
    assert!(!rules.is_empty(), "the Role keeps its create rule");

    let (cluster, admin) = testing::private_cluster("rbac-missing-grant", &[])
        .await
        .unwrap();
    let identity = rbac::ChartIdentity::apply(&cluster, &admin, &objects, chart, SYSTEM, &account)
        .await
        .unwrap();
    let client = identity.client(&cluster).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let running = start(chart, &args, client, stopped).await;

    let refused = eventually(WAIT, "the Lease read refused", || async {
        let refused = identity.refused().ok()?;
        (!refused.is_empty()).then_some(refused)
    })
    .await
    .unwrap();
    let expected = format!("get coordination.k8s.io/leases in {SYSTEM} named {lease}");
    let refused: Vec<String> = refused.iter().map(ToString::to_string).collect();
    assert!(refused.contains(&expected), "{refused:#?}");
    assert!(
        refused
            .iter()
            .all(|r| r.contains("coordination.k8s.io/leases")),
        "only the dropped grant is missing: {refused:#?}"
    );
    // The API server's answer names the user, verb and resource, as kube-apiserver's does.
    let leases: Api<Lease> = Api::namespaced(identity.client(&cluster).await.unwrap(), SYSTEM);
    let Err(kube::Error::Api(answer)) = leases.get(&lease).await else {
        panic!("the Lease read must be refused");
    };
    assert_eq!(answer.code, 403);
    assert_eq!(
        answer.message,
        format!(
            "leases.coordination.k8s.io \"{lease}\" is forbidden: User \"{}\" cannot get resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"{SYSTEM}\"",
            identity.user
        )
    );
    // The guard fails the test, naming the component and the request.
    let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        identity.assert_none_refused();
    }))
    .expect_err("a refused request fails the test");
    let message = failure
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        message.contains(&format!("{chart} ({})", identity.user)) && message.contains(&expected),
        "{message}"
    );
    identity.expect_refusals();

    let _ = stop.send(());
    let _ = running.await;
}

/// The name of the probe [`enforce_upstream_policy`] sends (a dry run).
const POLICY_PROBE: &str = "policy-probe";

/// The policy of the provider `chart` on what it renders (`kubeairunway-lib.upstreamPolicy`).
fn upstream_policy(chart: &str) -> String {
    format!("release-{chart}-upstream")
}

/// What the policy of the provider `chart` is probed with: a kind it governs, the CRD
/// that serves it (none for a built-in kind) and a spec its schema admits (the API
/// server validates an object before the policies see it).
fn probe_kind(chart: &str) -> (ApiResource, Option<CustomResourceDefinition>, Value) {
    let custom = |file: &str, spec: Value| {
        let crd = upstream_crd(file);
        (resource_of(&crd), Some(crd), spec)
    };
    match chart {
        "dynamo-provider" => custom("nvidia.com_dynamographdeployments.yaml", json!({})),
        "kuberay-provider" => custom(
            "ray.io_rayservices.yaml",
            json!({"rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.9.0"}]}}}}}),
        ),
        // Services: both the Deployment provider and KAITO render them.
        _ => (
            ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
            None,
            json!({"ports": [{"port": 80}]}),
        ),
    }
}

/// An object of `kind` named `name` with `labels`, `owners` (owner references) and `spec`.
fn probe_object(
    kind: &ApiResource,
    name: &str,
    labels: &Value,
    owners: &Value,
    spec: &Value,
) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": kind.api_version, "kind": kind.kind,
        "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
        "spec": spec,
    }))
    .unwrap()
}

/// Apply the provider `chart`'s policies and wait until the API server enforces its
/// upstream policy on `provider`: an unlabelled object of its kind in the release
/// namespace (a dry run) is refused.
async fn enforce_upstream_policy(
    admin: &Client,
    provider: &Client,
    objects: &[Value],
    chart: &str,
) {
    kubeairunway_e2e::policy::apply(admin, objects)
        .await
        .unwrap();
    let (kind, _, spec) = probe_kind(chart);
    let api: Api<DynamicObject> = Api::namespaced_with(provider.clone(), SYSTEM, &kind);
    let probe = probe_object(&kind, POLICY_PROBE, &json!({}), &json!([]), &spec);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    kubeairunway_e2e::policy::until_denied(&upstream_policy(chart), || {
        api.create(&dry_run, &probe)
    })
    .await
    .unwrap();
}

/// The upstream policy of the provider `chart` (rendering for `provider_name`, which
/// renders `kinds`) at work on its service account, probed with one kind it renders
/// ([`probe_kind`]): RBAC lets it write that kind in every namespace; the policy refuses
/// one without its label, one not controlled by a ModelDeployment, one in kube-system,
/// and changing or deleting someone else's; one of its own is admitted. Its own writes
/// pass it in the walk of `provider_charts_grant_what_the_providers_use_and_nothing_more`.
async fn upstream_policy_fences(chart: &str, provider_name: &str, kinds: &str) {
    use kubeairunway_e2e::policy;
    let Some(helm_bin) = helm::require() else {
        return;
    };
    let objects = helm::template(&helm_bin, &helm::chart(chart), &[]).unwrap();
    let (kind, crd, spec) = probe_kind(chart);
    let (cluster, admin) = testing::private_cluster(
        &format!("{provider_name}-policy"),
        &crd.into_iter().collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    cluster.ensure_namespace(SYSTEM);
    let (account, _, _) = provider_args(chart, &objects);
    let identity = rbac::ChartIdentity::apply(&cluster, &admin, &objects, chart, SYSTEM, &account)
        .await
        .unwrap();
    let provider = identity.client(&cluster).await.unwrap();
    enforce_upstream_policy(&admin, &provider, &objects, chart).await;
    let fence = upstream_policy(chart);
    let ns = cluster.namespace(&format!("{provider_name}-policy"));
    let ours = json!({"kubeairunway.ai/provider": provider_name, "kubeairunway.ai/managed-by": "kubeairunway"});
    let owner = |kind: &str| {
        json!([{"apiVersion": "kubeairunway.ai/v1alpha1", "kind": kind, "name": "md",
                "uid": "uid-1", "controller": true}])
    };
    let object = |name: &str, labels: &Value, owners: &Value| {
        probe_object(&kind, name, labels, owners, &spec)
    };
    let pp = PostParams::default();
    let in_ns = |client: &Client, ns: &str| {
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &kind)
    };
    let as_provider = in_ns(&provider, &ns);
    let unlabelled =
        format!("{chart} writes only {kinds} labelled kubeairunway.ai/provider={provider_name}");
    let not_made = format!("{chart} changes and deletes only the {kinds} it created");
    for labels in [json!({}), json!({"kubeairunway.ai/provider": "other"})] {
        policy::assert_denied(
            &as_provider
                .create(&pp, &object("s", &labels, &owner("ModelDeployment")))
                .await,
            &fence,
            &unlabelled,
        );
    }
    for owners in [json!([]), owner("Workspace")] {
        policy::assert_denied(
            &as_provider.create(&pp, &object("s", &ours, &owners)).await,
            &fence,
            &format!("{chart} creates only {kinds} controlled by a ModelDeployment"),
        );
    }
    policy::assert_denied(
        &in_ns(&provider, "kube-system")
            .create(&pp, &object("s", &ours, &owner("ModelDeployment")))
            .await,
        &fence,
        &format!(
            "{chart} never writes in kube-system, kube-public, kube-node-lease or its own namespace"
        ),
    );
    // Someone else's object: not the provider's to change or delete.
    in_ns(&admin, &ns)
        .create(&pp, &object("theirs", &json!({}), &json!([])))
        .await
        .unwrap();
    policy::assert_denied(
        &as_provider
            .patch(
                "theirs",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"kubeairunway.ai/provider": provider_name}}}),
                ),
            )
            .await,
        &fence,
        &not_made,
    );
    policy::assert_denied(
        &as_provider.delete("theirs", &DeleteParams::default()).await,
        &fence,
        &not_made,
    );
    // One of its own is admitted (a dry run).
    as_provider
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &object("s", &ours, &owner("ModelDeployment")),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployment_providers_writes_are_fenced_by_its_chart_policy() {
    upstream_policy_fences(
        "deployment-provider",
        "deployment",
        "Deployments and Services",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kaito_providers_writes_are_fenced_by_its_chart_policy() {
    upstream_policy_fences(
        "kaito-provider",
        "kaito",
        "Workspaces, InferenceSets and Services",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dynamo_providers_writes_are_fenced_by_its_chart_policy() {
    upstream_policy_fences("dynamo-provider", "dynamo", "DynamoGraphDeployments").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kuberay_providers_writes_are_fenced_by_its_chart_policy() {
    upstream_policy_fences("kuberay-provider", "kuberay", "RayServices").await;
}
