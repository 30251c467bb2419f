//! `kubeairunway explain md NAME`: one screen on a ModelDeployment: its status; why its
//! provider (every registered provider's health, capability fit and selection rules as
//! selection evaluates them now, and the winner); its conditions, recent events, and the
//! upstream object with its state.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use kubeairunway_sdk::engine_choice;
use kubeairunway_sdk::selection::{self, Outcome, RuleCache, Standing};
use kubeairunway_sdk::{InferenceProviderConfig, ModelDeployment};
use serde::Serialize;
use serde_json::Value;

use crate::Terminal;
use crate::builtin::BuiltIns;
use crate::cluster;
use crate::output::{self, Format, Table, or_dash};
use crate::providers::install_lines;

/// `explain`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to explain: `md` (a ModelDeployment).
    #[arg(value_parser = ["md", "modeldeployment", "modeldeployments", "modeldeployment.kubeairunway.ai"], hide_possible_values = false)]
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Its namespace (default: the kubeconfig context's).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Kubeconfig of the cluster (default: KUBECONFIG, the local cluster of `up`, then
    /// ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Format,
}

/// Everything `explain` shows.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// `namespace/name`.
    pub model_deployment: String,
    /// `status.phase`.
    pub phase: Option<String>,
    /// `status.message`.
    pub message: Option<String>,
    /// `status.provider.name`.
    pub provider: Option<String>,
    /// `status.provider.selectedReason`.
    pub selected_reason: Option<String>,
    /// `spec.provider.name`.
    pub named_provider: Option<String>,
    /// `service:port`.
    pub endpoint: Option<String>,
    /// `ready/desired`.
    pub replicas: Option<String>,
    /// The provider it has (or names) is not registered: what to do.
    pub provider_missing: Option<String>,
    /// `status.engine`: the engine and why (`vllm: explicit engine selection`).
    pub engine: Option<String>,
    /// The engine core chooses now, and how (`llamacpp (auto: ...)`).
    pub engine_now: String,
    /// Selection as it evaluates now: one entry per serving provider.
    pub selection: Vec<ProviderVerdict>,
    /// What selection decides now.
    pub selection_now: String,
    /// Registered capability providers (never selected to serve).
    pub capability_providers: Vec<String>,
    /// `status.conditions`.
    pub conditions: Vec<ConditionLine>,
    /// Recent events about it, oldest first.
    pub events: Vec<EventLine>,
    /// The upstream object.
    pub upstream: Option<Upstream>,
}

/// One serving provider in selection.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderVerdict {
    /// Provider.
    pub name: String,
    /// Ready with a fresh heartbeat, or why not.
    pub health: String,
    /// Heartbeat age.
    pub heartbeat_age: Option<String>,
    /// `fits`, or the capability that does not.
    pub capabilities: String,
    /// Each rule: `` `condition` priority N: value ``.
    pub rules: Vec<String>,
    /// Its score (the priority of its highest true rule).
    pub score: Option<i32>,
    /// In a word: where it stands.
    pub standing: String,
}

/// A condition.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionLine {
    /// Type.
    #[serde(rename = "type")]
    pub type_: String,
    /// Status.
    pub status: String,
    /// Reason.
    pub reason: String,
    /// Age of the last transition.
    pub age: String,
    /// Message.
    pub message: String,
}

/// An event.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventLine {
    /// Age.
    pub age: String,
    /// Normal or Warning.
    #[serde(rename = "type")]
    pub type_: String,
    /// Reason.
    pub reason: String,
    /// Who reported it.
    pub from: String,
    /// What happened.
    pub note: String,
}

/// The upstream object.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Upstream {
    /// `Kind/name`.
    pub object: String,
    /// Its apiVersion, when found.
    pub api_version: Option<String>,
    /// Whether it exists.
    pub exists: bool,
    /// Its state, in lines (`state: Pending`, `Ready=False (Reason): message`).
    pub state: Vec<String>,
}

/// The standing of the provider selection picks.
const WINS: &str = "wins";

/// Run `explain`.
pub async fn run(args: Args, state_dir: &Path, term: &mut Terminal) -> anyhow::Result<i32> {
    let target = cluster::connect(args.kubeconfig.as_deref(), state_dir).await?;
    let client = target.client;
    let ns = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let md = fetch(&client, &ns, &args.name).await?;
    let e = describe(&client, &md).await?;
    term.out(&match args.output {
        Format::Table => text(&e),
        Format::Yaml => output::yaml(&e)?,
        Format::Json => output::json(&e)?,
    });
    Ok(0)
}

/// The explanation of `md`: the registered providers, its recent events and its upstream
/// object read from the cluster, then [`explanation`].
///
/// A user whose rights are in namespaces only may not read the cluster-scoped
/// InferenceProviderConfigs: the rest is explained, and the selection says why it is not.
pub async fn describe(client: &Client, md: &ModelDeployment) -> anyhow::Result<Explanation> {
    let (configs, unreadable) = match crate::providers::list(client).await {
        Ok(configs) => (configs, None),
        Err(e) if matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 403) => {
            (Vec::new(), Some(format!("{e:#}")))
        }
        Err(e) => return Err(e),
    };
    let events = events(client, md).await;
    let upstream = upstream(client, md, &configs).await;
    let mut explained = explanation(md, &configs, &events, upstream, Timestamp::now());
    if let Some(why) = unreadable {
        explained.selection.clear();
        explained.capability_providers.clear();
        explained.provider_missing = None;
        explained.selection_now = format!("not shown: {why}");
    }
    Ok(explained)
}

/// The ModelDeployment, with an actionable error when it or its CRD is missing.
async fn fetch(client: &Client, ns: &str, name: &str) -> anyhow::Result<ModelDeployment> {
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
    // A missing object and a missing CRD both answer 404.
    let missing = match api.get_opt(name).await {
        Ok(Some(md)) => return Ok(md),
        Ok(None) => None,
        Err(kube::Error::Api(s)) if s.code == 404 => Some(s.message),
        Err(e) => return Err(e).with_context(|| format!("reading modeldeployment {ns}/{name}")),
    };
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if let Ok(None) = crds.get_opt("modeldeployments.kubeairunway.ai").await {
        anyhow::bail!(
            "this cluster has no ModelDeployment CRD (modeldeployments.kubeairunway.ai): kubeairunway is not installed; run `kubeairunway up --kubeconfig PATH` or install charts/kubeairunway"
        );
    }
    anyhow::bail!(
        "modeldeployment {ns}/{name} not found{} (`kubectl get md -A` lists them)",
        missing.map_or_else(String::new, |m| format!(": {m}"))
    )
}

/// Recent events about `md` (events.k8s.io/v1), oldest first; none when the cluster
/// does not serve Events.
async fn events(client: &Client, md: &ModelDeployment) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), &md.namespace().unwrap_or_default());
    let Ok(list) = api.list(&ListParams::default()).await else {
        return Vec::new();
    };
    let mut events: Vec<Event> = list
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("ModelDeployment")
                    && r.name.as_deref() == Some(md.name_any().as_str())
                    && (r.uid.is_none() || r.uid == md.uid())
            })
        })
        .collect();
    events.sort_by_key(event_time);
    let skip = events.len().saturating_sub(12);
    events.split_off(skip)
}

fn event_time(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The upstream object `md`'s provider reports, found through discovery in the group of
/// the provider's upstream API.
async fn upstream(
    client: &Client,
    md: &ModelDeployment,
    configs: &[InferenceProviderConfig],
) -> Option<Upstream> {
    let status = md.status.as_ref()?;
    let p = status.provider.as_ref()?;
    let (kind, name) = (p.resource_kind.clone()?, p.resource_name.clone()?);
    let object = format!("{kind}/{name}");
    let group = configs
        .iter()
        .find(|c| Some(c.name_any()) == p.name)
        .and_then(|c| c.status.as_ref()?.upstream_crd_version.clone())
        .and_then(|gv| gv.split_once('/').map(|(g, _)| g.to_string()));
    let found = match group {
        Some(group) => kube::discovery::group(client, &group)
            .await
            .ok()
            .and_then(|g| g.recommended_kind(&kind)),
        None => None,
    };
    let Some((resource, _)) = found else {
        return Some(Upstream {
            object,
            api_version: None,
            exists: false,
            state: vec![
                "its API is not served by this cluster (is the upstream CRD installed?)".into(),
            ],
        });
    };
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &md.namespace().unwrap_or_default(),
        &resource,
    );
    let live = api.get_opt(&name).await.ok().flatten();
    Some(Upstream {
        object,
        api_version: Some(resource.api_version.clone()),
        exists: live.is_some(),
        state: live.map_or_else(
            || vec!["not found (being created or deleted)".into()],
            |o| upstream_state(&o, p.name.as_deref().unwrap_or("its")),
        ),
    })
}

/// The upstream object's state, in lines: `state`, `serviceStatus`, and its conditions.
pub fn upstream_state(object: &DynamicObject, provider: &str) -> Vec<String> {
    let status = object
        .data
        .get("status")
        .filter(|s| s.as_object().is_some_and(|m| !m.is_empty()));
    let Some(status) = status else {
        return vec![format!(
            "no status: no operator has acted on it yet (is the {provider} operator installed? `kubeairunway providers` says how)"
        )];
    };
    let mut lines = Vec::new();
    for key in ["state", "serviceStatus", "phase"] {
        if let Some(v) = status.get(key).and_then(Value::as_str) {
            lines.push(format!("{key}: {v}"));
        }
    }
    for c in status
        .get("conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default();
        lines.push(format!(
            "{}={} ({}): {}",
            s("type"),
            s("status"),
            s("reason"),
            s("message")
        ));
    }
    if lines.is_empty() {
        lines.push(format!("status: {status}"));
    }
    lines
}

/// The engine core chooses for `md` now ([`engine_choice::choose_engine`]) and how, with `md`
/// as provider selection sees it (`spec.engine.type` set to that engine, when any).
fn engine_now(
    md: &ModelDeployment,
    configs: &[Arc<InferenceProviderConfig>],
    now: Timestamp,
) -> (ModelDeployment, String) {
    let choice = engine_choice::choose_engine(
        md,
        configs,
        &RuleCache::default(),
        &selection::Settings::default(),
        now,
    );
    let resolved = match choice.engine() {
        Some(engine) => engine_choice::with_engine(md, engine),
        None => md.clone(),
    };
    (resolved, choice.to_string())
}

/// Build the explanation (pure: everything was read before).
pub fn explanation(
    md: &ModelDeployment,
    configs: &[InferenceProviderConfig],
    events: &[Event],
    upstream: Option<Upstream>,
    now: Timestamp,
) -> Explanation {
    let status = md.status.clone().unwrap_or_default();
    let provider = status.provider.clone().unwrap_or_default();
    let configs: Vec<Arc<InferenceProviderConfig>> =
        configs.iter().cloned().map(Arc::new).collect();
    let (resolved, engine_now) = engine_now(md, &configs, now);
    let md = &resolved;
    let verdicts = selection::evaluate(
        md,
        &configs,
        &RuleCache::default(),
        &selection::Settings::default(),
        now,
    );
    let decided = selection::decide(md, &verdicts);
    let winner = match &decided.outcome {
        Outcome::Selected { provider, .. } => Some(provider.clone()),
        _ => None,
    };
    let selection_now = match decided.outcome {
        Outcome::Selected {
            provider, reason, ..
        } => format!("{provider} ({reason})"),
        Outcome::NoneFits { message } => message,
        Outcome::NoHealthyProviders { detail } => {
            format!("{}: {detail}", selection::NO_HEALTHY_PROVIDERS)
        }
    };
    let heartbeat = |name: &str| {
        configs
            .iter()
            .find(|c| c.name_any() == name)
            .and_then(|c| c.status.as_ref()?.last_heartbeat.as_ref())
            .map(|t| output::age(t.0, now))
    };
    let selection = verdicts
        .iter()
        .map(|v| {
            let (health, capabilities) = match &v.standing {
                Standing::Unhealthy(r) => (r.clone(), "-".to_string()),
                Standing::DoesNotFit(r) => ("ready".into(), format!("do not fit: {r}")),
                _ => ("ready".into(), "fit".into()),
            };
            let standing = match &v.standing {
                Standing::Matched { priority, .. }
                    if winner.as_deref() == Some(v.provider.as_str()) =>
                {
                    format!("{WINS} (priority {priority})")
                }
                Standing::Unhealthy(_) => "not a candidate (unhealthy)".into(),
                Standing::DoesNotFit(_) => "not a candidate (capabilities)".into(),
                Standing::NoRules => "no selection rules: serves only when named".into(),
                Standing::NoRuleMatched => "no selection rule is true".into(),
                Standing::Matched { priority, .. } => format!("lost with priority {priority}"),
            };
            ProviderVerdict {
                name: v.provider.clone(),
                health,
                heartbeat_age: heartbeat(&v.provider),
                capabilities,
                rules: v
                    .rules
                    .iter()
                    .map(|r| {
                        format!(
                            "`{}` priority {}: {}",
                            r.condition,
                            r.priority,
                            match &r.value {
                                Ok(b) => b.to_string(),
                                Err(e) => format!("error: {e}"),
                            }
                        )
                    })
                    .collect(),
                score: v.priority(),
                standing,
            }
        })
        .collect();
    let capability_providers = configs
        .iter()
        .filter(|c| !c.spec.serves())
        .map(|c| {
            format!(
                "{} ({}, {})",
                c.name_any(),
                crate::providers::serves(c.spec.capabilities.as_ref()),
                if c.status.as_ref().and_then(|s| s.ready) == Some(true) {
                    "ready"
                } else {
                    "not ready"
                }
            )
        })
        .collect();
    let named = md.spec.provider_name().map(str::to_string);
    let wanted = provider.name.clone().or_else(|| named.clone());
    let provider_missing = wanted
        .filter(|w| !configs.iter().any(|c| &c.name_any() == w))
        .map(|w| missing_provider(&w));
    Explanation {
        model_deployment: format!("{}/{}", md.namespace().unwrap_or_default(), md.name_any()),
        phase: status.phase.map(|p| p.to_string()),
        message: status.message.clone(),
        provider: provider.name.clone(),
        selected_reason: provider.selected_reason.clone(),
        named_provider: named,
        endpoint: status.endpoint.as_ref().map(|e| {
            format!(
                "{}:{}",
                e.service.clone().unwrap_or_default(),
                e.port.map_or_else(String::new, |p| p.to_string())
            )
        }),
        replicas: status.replicas.as_ref().map(|r| {
            format!(
                "{}/{} ready",
                r.ready.unwrap_or_default(),
                r.desired.unwrap_or_default()
            )
        }),
        provider_missing,
        engine: status.engine.as_ref().and_then(|e| {
            let engine = e.type_?;
            Some(match &e.selected_reason {
                Some(reason) => format!("{engine}: {reason}"),
                None => engine.to_string(),
            })
        }),
        engine_now,
        selection,
        selection_now,
        capability_providers,
        conditions: status
            .conditions
            .iter()
            .map(|c| ConditionLine {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                age: output::age(c.last_transition_time.0, now),
                message: c.message.clone(),
            })
            .collect(),
        events: events
            .iter()
            .map(|e| EventLine {
                age: event_time(e).map_or_else(|| "-".into(), |t| output::age(t, now)),
                type_: or_dash(e.type_.as_ref()),
                reason: or_dash(e.reason.as_ref()),
                from: or_dash(e.reporting_controller.as_ref()),
                note: e.note.clone().unwrap_or_default(),
            })
            .collect(),
        upstream,
    }
}

/// What to do about a provider that has no InferenceProviderConfig.
fn missing_provider(name: &str) -> String {
    let builtins = BuiltIns::defaults();
    let hint = builtins
        .get(name)
        .and_then(|p| p.config().installation)
        .map(|i| install_lines(&i).join("; "))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| {
            "install its controller (a provider registers itself when it starts)".into()
        });
    format!(
        "provider '{name}' is not registered in this cluster (no InferenceProviderConfig '{name}'): {hint}"
    )
}

/// The explanation as text for a person.
pub fn text(e: &Explanation) -> String {
    let mut out = format!("ModelDeployment {}\n", e.model_deployment);
    let field = |out: &mut String, label: &str, value: Option<&String>| {
        if let Some(v) = value {
            let _ = writeln!(out, "  {label:<10}{v}");
        }
    };
    field(&mut out, "Phase:", e.phase.as_ref());
    field(&mut out, "Message:", e.message.as_ref());
    let provider = e.provider.as_ref().map(|p| match &e.selected_reason {
        Some(r) => format!("{p} ({r})"),
        None => p.clone(),
    });
    field(
        &mut out,
        "Provider:",
        Some(&provider.unwrap_or_else(|| "none selected yet".into())),
    );
    let engine = e
        .engine
        .clone()
        .unwrap_or_else(|| "none recorded yet".into());
    field(&mut out, "Engine:", Some(&engine));
    // As core would choose it now: the same function, over the same registrations.
    field(&mut out, "", Some(&format!("now: engine {}", e.engine_now)));
    field(&mut out, "Endpoint:", e.endpoint.as_ref());
    field(&mut out, "Replicas:", e.replicas.as_ref());
    if let Some(m) = &e.provider_missing {
        let _ = writeln!(out, "  ! {m}");
    }

    let winner = e
        .selection
        .iter()
        .find(|v| v.standing.starts_with(WINS))
        .map(|v| v.name.clone());
    let why = match (&e.named_provider, &e.provider) {
        (Some(n), _) => format!(
            "\nWhy {n}: spec.provider.name names it. Selection by rules (not used for it) would pick now: {}\n",
            winner.as_deref().unwrap_or(&e.selection_now)
        ),
        (None, Some(p)) => format!(
            "\nWhy {p}: selection chose it (selection runs once; evaluated again now{}):\n",
            match &winner {
                Some(w) if w != p => format!(", the rules would pick {w}"),
                Some(_) => String::new(),
                None => format!(": {}", e.selection_now),
            }
        ),
        (None, None) => format!("\nWhy no provider: {}\n", e.selection_now),
    };
    out.push_str(&why);
    if e.selection.is_empty() {
        out.push_str("  no serving provider is registered (`kubeairunway providers` says how to install one)\n");
    }
    for v in &e.selection {
        let heartbeat = v
            .heartbeat_age
            .as_ref()
            .map_or_else(String::new, |a| format!(", heartbeat {a} ago"));
        let _ = writeln!(
            out,
            "  {}: {}{heartbeat}; capabilities {}; {}",
            v.name, v.health, v.capabilities, v.standing
        );
        for r in &v.rules {
            let _ = writeln!(out, "    rule {r}");
        }
    }
    if !e.capability_providers.is_empty() {
        let _ = writeln!(
            out,
            "  capability providers (never selected to serve): {}",
            e.capability_providers.join("; ")
        );
    }

    out.push_str("\nConditions:\n");
    if e.conditions.is_empty() {
        out.push_str("  none\n");
    } else {
        let mut t = Table::new(&["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]);
        for c in &e.conditions {
            t.row(vec![
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.age.clone(),
                c.message.clone(),
            ]);
        }
        out.push_str(&indent(&t.render()));
    }
    out.push_str("\nEvents:\n");
    if e.events.is_empty() {
        out.push_str("  none\n");
    } else {
        let mut t = Table::new(&["AGE", "TYPE", "REASON", "FROM", "MESSAGE"]);
        for ev in &e.events {
            t.row(vec![
                ev.age.clone(),
                ev.type_.clone(),
                ev.reason.clone(),
                ev.from.clone(),
                ev.note.clone(),
            ]);
        }
        out.push_str(&indent(&t.render()));
    }
    out.push_str("\nUpstream object:\n");
    match &e.upstream {
        None => out.push_str("  none yet\n"),
        Some(u) => {
            let _ = writeln!(
                out,
                "  {}{}",
                u.object,
                u.api_version
                    .as_ref()
                    .map_or_else(String::new, |v| format!(" ({v})"))
            );
            for line in &u.state {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    out
}

fn indent(text: &str) -> String {
    text.lines().fold(String::new(), |mut out, l| {
        let _ = writeln!(out, "  {l}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kubeairunway_sdk::InferenceProviderConfigStatus;
    use serde_json::json;

    fn now() -> Timestamp {
        "2026-01-01T00:10:00Z".parse().unwrap()
    }

    fn md(spec: &Value, status: &Value) -> ModelDeployment {
        serde_json::from_value(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    fn registered(ready: &[(&str, bool)]) -> Vec<InferenceProviderConfig> {
        BuiltIns::defaults()
            .registered(now())
            .into_iter()
            .filter_map(|c| {
                let (_, r) = ready.iter().find(|(n, _)| *n == c.name_any())?;
                let mut c = (*c).clone();
                c.status = Some(InferenceProviderConfigStatus {
                    ready: Some(*r),
                    last_heartbeat: Some(Time("2026-01-01T00:09:55Z".parse().unwrap())),
                    ..Default::default()
                });
                Some(c)
            })
            .collect()
    }

    #[test]
    fn every_provider_says_where_it_stands() {
        let m = md(
            &json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
            &json!({"phase": "Deploying", "provider": {"name": "kaito", "selectedReason": "r"}}),
        );
        let configs = registered(&[("dynamo", true), ("kaito", true), ("kuberay", false)]);
        let e = explanation(&m, &configs, &[], None, now());
        let standings: Vec<(&str, &str, &str)> = e
            .selection
            .iter()
            .map(|v| {
                (
                    v.name.as_str(),
                    v.capabilities.as_str(),
                    v.standing.as_str(),
                )
            })
            .collect();
        assert_eq!(
            standings,
            [
                (
                    "dynamo",
                    "do not fit: engine llamacpp not supported",
                    "not a candidate (capabilities)"
                ),
                ("kaito", "fit", "wins (priority 100)"),
                ("kuberay", "-", "not a candidate (unhealthy)"),
            ]
        );
        assert_eq!(e.selection[0].heartbeat_age.as_deref(), Some("5s"));
        assert!(
            e.selection[1]
                .rules
                .iter()
                .any(|r| r.ends_with("priority 100: true")),
            "{:?}",
            e.selection[1].rules
        );
        assert_eq!(e.selection[1].score, Some(100));
        let t = text(&e);
        assert!(t.contains("  Provider: kaito (r)\n"), "{t}");
        assert!(
            t.contains(
                "\nWhy kaito: selection chose it (selection runs once; evaluated again now):\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("  kaito: ready, heartbeat 5s ago; capabilities fit; wins (priority 100)\n"),
            "{t}"
        );
        assert!(
            t.contains("  kuberay: not ready, heartbeat 5s ago; capabilities -;"),
            "{t}"
        );
        assert!(e.provider_missing.is_none());
    }

    /// The engine as recorded, and as core would choose it now: the same decision as
    /// core's and `render`'s.
    #[test]
    fn the_engine_is_shown_as_recorded_and_as_chosen_now() {
        let configs = registered(&[("dynamo", true), ("kaito", true), ("kuberay", true)]);
        let fresh = md(&json!({"model": {"id": "Qwen/Qwen3-0.6B"}}), &json!({}));
        let t = text(&explanation(&fresh, &configs, &[], None, now()));
        assert!(
            t.contains(
                "  Engine:   none recorded yet
"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "  now: engine vllm (auto: first of vllm, sglang, trtllm, llamacpp that a \
                 provider serves (gpu=true (one by default), mode=aggregated): provider dynamo)\n"
            ),
            "{t}"
        );
        // Selection runs over the chosen engine (vLLM, with its default GPU).
        assert!(t.contains("wins (priority 50)"), "{t}");

        let kept = md(
            &json!({"model": {"id": "Qwen/Qwen3-0.6B"}}),
            &json!({"provider": {"name": "dynamo"}, "engine": {"type": "vllm", "selectedReason": "r"}}),
        );
        let t = text(&explanation(&kept, &configs, &[], None, now()));
        assert!(t.contains("  Engine:   vllm: r\n"), "{t}");
        assert!(t.contains("  now: engine vllm (kept: r)\n"), "{t}");
    }

    #[test]
    fn a_provider_that_is_not_registered_says_how_to_install_it() {
        let m = md(
            &json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}, "provider": {"name": "kuberay"}}),
            &json!({"phase": "Pending"}),
        );
        let e = explanation(&m, &registered(&[("dynamo", true)]), &[], None, now());
        let missing = e.provider_missing.unwrap();
        assert!(
            missing.starts_with("provider 'kuberay' is not registered"),
            "{missing}"
        );
        assert!(missing.contains("helm"), "{missing}");
    }

    #[test]
    fn upstream_state_reads_state_and_conditions() {
        let o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "x/v1", "kind": "K", "metadata": {"name": "m"},
            "status": {"state": "pending", "conditions": [{"type": "Ready", "status": "False", "reason": "Init", "message": "waiting"}]},
        }))
        .unwrap();
        assert_eq!(
            upstream_state(&o, "dynamo"),
            ["state: pending", "Ready=False (Init): waiting"]
        );
        let bare: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "m"}}),
        )
        .unwrap();
        assert!(upstream_state(&bare, "dynamo")[0].starts_with(
            "no status: no operator has acted on it yet (is the dynamo operator installed?"
        ));
    }
}
