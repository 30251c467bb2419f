//! The `kubeairunway` command end to end, run in-process through its library entry point
//! (the code both binaries run) against real API servers:
//!
//! - `up --once` on a local API server of its own: CRDs, every controller, the samples,
//!   the table with each sample's upstream object; then `explain`, `providers` and `down`;
//! - `up --once --kubeconfig` on a cluster that lacks some upstream CRDs: those providers
//!   are skipped with how to install them, and the samples they would serve say why they
//!   have no upstream object;
//! - `render`, for every sample and every built-in provider, prints byte for byte the
//!   objects the running provider applies for the same ModelDeployment (the apply
//!   requests are recorded on the wire), or refuses with the message the provider writes
//!   in its status.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser as _;
use futures::FutureExt as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_cli::builtin::{BuiltIns, NAMES, NodeProvisioningMode, ProviderFlags};
use kubeairunway_cli::controllers::Controllers;
use kubeairunway_cli::crds;
use kubeairunway_sdk::conditions::{PROVIDER_COMPATIBLE, RESOURCE_CREATED};
use kubeairunway_sdk::testing::{self, wait_for};
use kubeairunway_sdk::{ModelDeployment, labels};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

use kubeairunway_e2e::cli::run as kubeairunway;

async fn client_of(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// Stops the local API server of a state directory when the test ends, however it ends.
struct LocalServer(std::path::PathBuf);

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = kubeairunway_testcluster::stop_detached(&self.0.join("cluster"));
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A line with every run of spaces made one.
fn squash(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The last table `up` printed, as rows of cells.
fn last_table(out: &str) -> Vec<Vec<String>> {
    let table = out.rsplit("\n\n").next().unwrap_or_default();
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[tokio::test]
async fn up_once_then_explain_providers_and_down() {
    let state = tempfile::tempdir().unwrap();
    let _server = LocalServer(state.path().to_path_buf());
    let dir = state.path().to_str().unwrap();

    let (code, out, err) = kubeairunway(&["--state-dir", dir, "up", "--once"]).await;
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for step in [
        "[1/5] cluster",
        "[2/5] CRDs",
        "[3/5] controllers",
        "[4/5] samples",
    ] {
        assert!(err.contains(step), "{err}");
    }
    assert!(
        err.contains("started the local API server at https://127.0.0.1:"),
        "{err}"
    );
    assert!(
        err.contains(
            "running core, deployment, dynamo, kaito, kuberay, kernelcache in this process"
        ),
        "{err}"
    );
    assert!(
        err.contains("applied default/llama-8b (config/samples/gpu-vllm.yaml)"),
        "{err}"
    );
    assert!(
        err.contains("Every sample has its upstream object"),
        "{err}"
    );
    assert!(
        err.contains("the local API server runs no KAITO, Dynamo or KubeRay operator"),
        "{err}"
    );
    let kubeconfig = state.path().join("cluster/kubeconfig");
    assert!(
        err.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "{err}"
    );
    let rows = last_table(&out);
    assert_eq!(
        rows[0],
        [
            "NAME", "PHASE", "PROVIDER", "ENGINE", "READY", "ENDPOINT", "UPSTREAM"
        ]
    );
    let by_name = |name: &str| {
        rows.iter()
            .find(|r| r[0] == name)
            .unwrap_or_else(|| panic!("{name} in\n{out}"))
            .clone()
    };
    let llama = by_name("llama-8b");
    assert_eq!(
        (llama[2].as_str(), llama[6].as_str()),
        ("dynamo", "DynamoGraphDeployment/llama-8b"),
        "{out}"
    );
    let gemma = by_name("gemma-cpu");
    assert_eq!(
        (gemma[2].as_str(), gemma[6].as_str()),
        ("kaito", "Workspace/gemma-cpu"),
        "{out}"
    );
    let pd = by_name("llama-70b-pd");
    assert_eq!(pd[6], "DynamoGraphDeployment/llama-70b-pd", "{out}");
    // AI Runway's README example: the engine core chose.
    let qwen = by_name("qwen3");
    assert_eq!(
        (qwen[2].as_str(), qwen[3].as_str(), qwen[6].as_str()),
        ("dynamo", "vllm", "DynamoGraphDeployment/qwen3"),
        "{out}"
    );
    assert!(
        !state.path().join("up.json").exists(),
        "up leaves no state behind when it ends"
    );

    // The cluster holds what the table says.
    let client = client_of(&kubeconfig).await;
    let dgds: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &resource(
            "nvidia.com",
            "v1beta1",
            "DynamoGraphDeployment",
            "dynamographdeployments",
        ),
    );
    assert!(dgds.get_opt("llama-8b").await.unwrap().is_some());
    let workspaces: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &resource("kaito.sh", "v1beta1", "Workspace", "workspaces"),
    );
    assert!(workspaces.get_opt("gemma-cpu").await.unwrap().is_some());

    // explain: why dynamo, per provider, and the upstream object without an operator.
    let kc = kubeconfig.to_str().unwrap();
    let (code, text, err) = kubeairunway(&["explain", "md", "llama-8b", "--kubeconfig", kc]).await;
    assert_eq!(code, 0, "{err}");
    for want in [
        "ModelDeployment default/llama-8b\n",
        "  Phase:    Deploying\n",
        "\nWhy dynamo: selection chose it (selection runs once; evaluated again now):\n",
        "capabilities fit; wins (priority 50)\n",
        "    rule `spec.engine.type == 'sglang'` priority 100: false\n",
        "  kaito: ready, heartbeat ",
        "; capabilities fit; no selection rule is true\n",
        "  kuberay: ready, heartbeat ",
        "no selection rules: serves only when named\n",
        "capability providers (never selected to serve): kernelcache (features: kernelCache, ready)",
        "\nUpstream object:\n  DynamoGraphDeployment/llama-8b (nvidia.com/v1beta1)\n    no status: no operator has acted on it yet",
    ] {
        assert!(text.contains(want), "{want:?} in\n{text}");
    }
    // Table rows, whatever the column widths.
    let squashed: Vec<String> = text.lines().map(squash).collect();
    for want in [
        "ProviderSelected True AutoSelected",
        "ResourceCreated True ResourceCreated",
        "Normal ProviderSelected kubeairunway-controller Selected provider 'dynamo'",
        "Normal ResourceCreated dynamo-provider Created DynamoGraphDeployment 'llama-8b'",
    ] {
        assert!(
            squashed.iter().any(|l| l.contains(want)),
            "{want:?} in\n{text}"
        );
    }
    // The operator writes a status (as Dynamo does): explain shows it.
    testing::write_upstream_status(
        &client,
        &resource("nvidia.com", "v1beta1", "DynamoGraphDeployment", "dynamographdeployments"),
        "default",
        "llama-8b",
        json!({"state": "pending", "conditions": [{"type": "Ready", "status": "False", "reason": "Pending",
               "message": "frontend: 0/1 ready", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    )
    .await
    .unwrap();
    let (code, json, err) = kubeairunway(&[
        "explain",
        "md",
        "llama-8b",
        "-n",
        "default",
        "--kubeconfig",
        kc,
        "-o",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let e: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(e["provider"], "dynamo");
    assert_eq!(
        e["upstream"]["state"],
        json!([
            "state: pending",
            "Ready=False (Pending): frontend: 0/1 ready"
        ])
    );
    let selection = e["selection"].as_array().unwrap();
    assert_eq!(selection.len(), 4, "{json}");
    // In name order: the provider that needs no operator lost with its priority 1.
    assert_eq!(
        (&selection[0]["name"], &selection[0]["score"]),
        (&json!("deployment"), &json!(1))
    );
    assert_eq!(
        (&selection[1]["name"], &selection[1]["score"]),
        (&json!("dynamo"), &json!(50))
    );
    let (code, _, err) = kubeairunway(&["explain", "md", "nope", "--kubeconfig", kc]).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("modeldeployment default/nope not found (`kubectl get md -A` lists them)"),
        "{err}"
    );

    // providers: every registered provider with its upstream API.
    let (code, table, err) = kubeairunway(&["providers", "--kubeconfig", kc]).await;
    assert_eq!(code, 0, "{err}");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "NAME",
            "READY",
            "VERSION",
            "HEARTBEAT",
            "UPSTREAM",
            "SERVES"
        ]
    );
    let upstreams: Vec<(&str, &str, &str)> = rows[1..].iter().map(|r| (r[0], r[1], r[5])).collect();
    assert_eq!(
        upstreams,
        [
            ("deployment", "true", "apps/v1"),
            ("dynamo", "true", "nvidia.com/v1beta1"),
            ("kaito", "true", "kaito.sh/v1beta1"),
            ("kernelcache", "true", "-"),
            ("kuberay", "true", "ray.io/v1"),
        ],
        "{table}"
    );
    assert!(
        !table.contains("To install it"),
        "no hints while every provider is ready: {table}"
    );

    // down stops the local API server; nothing is left to stop afterwards.
    let (code, _, err) = kubeairunway(&["--state-dir", dir, "down"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("stopped the local API server"), "{err}");
    assert!(!state.path().join("cluster/apiserver.pid").exists());
    let (_, _, err) = kubeairunway(&["--state-dir", dir, "down"]).await;
    assert!(err.contains("nothing to stop"), "{err}");
    let (code, _, err) = kubeairunway(&["providers", "--kubeconfig", kc]).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot reach the API server at https://127.0.0.1:"),
        "{err}"
    );
}

#[tokio::test]
async fn up_on_a_cluster_without_some_upstream_crds_skips_their_providers() {
    // A bare cluster with KAITO's Workspace CRD only: not even ours.
    let cluster = kubeairunway_e2e::private_cluster("cli-partial")
        .await
        .unwrap();
    let workspaces = crds::bundled("workspaces.kaito.sh").unwrap().unwrap();
    crds::install(&cluster.client().await.unwrap(), &[workspaces])
        .await
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let kc = cluster.kubeconfig().to_str().unwrap().to_string();
    for args in [
        vec!["explain", "md", "llama-8b", "--kubeconfig", &kc],
        vec!["providers", "--kubeconfig", &kc],
    ] {
        let (code, _, err) = kubeairunway(&args).await;
        assert_eq!(code, 1, "{args:?}");
        assert!(
            err.contains("kubeairunway is not installed; run `kubeairunway up --kubeconfig PATH` or install charts/kubeairunway"),
            "{args:?}: {err}"
        );
    }
    let (code, out, err) = kubeairunway(&[
        "--state-dir",
        state.path().to_str().unwrap(),
        "up",
        "--once",
        "--kubeconfig",
        &kc,
        "--timeout",
        "60s",
        // This cluster has no node provisioner: KAITO on the nodes it has (without it,
        // KAITO's default auto-provisioning needs `--cpu-instance-type`).
        "--node-provisioning=byo",
    ])
    .await;
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains(&format!("using the cluster at {}", cluster.server())),
        "{err}"
    );
    for (provider, crd) in [
        ("dynamo", "dynamographdeployments.nvidia.com"),
        ("kuberay", "rayservices.ray.io"),
    ] {
        assert!(
            err.contains(&format!(
                "skipping {provider}: its upstream CRD {crd} is not installed in this cluster. To install it:"
            )),
            "{err}"
        );
    }
    assert!(
        err.contains("helm install kuberay-operator kuberay/kuberay-operator"),
        "{err}"
    );
    assert!(
        err.contains("running core, deployment, kaito, kernelcache in this process"),
        "{err}"
    );
    let rows = last_table(&out);
    let gemma = rows.iter().find(|r| r[0] == "gemma-cpu").unwrap();
    assert_eq!(gemma[6], "Workspace/gemma-cpu", "{out}");
    assert!(
        err.contains("default/llama-70b-pd has no upstream object: Provider 'dynamo' CRD not installed in cluster"),
        "{err}"
    );
    // Without Dynamo, the vLLM sample on a GPU falls to the provider that needs no
    // operator: its rule is true at the lowest priority, and KAITO's is false.
    let llama = rows.iter().find(|r| r[0] == "llama-8b").unwrap();
    assert_eq!(
        (llama[2].as_str(), llama[6].as_str()),
        ("deployment", "Deployment/llama-8b"),
        "{out}"
    );

    let (code, table, _) = kubeairunway(&["providers", "--kubeconfig", &kc]).await;
    assert_eq!(code, 0);
    assert!(
        table.contains("\nkuberay is not registered. To install it:\n"),
        "{table}"
    );
    assert!(
        table.contains("  helm repo add kuberay https://ray-project.github.io/kuberay-helm/\n"),
        "{table}"
    );
    let (code, text, _) =
        kubeairunway(&["explain", "md", "llama-70b-pd", "--kubeconfig", &kc]).await;
    assert_eq!(code, 0);
    assert!(
        text.contains("  ! provider 'dynamo' is not registered in this cluster (no InferenceProviderConfig 'dynamo')"),
        "{text}"
    );
    assert!(text.contains("  Provider: none selected yet\n"), "{text}");
}

/// The built-in providers' flags, parsed as the CLI parses them.
#[derive(clap::Parser)]
struct ProviderFlagsCli {
    #[command(flatten)]
    flags: ProviderFlags,
}

/// Create namespace `ns` where the API server serves namespaces (and so requires them).
async fn ensure_namespace(client: &Client, ns: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(ns.to_string());
    match api
        .create(&kube::api::PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => panic!("creating namespace {ns}: {e}"),
    }
}

/// An applied object: (namespace, apiVersion, kind, name).
type Key = (String, String, String, String);

/// One apply request: the object and the request body.
type Request = (Key, Vec<u8>);

/// Apply requests seen on the wire.
#[derive(Clone, Default)]
struct Applied(Arc<Mutex<Vec<Request>>>);

impl Applied {
    fn record(&self, req: &http::Request<kube::client::Body>) {
        let is_apply = req.method() == http::Method::PATCH
            && req
                .headers()
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/apply-patch"));
        let Some(body) = req.body().try_clone().filter(|_| is_apply) else {
            return;
        };
        let Some(Ok(bytes)) = body.collect_bytes().now_or_never() else {
            return;
        };
        let Ok(o) = serde_json::from_slice::<DynamicObject>(&bytes) else {
            return;
        };
        let types = o.types.clone().unwrap_or_default();
        // Only what providers apply: objects carrying the platform's provider label.
        if !o.labels().contains_key(labels::PROVIDER) {
            return;
        }
        let key = (
            o.namespace().unwrap_or_default(),
            types.api_version,
            types.kind,
            o.name_any(),
        );
        self.0.lock().unwrap().push((key, bytes.to_vec()));
    }

    /// The last body applied for each object of `namespace` owned by ModelDeployment `md`.
    fn last_for(&self, namespace: &str, md: &str) -> Vec<Request> {
        let mut last: std::collections::BTreeMap<_, Vec<u8>> = std::collections::BTreeMap::new();
        for (key, body) in self.0.lock().unwrap().iter() {
            let o: DynamicObject = serde_json::from_slice(body).unwrap();
            if key.0 == namespace
                && o.labels().get(labels::MODEL_DEPLOYMENT).map(String::as_str) == Some(md)
            {
                last.insert(key.clone(), body.clone());
            }
        }
        last.into_iter().collect()
    }
}

/// The body of an apply request without the precondition of a first write: the provider
/// runtime creates an object it has never seen with `metadata.resourceVersion: "1"`, so that
/// the apply can only create (the API server answers 409 for an object that exists). That
/// precondition is how the object is written, not what is written, so render omits it.
fn without_create_only_precondition(body: &[u8]) -> Vec<u8> {
    let value: Value = serde_json::from_slice(body).unwrap();
    if value["metadata"]["resourceVersion"] != json!("1") {
        return body.to_vec();
    }
    // Cut the field from the bytes, so that the comparison stays byte for byte.
    let text = String::from_utf8(body.to_vec()).unwrap();
    let field = r#""resourceVersion":"1""#;
    let stripped = if text.contains(&format!(",{field}")) {
        text.replacen(&format!(",{field}"), "", 1)
    } else {
        text.replacen(&format!("{field},"), "", 1)
    };
    assert_ne!(
        stripped, text,
        "resourceVersion is where ObjectMeta writes it"
    );
    stripped.into_bytes()
}

/// A client whose apply requests are recorded.
async fn recording_client(kubeconfig: &Path, applied: &Applied) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    let recorder = applied.clone();
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        recorder.record(&req);
        req
    });
    kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&layer)
        .build()
}

fn condition<'a>(
    md: &'a ModelDeployment,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    md.status
        .as_ref()
        .and_then(|s| kubeairunway_sdk::conditions::find(&s.conditions, type_))
}

#[tokio::test]
async fn render_prints_exactly_what_the_running_providers_apply() {
    let upstream: Vec<CustomResourceDefinition> = crds::all_bundled().unwrap();
    let (cluster, client) = testing::private_cluster("cli-render", &upstream)
        .await
        .unwrap();
    let applied = Applied::default();
    let recording = recording_client(cluster.kubeconfig(), &applied).await;
    let inference_set = upstream
        .iter()
        .find(|c| c.name_any() == kubeairunway_kaito_provider::INFERENCE_SET_CRD);
    // KAITO with node auto-provisioning, so that Workspaces carry instance types.
    let kaito_flags = [
        "--node-provisioning=auto",
        "--gpu-instance-type=Standard_NC24ads_A100_v4",
        "--cpu-instance-type=Standard_D8s_v3",
    ];
    let flags = ProviderFlagsCli::try_parse_from(std::iter::once("x").chain(kaito_flags))
        .unwrap()
        .flags;
    let controllers = Controllers::start(
        &recording,
        BuiltIns::new(&flags, inference_set, NodeProvisioningMode::Byo),
        &NAMES,
    )
    .unwrap();
    // Core chooses among the providers registered when it first sees a ModelDeployment, and
    // the deployment provider matches everything: apply nothing before all have registered.
    for provider in NAMES {
        testing::registered(&client, provider).await;
    }

    // Every sample as written (selection decides) and with each provider named.
    let samples: Vec<Value> = kubeairunway_config::samples::all()
        .into_iter()
        .filter(|s| s.rejection.is_none())
        .map(|s| s.manifest)
        .collect();
    let mut cases = Vec::new();
    for sample in &samples {
        cases.push(("cli-render-auto".to_string(), None, sample.clone()));
        for provider in NAMES {
            let mut md = sample.clone();
            md["spec"]["provider"]["name"] = json!(provider);
            cases.push((format!("cli-render-{provider}"), Some(provider), md));
        }
    }
    for ns in [
        "cli-render-auto",
        "cli-render-deployment",
        "cli-render-dynamo",
        "cli-render-kaito",
        "cli-render-kuberay",
    ] {
        ensure_namespace(&client, ns).await;
    }
    for (ns, _, manifest) in &cases {
        kubeairunway_e2e::apply_md(&client, ns, "user", manifest)
            .await
            .unwrap();
    }

    let files = tempfile::tempdir().unwrap();
    let (mut rendered, mut refused) = (0, 0);
    for (ns, provider, manifest) in &cases {
        let name = manifest["metadata"]["name"].as_str().unwrap();
        let api: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
        // The provider has acted: applied its objects, or refused the spec.
        let md = wait_for(
            WAIT,
            &format!("{ns}/{name} handled by its provider"),
            || api.get_opt(name),
            |md| {
                md.as_ref().is_some_and(|md| {
                    condition(md, RESOURCE_CREATED).is_some()
                        || condition(md, PROVIDER_COMPATIBLE).is_some_and(|c| c.status == "False")
                })
            },
        )
        .await
        .unwrap()
        .unwrap();
        // The same ModelDeployment, as `kubectl get md -o yaml` gives it.
        let file = files.path().join(format!("{ns}-{name}.yaml"));
        std::fs::write(&file, serde_saphyr::to_string(&md).unwrap()).unwrap();
        let mut args = vec!["render", "-f", file.to_str().unwrap(), "-o", "json"];
        args.extend(kaito_flags);
        if let Some(p) = provider {
            args.extend(["--provider", p]);
        }
        let (code, out, err) = kubeairunway(&args).await;
        let selected = md
            .status
            .as_ref()
            .and_then(|s| s.provider.as_ref())
            .and_then(|p| p.name.clone())
            .unwrap();
        assert!(
            err.contains(&format!("provider {selected} (")) || code != 0,
            "render chose the provider core chose ({selected}): {err}"
        );

        let compatible = condition(&md, PROVIDER_COMPATIBLE).unwrap();
        if compatible.status == "False" {
            assert_eq!(code, 1, "{ns}/{name}: {out}");
            assert!(
                err.contains(&format!("{selected}: {}", compatible.message)),
                "{ns}/{name}: the provider said {:?}; render said {err}",
                compatible.message
            );
            refused += 1;
            continue;
        }
        assert_eq!(code, 0, "{ns}/{name}: {err}");
        let value: Value = serde_json::from_str(&out).unwrap();
        let objects: Vec<DynamicObject> = if value["kind"] == "List" {
            serde_json::from_value(value["items"].clone()).unwrap()
        } else {
            vec![serde_json::from_value(value).unwrap()]
        };
        let on_the_wire = applied.last_for(ns, name);
        assert_eq!(
            on_the_wire.len(),
            objects.len(),
            "{ns}/{name}: applied {:?}",
            on_the_wire.iter().map(|(k, _)| k).collect::<Vec<_>>()
        );
        for object in &objects {
            let types = object.types.clone().unwrap();
            let key = (ns.clone(), types.api_version, types.kind, object.name_any());
            let (_, body) = on_the_wire
                .iter()
                .find(|(k, _)| *k == key)
                .unwrap_or_else(|| panic!("{key:?} was never applied"));
            let printed = serde_json::to_vec(object).unwrap();
            let body = without_create_only_precondition(body);
            assert!(
                printed == body,
                "{key:?} differs:\nrender:  {}\napplied: {}",
                String::from_utf8_lossy(&printed),
                String::from_utf8_lossy(&body)
            );
        }
        rendered += 1;
    }
    controllers.stop().await;
    // 4 samples as written, and 4 x 4 named (the one with no engine gets vLLM with its
    // default GPU from each provider): KAITO and the Deployment provider cannot serve
    // disaggregated serving, Dynamo and KubeRay cannot serve llama.cpp, and the
    // disaggregated sample's Dynamo overrides (routerMode, frontend) are no RayService
    // fields, so KubeRay refuses them (InvalidOverride) and render says the same.
    assert_eq!((rendered, refused), (15, 5));
}

/// AI Runway's own samples and README example (`tests/fixtures/airunway`, from
/// ai-runway/airunway@b0d3fb7), converted by `kubeairunway convert`: every document
/// converts; what does not carry over is named (llm-d's `requiresCRD`, and llm-d, which is
/// not a provider here); the API server accepts every converted document as written (our
/// CRDs, server-side apply); and each ModelDeployment renders offline, or is refused
/// naming the provider it lacks.
#[tokio::test]
async fn ai_runway_samples_convert_apply_and_render() {
    // Cluster-scoped InferenceProviderConfigs named like the built-in providers: a
    // cluster of the test's own.
    let (cluster, client) = testing::private_cluster("airunway-convert", &[])
        .await
        .unwrap();
    let ns = cluster.namespace("airunway");
    ensure_namespace(&client, &ns).await;
    let dir = kubeairunway_e2e::fixtures_dir().join("airunway");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    let work = tempfile::tempdir().unwrap();
    let (mut losses, mut rendered, mut refused) = (Vec::new(), Vec::new(), Vec::new());
    for file in &files {
        let (code, out, err) = kubeairunway(&["convert", "-f", file.to_str().unwrap()]).await;
        assert_eq!(code, 0, "{}: {err}", file.display());
        losses.extend(err.lines().map(str::to_string));
        let docs: Vec<Value> = serde_saphyr::from_multiple(&out).unwrap();
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            assert_eq!(doc["apiVersion"], "kubeairunway.ai/v1alpha1", "{doc}");
            let kind = doc["kind"].as_str().unwrap().to_string();
            let name = doc["metadata"]["name"].as_str().unwrap().to_string();
            let resource = match kind.as_str() {
                "ModelDeployment" => ApiResource::erase::<ModelDeployment>(&()),
                _ => ApiResource::erase::<kubeairunway_sdk::InferenceProviderConfig>(&()),
            };
            let api: Api<DynamicObject> = if kind == "ModelDeployment" {
                Api::namespaced_with(client.clone(), &ns, &resource)
            } else {
                Api::all_with(client.clone(), &resource)
            };
            let mut body = doc.clone();
            if kind == "ModelDeployment" {
                body["metadata"]["namespace"] = json!(ns);
            }
            api.patch(
                &name,
                &kube::api::PatchParams::apply("convert").force(),
                &kube::api::Patch::Apply(&body),
            )
            .await
            .unwrap_or_else(|e| panic!("{kind}/{name} as converted: {e}"));
            if kind != "ModelDeployment" {
                continue;
            }
            let path = work.path().join(format!("{name}.yaml"));
            std::fs::write(&path, serde_saphyr::to_string(&doc).unwrap()).unwrap();
            let (code, _, err) = kubeairunway(&["render", "-f", path.to_str().unwrap()]).await;
            if code == 0 {
                rendered.push(name);
            } else {
                assert!(err.contains("llmd"), "{name}: {err}");
                refused.push(name);
            }
        }
    }
    rendered.sort();
    refused.sort();
    assert_eq!(
        rendered,
        [
            "gemma-cpu-example",
            "llama-70b-pd-example",
            "llama-8b-example",
            "my-model"
        ]
    );
    assert_eq!(refused, ["llama-70b-llmd-pd", "llama-8b-llmd"]);
    // Exactly what does not carry over, each named.
    losses.sort();
    assert_eq!(
        losses,
        [
            "InferenceProviderConfig/llmd: spec.capabilities.engines[0].requiresCRD: not carried over (no such field here)",
            "ModelDeployment/llama-70b-llmd-pd: spec.provider.name: \"llmd\" carried over as written; llm-d is not a provider here: the Deployment provider (`deployment`) serves vLLM with a plain Deployment and Service",
            "ModelDeployment/llama-8b-llmd: spec.provider.name: \"llmd\" carried over as written; llm-d is not a provider here: the Deployment provider (`deployment`) serves vLLM with a plain Deployment and Service",
        ]
    );
}
