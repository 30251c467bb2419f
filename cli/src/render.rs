//! `kubeairunway render -f md.yaml`: the exact upstream objects a provider would apply
//! for a ModelDeployment, offline.
//!
//! Exactly the runtime's code path: the provider is the one named (`--provider`, then
//! `spec.provider.name`) or the one core's selection picks among the built-in providers'
//! registrations; then its `check`, the upstream API detected from the upstream CRD (the
//! bundled one or `--upstream-crd`), its `render`, and the SDK's `render::finalize`, which
//! finishes every object as the runtime does and checks it against the CRD's schema.

use std::path::PathBuf;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kubeairunway_sdk::engine_choice;
use kubeairunway_sdk::selection::{self, Outcome, RuleCache};
use kubeairunway_sdk::{ModelDeployment, UpstreamApi};

use kubeairunway_core::gateway::decide::{self, Apis, GatewayRef, Inputs};

use crate::Terminal;
use crate::builtin::{BuiltIns, NAMES, ProviderFlags};
use crate::crds::UpstreamCrds;
use crate::manifest;
use crate::output::{self, Format, Table};

/// `render`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// ModelDeployment manifests (YAML, several documents or a List allowed; `-` reads
    /// standard input).
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Render with this built-in provider instead of the named or selected one.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(NAMES))]
    pub provider: Option<String>,
    /// An upstream CRD file to render and check against, replacing the bundled CRD of the
    /// same name (repeatable; e.g. an older KAITO Workspace CRD).
    #[arg(long = "upstream-crd", value_name = "FILE")]
    pub upstream_crds: Vec<PathBuf>,
    /// Namespace of manifests that name none.
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// Also print what core's gateway makes for a ModelDeployment with
    /// spec.gateway.enabled (InferencePool, endpoint picker, HTTPRoute), routed from this
    /// Gateway (<namespace>/<name>).
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = kubeairunway_core::gateway::controller::parse_gateway)]
    pub gateway: Option<GatewayRef>,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "yaml")]
    pub output: Format,
    /// The built-in providers' settings.
    #[command(flatten)]
    pub providers: ProviderFlags,
}

/// What a provider would apply for one ModelDeployment.
#[derive(Clone, Debug, PartialEq)]
pub struct Preview {
    /// The engine and how it was chosen: `vllm (explicit)`, `llamacpp (auto: ...)`.
    pub engine: String,
    /// The provider.
    pub provider: String,
    /// Why this provider: named, or selection's reason.
    pub reason: String,
    /// The objects, in the order the provider returns them (primary first); the runtime
    /// applies the others first and the primary last.
    pub objects: Vec<DynamicObject>,
    /// The provider's warnings (ignored fields, unknown overrides): `Reason: message`.
    pub warnings: Vec<String>,
}

/// Which provider serves `md`, and why: `forced`, then `spec.provider.name`, then core's
/// selection over the built-in providers' registrations at `now`.
pub fn choose(
    md: &ModelDeployment,
    forced: Option<&str>,
    builtins: &BuiltIns,
    now: Timestamp,
) -> Result<(String, String), String> {
    if let Some(name) = forced {
        return Ok((name.to_string(), "named with --provider".to_string()));
    }
    if let Some(name) = md.spec.provider_name() {
        return Ok((
            name.to_string(),
            kubeairunway_core::reconciler::EXPLICIT_REASON.to_string(),
        ));
    }
    let configs = builtins.registered(now);
    let selection = selection::select(
        md,
        &configs,
        &RuleCache::default(),
        &selection::Settings::default(),
        now,
    );
    match selection.outcome {
        Outcome::Selected {
            provider, reason, ..
        } => Ok((provider, reason)),
        Outcome::NoneFits { message } => Err(message),
        Outcome::NoHealthyProviders { detail } => {
            Err(format!("{}: {detail}", selection::NO_HEALTHY_PROVIDERS))
        }
    }
}

/// The engine `md` is served with, as core chooses it ([`engine_choice::choose_engine`], over
/// the built-in providers' registrations at `now`, limited to `forced` when given): `md`
/// with `spec.engine.type` set to it, and the engine with how it was chosen.
pub fn resolve_engine(
    md: &ModelDeployment,
    forced: Option<&str>,
    builtins: &BuiltIns,
    now: Timestamp,
) -> Result<(ModelDeployment, String), String> {
    let mut asked = md.clone();
    if let Some(name) = forced {
        asked.spec.provider.get_or_insert_default().name = Some(name.to_string());
    }
    let configs = builtins.registered(now);
    let choice = engine_choice::choose_engine(
        &asked,
        &configs,
        &RuleCache::default(),
        &selection::Settings::default(),
        now,
    );
    let engine = choice.engine().ok_or_else(|| choice.to_string())?;
    Ok((engine_choice::with_engine(md, engine), choice.to_string()))
}

/// The objects the chosen provider applies for `md`, or the message the provider's
/// status would carry instead.
pub fn preview(
    md: &ModelDeployment,
    forced: Option<&str>,
    builtins: &BuiltIns,
    crds: &UpstreamCrds,
    now: Timestamp,
) -> Result<Preview, String> {
    let (resolved, engine) = resolve_engine(md, forced, builtins, now)?;
    let md = &resolved;
    let (name, reason) = choose(md, forced, builtins, now)?;
    let provider = builtins.get(&name).ok_or_else(|| {
        format!(
            "provider '{name}' is not built in; render knows {} (a third-party provider's objects come from its own binary)",
            NAMES.join(", ")
        )
    })?;
    let fail = |message: String| format!("{name}: {message}");
    // As the provider's runtime decides: its capabilities, then its own check.
    kubeairunway_sdk::runtime::fit::check(provider, md).map_err(|e| fail(e.0))?;
    let wanted = provider.upstream();
    let crd = crds
        .get(&wanted.crd_name())
        .map_err(|e| fail(format!("{e:#}")))?;
    let mut notes = Vec::new();
    let api = match crd {
        Some(crd) => UpstreamApi::detect(&crd, &wanted).map_err(|e| fail(e.to_string()))?,
        None if !wanted.group.contains('.') => {
            // A CRD's group has a dot (apiextensions validation), so this is one of
            // Kubernetes' own kinds (`apps/v1` Deployment): its schema is the cluster's
            // OpenAPI document, which a preview has not got.
            notes.push(format!(
                "Preview: {} is a built-in kind; its fields are checked against the cluster's \
                 OpenAPI schema when applied, not here",
                wanted.kind
            ));
            let version = wanted.versions.first().cloned().unwrap_or_default();
            UpstreamApi::new(
                &wanted,
                &version,
                serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            )
        }
        None => {
            return Err(fail(format!(
                "no {} CRD to render against: pass --upstream-crd FILE",
                wanted.crd_name()
            )));
        }
    };
    let rendered = provider.render(md, &api).map_err(|e| fail(e.0))?;
    if rendered.objects.is_empty() {
        return Err(fail("the provider rendered no objects".into()));
    }
    let objects = kubeairunway_sdk::render::finalize(provider, md, &api, rendered.objects)
        .map_err(|e| fail(e.to_string()))?;
    Ok(Preview {
        engine,
        provider: name,
        reason,
        objects,
        warnings: rendered
            .warnings
            .iter()
            .map(|w| format!("{}: {}", w.reason, w.message))
            .chain(notes)
            .collect(),
    })
}

/// What core's gateway makes for `md` served by `provider` (`name`), routed from
/// `gateway`: the provider's serving pods written into the status as its runtime writes
/// them, with the endpoint it will report, then the gateway's decision with every API
/// served. Empty unless `spec.gateway.enabled`.
pub fn gateway_objects(
    md: &ModelDeployment,
    provider: &dyn kubeairunway_sdk::Provider,
    gateway: &GatewayRef,
) -> Result<Vec<DynamicObject>, String> {
    if !decide::enabled(md.spec.gateway.as_ref()) {
        return Ok(Vec::new());
    }
    let pods = provider.serving_pods(md);
    let mut md = md.clone();
    let status = md.status.get_or_insert_with(Default::default);
    let endpoint = status.endpoint.get_or_insert_with(Default::default);
    pods.fill(&mut status.selector, Some(endpoint));
    let gateways = [serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"namespace": gateway.0, "name": gateway.1},
    })];
    let decision = decide::decide(&Inputs {
        md: &md,
        apis: Apis {
            inference_pool: true,
            http_route: true,
        },
        gateways: &gateways,
        user_route: None,
        live: &[],
        flag: Some(gateway),
    });
    if decision.objects.is_empty()
        && let Some((_, reason, message)) = decision.ready
    {
        return Err(format!("gateway: {reason}: {message}"));
    }
    decision
        .objects
        .into_iter()
        .map(|o| serde_json::from_value(o).map_err(|e| format!("gateway: {e}")))
        .collect()
}

pub(crate) fn read_input(path: &PathBuf) -> anyhow::Result<(String, String)> {
    use anyhow::Context as _;
    if path.as_os_str() == "-" {
        let text = std::io::read_to_string(std::io::stdin()).context("reading standard input")?;
        return Ok((text, "<stdin>".into()));
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok((text, path.display().to_string()))
}

/// Run `render`.
pub fn run(args: &Args, term: &mut Terminal) -> anyhow::Result<i32> {
    let crds = UpstreamCrds::with_files(&args.upstream_crds)?;
    let builtins = BuiltIns::for_crds(&args.providers, &crds)?;
    let now = Timestamp::now();
    let mut objects = Vec::new();
    let mut table = Table::new(&["MODELDEPLOYMENT", "PROVIDER", "KIND", "NAME", "APIVERSION"]);
    let mut failed = false;
    for file in &args.files {
        let (text, origin) = read_input(file)?;
        for doc in manifest::read(&text, &origin, &args.namespace)? {
            let loaded = match doc.result {
                Ok(loaded) => loaded,
                Err(problems) => {
                    failed = true;
                    term.err(&format!(
                        "error: {} is not a valid ModelDeployment:\n  {}\n",
                        doc.origin,
                        problems.join("\n  ")
                    ));
                    continue;
                }
            };
            let md = &loaded.md;
            let id = format!("{}/{}", md.namespace().unwrap_or_default(), md.name_any());
            for w in &loaded.warnings {
                term.err(&format!("warning: {id}: {w}\n"));
            }
            let previewed = preview(md, args.provider.as_deref(), &builtins, &crds, now);
            let previewed = previewed.and_then(|mut p| {
                if let (Some(gateway), Some(provider)) = (&args.gateway, builtins.get(&p.provider))
                {
                    p.objects.extend(gateway_objects(md, provider, gateway)?);
                }
                Ok(p)
            });
            match previewed {
                Ok(p) => {
                    term.err(&format!(
                        "# {id}: engine {}, provider {} ({})\n",
                        p.engine, p.provider, p.reason
                    ));
                    for w in &p.warnings {
                        term.err(&format!("warning: {id}: {w}\n"));
                    }
                    for o in &p.objects {
                        let types = o.types.clone().unwrap_or_default();
                        table.row(vec![
                            id.clone(),
                            p.provider.clone(),
                            types.kind,
                            o.name_any(),
                            types.api_version,
                        ]);
                    }
                    objects.extend(p.objects);
                }
                Err(message) => {
                    failed = true;
                    term.err(&format!("error: {id} ({}): {message}\n", doc.origin));
                }
            }
        }
    }
    term.out(&print(&objects, &table, args.output)?);
    Ok(if failed { crate::terminal::FAILURE } else { 0 })
}

fn print(objects: &[DynamicObject], table: &Table, format: Format) -> anyhow::Result<String> {
    if objects.is_empty() {
        return Ok(String::new());
    }
    Ok(match format {
        Format::Yaml => {
            let mut out = String::new();
            for o in objects {
                out.push_str("---\n");
                out.push_str(&output::yaml(o)?);
            }
            out
        }
        Format::Json if objects.len() == 1 => output::json(&objects[0])?,
        Format::Json => output::json(&serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": objects,
        }))?,
        Format::Table => table.render(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::labels;

    fn md(yaml: &str) -> ModelDeployment {
        let mut docs = manifest::read(yaml, "t", "default").unwrap();
        docs.remove(0).result.unwrap().md
    }

    fn sample(name: &str) -> ModelDeployment {
        let sample = kubeairunway_config::samples::all()
            .into_iter()
            .find(|s| s.name == name)
            .unwrap();
        md(&serde_json::to_string(&sample.manifest).unwrap())
    }

    fn now() -> Timestamp {
        "2026-06-01T00:00:00Z".parse().unwrap()
    }

    /// The refusal of the sample `name` rendered by `provider`.
    fn refusal(name: &str, provider: &str, builtins: &BuiltIns, crds: &UpstreamCrds) -> String {
        preview(&sample(name), Some(provider), builtins, crds, now()).unwrap_err()
    }

    /// With a Gateway named, a ModelDeployment with spec.gateway.enabled also shows the
    /// gateway's objects, over the serving pods its provider names; for Dynamo, whose
    /// operator makes the pool, only the route to it.
    #[test]
    fn the_gateway_objects_follow_the_providers_serving_pods() {
        let crds = UpstreamCrds::default();
        let builtins = BuiltIns::for_crds(&ProviderFlags::default(), &crds).unwrap();
        let gateway = ("infra".to_string(), "inference".to_string());
        let mut m = sample("cpu-llamacpp");
        m.spec.gateway =
            Some(serde_json::from_value(serde_json::json!({"enabled": true})).unwrap());
        let kaito = builtins.get("kaito").unwrap();
        let objects = gateway_objects(&m, kaito, &gateway).unwrap();
        let kinds: Vec<_> = objects
            .iter()
            .map(|o| o.types.clone().unwrap().kind)
            .collect();
        assert_eq!(kinds.first().map(String::as_str), Some("InferencePool"));
        assert_eq!(kinds.last().map(String::as_str), Some("HTTPRoute"));
        let pool = serde_json::to_value(&objects[0]).unwrap();
        assert_eq!(
            pool["spec"]["selector"]["matchLabels"],
            serde_json::json!(kaito.serving_pods(&m).labels)
        );
        assert_eq!(pool["spec"]["targetPorts"][0]["number"], 5000);
        let route = serde_json::to_value(objects.last().unwrap()).unwrap();
        assert_eq!(route["spec"]["parentRefs"][0]["namespace"], "infra");
        // Dynamo's operator makes its own pool: only the route, to `<name>-pool`.
        let dynamo = gateway_objects(&m, builtins.get("dynamo").unwrap(), &gateway).unwrap();
        assert_eq!(dynamo.len(), 1);
        let route = serde_json::to_value(&dynamo[0]).unwrap();
        assert_eq!(route["kind"], "HTTPRoute");
        assert_eq!(
            route["spec"]["rules"][0]["backendRefs"][0]["name"],
            format!("{}-pool", m.metadata.name.as_deref().unwrap())
        );
        m.spec.gateway = None;
        assert!(gateway_objects(&m, kaito, &gateway).unwrap().is_empty());
    }

    #[test]
    fn selection_is_core_s_over_the_built_in_registrations() {
        let crds = UpstreamCrds::default();
        let builtins = BuiltIns::for_crds(&ProviderFlags::default(), &crds).unwrap();
        let gpu = preview(&sample("gpu-vllm"), None, &builtins, &crds, now()).unwrap();
        assert_eq!(gpu.provider, "dynamo");
        assert!(
            gpu.reason
                .starts_with("matched capabilities: engine=vllm, gpu=true"),
            "{}",
            gpu.reason
        );
        assert_eq!(gpu.engine, "vllm (explicit)");
        let cpu = preview(&sample("cpu-llamacpp"), None, &builtins, &crds, now()).unwrap();
        assert_eq!(cpu.provider, "kaito");
        // No engine: chosen as core chooses it, and said so.
        let auto = preview(&sample("auto-engine"), None, &builtins, &crds, now()).unwrap();
        assert_eq!(
            (auto.engine.as_str(), auto.provider.as_str()),
            (
                "vllm (auto: first of vllm, sglang, trtllm, llamacpp that a provider serves \
                 (gpu=true (one by default), mode=aggregated): provider dynamo)",
                "dynamo"
            )
        );
        let graph = &auto.objects[0];
        assert_eq!(graph.types.as_ref().unwrap().kind, "DynamoGraphDeployment");
        assert!(
            serde_json::to_string(&graph.data)
                .unwrap()
                .contains(r#""nvidia.com/gpu":"1""#),
            "the engine's default GPU is rendered: {graph:?}"
        );
        let named = preview(
            &sample("disaggregated-kv-routing"),
            None,
            &builtins,
            &crds,
            now(),
        )
        .unwrap();
        assert_eq!(
            (named.provider.as_str(), named.reason.as_str()),
            ("dynamo", "explicit provider selection")
        );
    }

    #[test]
    fn objects_are_finished_as_the_runtime_finishes_them() {
        let crds = UpstreamCrds::default();
        let builtins = BuiltIns::for_crds(&ProviderFlags::default(), &crds).unwrap();
        let p = preview(&sample("gpu-vllm"), Some("kaito"), &builtins, &crds, now()).unwrap();
        let kinds: Vec<String> = p
            .objects
            .iter()
            .map(|o| o.types.clone().unwrap().kind)
            .collect();
        assert_eq!(kinds, ["Workspace", "ConfigMap"]);
        assert!(p.objects[0].annotations().contains_key(labels::IDENTITY));
        assert!(!p.objects[1].annotations().contains_key(labels::IDENTITY));
        for o in &p.objects {
            assert_eq!(o.labels()[labels::PROVIDER], "kaito");
            assert_eq!(o.namespace().as_deref(), Some("default"));
        }
    }

    /// `render` goes through the runtime's `finalize`, so it shows the overrides merged, and
    /// refuses them as the provider's status would.
    #[test]
    fn overrides_are_merged_and_checked_as_the_runtime_does() {
        let crds = UpstreamCrds::default();
        let builtins = BuiltIns::for_crds(&ProviderFlags::default(), &crds).unwrap();
        let with = |overrides: serde_json::Value| {
            let mut m = sample("cpu-llamacpp");
            m.spec.provider = Some(
                serde_json::from_value(
                    serde_json::json!({"name": "kaito", "overrides": overrides}),
                )
                .unwrap(),
            );
            preview(&m, None, &builtins, &crds, now())
        };
        let p = with(serde_json::json!({"resource": {"count": 10}})).unwrap();
        assert_eq!(p.objects[0].data["resource"]["count"], 10);
        let err = with(serde_json::json!({"resource": {"cuont": 10}})).unwrap_err();
        assert!(
            err.starts_with("kaito: override is not accepted by the installed Workspace")
                && err.contains("provider.overrides.resource.cuont (no such field)"),
            "{err}"
        );
        let err = with(serde_json::json!({"metadata": {"name": "x"}})).unwrap_err();
        assert!(
            err.contains("provider.overrides.metadata.name may not be overridden"),
            "{err}"
        );
        // Dynamo's typed settings are no fields of a RayService.
        let err = refusal("disaggregated-kv-routing", "kuberay", &builtins, &crds);
        assert!(
            err.contains(
                "provider.overrides.frontend (no such field), provider.overrides.routerMode (no such field)"
            ),
            "{err}"
        );
    }

    #[test]
    fn what_a_provider_cannot_serve_is_its_own_message() {
        let crds = UpstreamCrds::default();
        let builtins = BuiltIns::for_crds(&ProviderFlags::default(), &crds).unwrap();
        let err = preview(
            &sample("cpu-llamacpp"),
            Some("kuberay"),
            &builtins,
            &crds,
            now(),
        )
        .unwrap_err();
        assert_eq!(
            err,
            "kuberay: spec.engine.type is llamacpp, which provider kuberay does not support: it serves the engines vllm"
        );

        let third_party = md(
            "apiVersion: kubeairunway.ai/v1alpha1\nkind: ModelDeployment\nmetadata: {name: m}\nspec: {model: {id: a/b}, engine: {type: llamacpp}, provider: {name: mine}}\n",
        );
        let err = preview(&third_party, None, &builtins, &crds, now()).unwrap_err();
        assert!(err.starts_with("provider 'mine' is not built in"), "{err}");
    }

    /// The Deployment provider's upstream is a built-in kind: rendered without a CRD, with
    /// a note that the cluster checks its fields; never chosen over an operator unnamed.
    #[test]
    fn the_deployment_provider_renders_without_a_crd() {
        let crds = UpstreamCrds::default();
        let builtins = BuiltIns::for_crds(&ProviderFlags::default(), &crds).unwrap();
        let gpu = sample("gpu-vllm");
        assert_eq!(
            preview(&gpu, None, &builtins, &crds, now())
                .unwrap()
                .provider,
            "dynamo"
        );
        let p = preview(&gpu, Some("deployment"), &builtins, &crds, now()).unwrap();
        let kinds: Vec<&str> = p
            .objects
            .iter()
            .filter_map(|o| o.types.as_ref())
            .map(|t| t.kind.as_str())
            .collect();
        assert_eq!(kinds, ["Deployment", "Service"]);
        assert_eq!(
            p.objects[0].data["spec"]["template"]["metadata"]["labels"][labels::MODEL_DEPLOYMENT],
            gpu.metadata.name.clone().unwrap()
        );
        assert!(
            p.warnings
                .iter()
                .any(|w| w.starts_with("Preview: Deployment is a built-in kind")),
            "{:?}",
            p.warnings
        );
    }

    #[test]
    fn a_crd_without_a_rendered_field_refuses_as_the_runtime_does() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("old.yaml");
        let mut crd: serde_json::Value =
            serde_json::to_value(crate::crds::bundled("rayservices.ray.io").unwrap().unwrap())
                .unwrap();
        for v in crd["spec"]["versions"].as_array_mut().unwrap() {
            let spec = &mut v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
            spec.as_object_mut().unwrap().remove("serveConfigV2");
        }
        std::fs::write(&file, serde_json::to_string(&crd).unwrap()).unwrap();
        let crds = UpstreamCrds::with_files(&[&file]).unwrap();
        let builtins = BuiltIns::for_crds(&ProviderFlags::default(), &crds).unwrap();
        let err = refusal("gpu-vllm", "kuberay", &builtins, &crds);
        assert!(
            err.starts_with("kuberay: installed rayservices.ray.io v1 (schema ")
                && err.ends_with("has no field spec.serveConfigV2; nothing was applied"),
            "{err}"
        );
    }

    #[test]
    fn yaml_and_json_output_hold_the_same_objects() {
        let crds = UpstreamCrds::default();
        let builtins = BuiltIns::for_crds(&ProviderFlags::default(), &crds).unwrap();
        let p = preview(
            &sample("gpu-vllm"),
            Some("kuberay"),
            &builtins,
            &crds,
            now(),
        )
        .unwrap();
        let table = Table::default();
        let yaml = print(&p.objects, &table, Format::Yaml).unwrap();
        let back: Vec<DynamicObject> = serde_saphyr::from_multiple(&yaml).unwrap();
        assert_eq!(back, p.objects);
        let json = print(&p.objects, &table, Format::Json).unwrap();
        let back: DynamicObject = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p.objects[0]);
    }
}
