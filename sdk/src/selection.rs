//! Provider selection, as pure functions: core runs it on every ModelDeployment without a
//! provider, and previews (`kubeairunway render`, `kubeairunway explain`) run it offline.
//!
//! 1. Candidates: serving providers whose InferenceProviderConfig is `ready` with a fresh
//!    heartbeat and whose capabilities fit the spec (engine, GPU or CPU, serving mode).
//! 2. A candidate's priority is the highest priority among its CEL rules that are true;
//!    a candidate with no true rule is not auto-selected.
//! 3. Highest priority wins; ties break by name.
//!
//! Rules are compiled once per config generation ([`RuleCache`]). A rule that does not
//! compile, or fails when evaluated, is skipped and reported ([`Selection::rule_errors`]);
//! it never stops the selection.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::api::{Capabilities, EngineType, ServingMode};
use crate::{InferenceProviderConfig, ModelDeployment, ModelDeploymentSpec};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

mod rules;

pub(crate) use rules::ENV;
pub use rules::{CompiledRule, RuleCache, RuleError, RuleInput, budget, to_cel};

/// Selection settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A heartbeat older than this makes a provider unhealthy.
    pub heartbeat_max_age: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            heartbeat_max_age: Duration::from_secs(300),
        }
    }
}

/// The outcome of selection for one ModelDeployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A provider was chosen.
    Selected {
        /// Provider name.
        provider: String,
        /// `selectedReason`.
        reason: String,
        /// The winning priority.
        priority: i32,
    },
    /// No serving provider is registered, ready and fresh.
    NoHealthyProviders {
        /// Why each registered provider is unhealthy.
        detail: String,
    },
    /// Healthy providers exist, but none fits.
    NoneFits {
        /// Per provider, why it was not chosen.
        message: String,
    },
}

/// The outcome plus the rule errors met on the way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// What was decided.
    pub outcome: Outcome,
    /// Rules that failed to compile or to evaluate, per provider.
    pub rule_errors: Vec<RuleError>,
    /// The serving providers whose rules all compiled and evaluated cleanly.
    pub clean_providers: Vec<(String, Option<i64>)>,
}

/// `status.provider.selectedReason`, and the `ProviderSelected` message, of a provider
/// named in `spec.provider.name` (core writes it; `testing::select` as core does).
pub const EXPLICIT_REASON: &str = "explicit provider selection";

/// The message of [`Outcome::NoHealthyProviders`].
pub const NO_HEALTHY_PROVIDERS: &str = "No healthy providers available";

/// Why a provider is not healthy, if it is not.
pub fn unhealthy_reason(
    config: &InferenceProviderConfig,
    now: Timestamp,
    max_age: Duration,
) -> Option<String> {
    let status = config.status.as_ref();
    if status.and_then(|s| s.ready) != Some(true) {
        return Some("not ready".into());
    }
    let Some(hb) = status.and_then(|s| s.last_heartbeat.as_ref()) else {
        return Some("no heartbeat".into());
    };
    let age = now.duration_since(hb.0);
    let max = k8s_openapi::jiff::SignedDuration::try_from(max_age).unwrap_or_default();
    if age > max {
        // No age in the message: it must stay the same between reconciles, or every
        // status write would trigger the next one.
        return Some(format!(
            "heartbeat stale (last {}, max age {}s)",
            hb.0,
            max_age.as_secs()
        ));
    }
    None
}

/// Why a provider's capabilities do not fit a spec: the one rule of capability fit, used
/// by selection (a provider that does not fit is no candidate) and by the provider
/// runtime (a ModelDeployment selected for a provider it does not fit is refused before
/// [`crate::Provider::check`] runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Misfit {
    /// `spec.engine.type` is not set (the API requires it).
    EngineUnset {
        /// The engines the provider serves.
        serves: Vec<EngineType>,
    },
    /// `spec.engine.type` is not among the provider's engines.
    Engine {
        /// The spec's engine.
        engine: EngineType,
        /// The engines the provider serves.
        serves: Vec<EngineType>,
    },
    /// The spec asks for GPUs; the provider serves its engine CPU-only alone.
    Gpu {
        /// The spec's engine.
        engine: EngineType,
        /// Where the spec asks for them, with the value (`spec.resources.gpu.count is 2`).
        asked: String,
    },
    /// The spec asks for no GPU; the provider serves its engine on GPUs only.
    CpuOnly {
        /// The spec's engine.
        engine: EngineType,
        /// The field that says so, with the value (`spec.resources.gpu.count is 0`).
        asked: String,
        /// How to ask for GPUs in this serving mode.
        fix: &'static str,
    },
    /// `spec.serving.mode` is not among the serving modes of the provider's engine.
    Mode {
        /// The spec's engine.
        engine: EngineType,
        /// The spec's serving mode.
        mode: ServingMode,
        /// The serving modes the provider serves.
        serves: Vec<ServingMode>,
    },
}

/// The short form, as selection explains why a provider is not a candidate.
impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misfit::EngineUnset { .. } => f.write_str("engine not set"),
            Misfit::Engine { engine, .. } => write!(f, "engine {engine} not supported"),
            Misfit::Gpu { engine, .. } => write!(f, "GPU not supported with {engine}"),
            Misfit::CpuOnly { engine, .. } => write!(f, "CPU-only not supported with {engine}"),
            Misfit::Mode { mode, engine, .. } => {
                write!(f, "serving mode {mode} not supported with {engine}")
            }
        }
    }
}

/// "serves the engines vllm, llamacpp", or "serves no engine".
fn serving<T: std::fmt::Display>(what: &str, items: &[T]) -> String {
    if items.is_empty() {
        return format!("serves no {what}");
    }
    let items: Vec<String> = items.iter().map(ToString::to_string).collect();
    format!("serves the {what}s {}", items.join(", "))
}

impl Misfit {
    /// The message for the user of a ModelDeployment selected for `provider`: which
    /// field, its value, and what the provider serves instead.
    pub fn explain(&self, provider: &str) -> String {
        match self {
            Misfit::EngineUnset { serves } => format!(
                "spec.engine.type is not set and core recorded no engine in status.engine: \
                 provider {provider} {}",
                serving("engine", serves)
            ),
            Misfit::Engine { engine, serves } => format!(
                "spec.engine.type is {engine}, which provider {provider} does not support: \
                 it {}",
                serving("engine", serves)
            ),
            Misfit::Gpu { engine, asked } => format!(
                "{asked}, but provider {provider} does not support GPUs with {engine}: it \
                 serves CPU-only deployments (remove the GPU request)"
            ),
            Misfit::CpuOnly { engine, asked, fix } => format!(
                "{asked} (CPU only), but provider {provider} requires GPU for {engine} ({fix})"
            ),
            Misfit::Mode {
                engine,
                mode,
                serves,
            } => format!(
                "spec.serving.mode is {mode}, which provider {provider} does not support with \
                 {engine}: it {}",
                serving("serving mode", serves)
            ),
        }
    }
}

/// Where a spec asks for GPUs (or asks for none), with the value.
fn gpu_request(spec: &ModelDeploymentSpec) -> String {
    let count = |g: Option<&crate::api::GpuSpec>| g.map_or(0, |g| g.count);
    match spec.serving.mode {
        ServingMode::Aggregated => match spec.resources.as_ref().and_then(|r| r.gpu.as_ref()) {
            Some(gpu) => format!("spec.resources.gpu.count is {}", gpu.count),
            None => "spec.resources.gpu is not set".into(),
        },
        ServingMode::Disaggregated => {
            let role =
                |c: Option<&crate::api::ComponentScaling>| count(c.and_then(|c| c.gpu.as_ref()));
            format!(
                "spec.scaling.prefill.gpu.count is {} and spec.scaling.decode.gpu.count is {}",
                role(spec.scaling.prefill.as_ref()),
                role(spec.scaling.decode.as_ref())
            )
        }
    }
}

/// Whether capabilities fit a spec: its engine, then that engine's capabilities (GPU or
/// CPU-only, serving mode), in that order; `Err` says what does not fit.
pub fn fits(caps: &Capabilities, spec: &ModelDeploymentSpec) -> Result<(), Misfit> {
    let Some(engine) = spec.engine.type_ else {
        return Err(Misfit::EngineUnset {
            serves: caps.engine_names(),
        });
    };
    let Some(served) = caps.engine(engine) else {
        return Err(Misfit::Engine {
            engine,
            serves: caps.engine_names(),
        });
    };
    let gpu = spec.uses_gpu();
    if gpu && !served.gpu_support {
        return Err(Misfit::Gpu {
            engine,
            asked: gpu_request(spec),
        });
    }
    if !gpu && !served.cpu_support {
        return Err(Misfit::CpuOnly {
            engine,
            asked: gpu_request(spec),
            fix: match spec.serving.mode {
                ServingMode::Aggregated => "set resources.gpu.count > 0",
                ServingMode::Disaggregated => {
                    "set scaling.prefill.gpu.count and scaling.decode.gpu.count > 0"
                }
            },
        });
    }
    let mode = spec.serving.mode;
    if !served.serving_modes.contains(&mode) {
        return Err(Misfit::Mode {
            engine,
            mode,
            serves: served.serving_modes,
        });
    }
    Ok(())
}

/// The capability part of `selectedReason`.
pub fn capability_summary(spec: &ModelDeploymentSpec) -> String {
    format!(
        "engine={}, gpu={}, mode={}",
        spec.engine.type_.map_or("unset", |e| e.as_str()),
        spec.uses_gpu(),
        spec.serving.mode
    )
}

/// The start of [`Outcome::NoneFits`]'s message, before the per-provider reasons.
pub(crate) fn none_fits_prefix(spec: &ModelDeploymentSpec) -> String {
    format!("No provider fits ({}): ", capability_summary(spec))
}

/// How one selection rule of a provider evaluated for a ModelDeployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleVerdict {
    /// Index of the rule in `spec.selectionRules`.
    pub index: usize,
    /// The CEL source.
    pub condition: Arc<str>,
    /// Its priority.
    pub priority: i32,
    /// Its value, or why it has none (does not compile, fails, is not a bool).
    pub value: Result<bool, String>,
    /// Whether the rule does not compile (as opposed to failing at evaluation).
    pub compile_error: bool,
}

/// Where a serving provider stands for a ModelDeployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Not ready, no heartbeat or a stale one: not a candidate.
    Unhealthy(String),
    /// Its capabilities do not fit the spec (the one that failed).
    DoesNotFit(String),
    /// It has no selection rules: it serves only when named.
    NoRules,
    /// None of its rules is true.
    NoRuleMatched,
    /// Its highest true rule.
    Matched {
        /// The rule's priority: the provider's score.
        priority: i32,
        /// The rule's CEL source.
        condition: String,
    },
}

/// One serving provider's evaluation for a ModelDeployment: health, capability fit and
/// every rule's value. [`select`] decides from these; `kubeairunway explain` shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The provider (config) name.
    pub provider: String,
    /// Generation of its config.
    pub generation: Option<i64>,
    /// Where it stands.
    pub standing: Standing,
    /// Each rule's value (empty unless it is healthy and its capabilities fit).
    pub rules: Vec<RuleVerdict>,
}

impl Verdict {
    /// Its score: the priority of its highest true rule.
    pub fn priority(&self) -> Option<i32> {
        match &self.standing {
            Standing::Matched { priority, .. } => Some(*priority),
            _ => None,
        }
    }
}

/// Evaluate every serving provider among `configs` for `md`, in name order.
pub fn evaluate(
    md: &ModelDeployment,
    configs: &[Arc<InferenceProviderConfig>],
    cache: &RuleCache,
    settings: &Settings,
    now: Timestamp,
) -> Vec<Verdict> {
    let input = RuleInput::new(md);
    let ctx = input.context();
    let mut sorted: Vec<&InferenceProviderConfig> = configs
        .iter()
        .map(AsRef::as_ref)
        .filter(|c| c.spec.serves())
        .collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    sorted
        .into_iter()
        .map(|config| {
            let mut verdict = Verdict {
                provider: config.name_any(),
                generation: config.metadata.generation,
                standing: Standing::NoRules,
                rules: Vec::new(),
            };
            if let Some(r) = unhealthy_reason(config, now, settings.heartbeat_max_age) {
                verdict.standing = Standing::Unhealthy(r);
                return verdict;
            }
            let none = Capabilities::default();
            let caps = config.spec.capabilities.as_ref().unwrap_or(&none);
            if let Err(misfit) = fits(caps, &md.spec) {
                verdict.standing = Standing::DoesNotFit(misfit.to_string());
                return verdict;
            }
            let rules = cache.rules(config);
            let mut top: Option<(i32, &str)> = None;
            for (index, rule) in rules.iter().enumerate() {
                let value = rule.eval(&input, &ctx);
                if value == Ok(true) && top.is_none_or(|(p, _)| rule.priority > p) {
                    top = Some((rule.priority, &rule.condition));
                }
                verdict.rules.push(RuleVerdict {
                    index,
                    condition: Arc::clone(&rule.condition),
                    priority: rule.priority,
                    value,
                    compile_error: rule.program.is_err(),
                });
            }
            verdict.standing = match top {
                Some((priority, condition)) => Standing::Matched {
                    priority,
                    condition: condition.to_string(),
                },
                None if rules.is_empty() => Standing::NoRules,
                None => Standing::NoRuleMatched,
            };
            verdict
        })
        .collect()
}

/// Select a provider for `md` among `configs`.
pub fn select(
    md: &ModelDeployment,
    configs: &[Arc<InferenceProviderConfig>],
    cache: &RuleCache,
    settings: &Settings,
    now: Timestamp,
) -> Selection {
    decide(md, &evaluate(md, configs, cache, settings, now))
}

/// The selection that `verdicts` (from [`evaluate`]) make for `md`.
pub fn decide(md: &ModelDeployment, verdicts: &[Verdict]) -> Selection {
    let mut unhealthy = BTreeMap::new();
    let mut why_not = BTreeMap::new();
    let mut rule_errors = Vec::new();
    let mut clean = Vec::new();
    // (priority, name, rule source)
    let mut best: Option<(i32, &str, &str)> = None;

    for verdict in verdicts {
        let name = verdict.provider.as_str();
        let errors: Vec<RuleError> = verdict
            .rules
            .iter()
            .filter_map(|r| {
                let error = r.value.as_ref().err()?;
                Some(RuleError {
                    provider: name.to_string(),
                    generation: verdict.generation,
                    index: r.index,
                    condition: r.condition.to_string(),
                    error: error.clone(),
                    compile: r.compile_error,
                })
            })
            .collect();
        match &verdict.standing {
            Standing::Unhealthy(r) => {
                unhealthy.insert(name, r.clone());
                continue;
            }
            Standing::DoesNotFit(r) => {
                why_not.insert(name, r.clone());
                continue;
            }
            Standing::NoRules => {
                why_not.insert(name, "no selection rules (explicit selection only)".into());
            }
            Standing::NoRuleMatched => {
                why_not.insert(name, "no selection rule matched".into());
            }
            Standing::Matched {
                priority,
                condition,
            } => {
                // Strictly higher wins; equal keeps the earlier name (sorted ascending).
                if best.is_none_or(|(p, _, _)| *priority > p) {
                    best = Some((*priority, name, condition));
                } else if let Some((p, n, _)) = best {
                    why_not.insert(name, format!("priority {priority} lost to {n} ({p})"));
                }
            }
        }
        if errors.is_empty() {
            clean.push((name.to_string(), verdict.generation));
        }
        rule_errors.extend(errors);
    }

    let outcome = if let Some((priority, provider, condition)) = best {
        Outcome::Selected {
            reason: format!(
                "matched capabilities: {}; rule `{condition}` priority {priority}",
                capability_summary(&md.spec)
            ),
            provider: provider.to_string(),
            priority,
        }
    } else if why_not.is_empty() {
        let mut detail = String::new();
        for (n, r) in &unhealthy {
            let _ = write!(
                detail,
                "{}{n}: {r}",
                if detail.is_empty() { "" } else { "; " }
            );
        }
        if detail.is_empty() {
            detail = "no serving provider is registered".into();
        }
        Outcome::NoHealthyProviders { detail }
    } else {
        let mut message = none_fits_prefix(&md.spec);
        let all: BTreeMap<_, _> = why_not.iter().chain(unhealthy.iter()).collect();
        let parts: Vec<String> = all.iter().map(|(n, r)| format!("{n}: {r}")).collect();
        message.push_str(&parts.join("; "));
        Outcome::NoneFits { message }
    };
    Selection {
        outcome,
        rule_errors,
        clean_providers: clean,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EngineCapability, EngineType, SelectionRule};
    use crate::{InferenceProviderConfigSpec, InferenceProviderConfigStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn now() -> Timestamp {
        "2026-06-01T12:00:00Z".parse().unwrap()
    }

    fn provider(
        name: &str,
        engines: &[EngineType],
        cpu: bool,
        gpu: bool,
        modes: &[ServingMode],
        rules: &[(&str, i32)],
    ) -> Arc<InferenceProviderConfig> {
        let mut c = InferenceProviderConfig::new(
            name,
            InferenceProviderConfigSpec {
                capabilities: Some(Capabilities {
                    engines: engines.iter().copied().map(EngineCapability::new).collect(),
                    serving_modes: modes.to_vec(),
                    cpu_support: cpu,
                    gpu_support: gpu,
                    features: vec![],
                }),
                selection_rules: rules
                    .iter()
                    .map(|(c, p)| SelectionRule {
                        condition: (*c).to_string(),
                        priority: *p,
                    })
                    .collect(),
                ..Default::default()
            },
        );
        c.metadata.generation = Some(1);
        c.metadata.uid = Some(format!("uid-{name}"));
        c.status = Some(InferenceProviderConfigStatus {
            ready: Some(true),
            last_heartbeat: Some(Time(now())),
            ..Default::default()
        });
        Arc::new(c)
    }

    fn md(spec: serde_json::Value) -> ModelDeployment {
        let mut md = ModelDeployment::new("m", serde_json::from_value(spec).unwrap());
        md.metadata.namespace = Some("ns".into());
        md
    }

    fn gpu_vllm() -> ModelDeployment {
        md(
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}),
        )
    }

    fn run(md: &ModelDeployment, configs: &[Arc<InferenceProviderConfig>]) -> Selection {
        select(
            md,
            configs,
            &RuleCache::default(),
            &Settings::default(),
            now(),
        )
    }

    const V: &[EngineType] = &[EngineType::Vllm];
    const AGG: &[ServingMode] = &[ServingMode::Aggregated];

    #[test]
    fn ties_break_by_name() {
        let configs = [
            provider("zeta", V, false, true, AGG, &[("true", 10)]),
            provider("alpha", V, false, true, AGG, &[("true", 10)]),
        ];
        let s = run(&gpu_vllm(), &configs);
        assert!(
            matches!(&s.outcome, Outcome::Selected { provider, .. } if provider == "alpha"),
            "{s:?}"
        );
    }

    #[test]
    fn highest_true_rule_counts() {
        let configs = [
            provider("a", V, false, true, AGG, &[("true", 10), ("false", 99)]),
            provider(
                "b",
                V,
                false,
                true,
                AGG,
                &[("spec.engine.type == 'vllm'", 20), ("true", 5)],
            ),
        ];
        let s = run(&gpu_vllm(), &configs);
        assert_eq!(
            s.outcome,
            Outcome::Selected {
                provider: "b".into(),
                reason: "matched capabilities: engine=vllm, gpu=true, mode=aggregated; rule `spec.engine.type == 'vllm'` priority 20".into(),
                priority: 20
            }
        );
    }

    #[test]
    fn no_true_rule_is_never_auto_selected() {
        let configs = [provider("only", V, false, true, AGG, &[])];
        let s = run(&gpu_vllm(), &configs);
        let Outcome::NoneFits { message } = s.outcome else {
            panic!("{s:?}")
        };
        assert!(
            message.contains("only: no selection rules (explicit selection only)"),
            "{message}"
        );
    }

    #[test]
    fn stale_heartbeat_and_not_ready_are_unhealthy() {
        let mut stale = (*provider("stale", V, false, true, AGG, &[("true", 1)])).clone();
        stale.status.as_mut().unwrap().last_heartbeat =
            Some(Time("2026-06-01T11:00:00Z".parse().unwrap()));
        let mut down = (*provider("down", V, false, true, AGG, &[("true", 1)])).clone();
        down.status.as_mut().unwrap().ready = Some(false);
        let mut silent = (*provider("silent", V, false, true, AGG, &[("true", 1)])).clone();
        silent.status.as_mut().unwrap().last_heartbeat = None;
        let s = run(
            &gpu_vllm(),
            &[Arc::new(stale), Arc::new(down), Arc::new(silent)],
        );
        let Outcome::NoHealthyProviders { detail } = s.outcome else {
            panic!("{s:?}")
        };
        assert_eq!(
            detail,
            "down: not ready; silent: no heartbeat; stale: heartbeat stale (last 2026-06-01T11:00:00Z, max age 300s)"
        );
        assert!(matches!(
            run(&gpu_vllm(), &[]).outcome,
            Outcome::NoHealthyProviders { .. }
        ));
    }

    #[test]
    fn capability_mismatches_are_explained() {
        let configs = [
            provider("cpu-only", V, true, false, AGG, &[("true", 1)]),
            provider(
                "sg",
                &[EngineType::Sglang],
                false,
                true,
                AGG,
                &[("true", 1)],
            ),
            provider("agg", V, false, true, AGG, &[("true", 1)]),
        ];
        let disagg = md(
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
            "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 1}}}}),
        );
        let s = run(&disagg, &configs);
        let Outcome::NoneFits { message } = s.outcome else {
            panic!("{s:?}")
        };
        assert_eq!(
            message,
            "No provider fits (engine=vllm, gpu=true, mode=disaggregated): agg: serving mode disaggregated not supported with vllm; cpu-only: GPU not supported with vllm; sg: engine vllm not supported"
        );
    }

    #[test]
    fn a_spec_without_an_engine_fits_no_provider() {
        let configs = [provider("p", V, true, true, AGG, &[("true", 1)])];
        let s = run(&md(json!({"model": {"id": "a/b"}})), &configs);
        let Outcome::NoneFits { message } = s.outcome else {
            panic!("{s:?}")
        };
        assert_eq!(
            message,
            "No provider fits (engine=unset, gpu=false, mode=aggregated): p: engine not set"
        );
    }

    #[test]
    fn rules_over_their_budget_are_refused_when_compiled() {
        let nested = "spec.model.id.split('/').all(a, spec.model.id.split('/').all(b, spec.model.id.split('/').all(c, a == b && b == c)))";
        let long = format!("{} == 'x'", "'a' + ".repeat(800) + "'a'");
        for (rule, why) in [
            (nested, "nests 3 comprehensions"),
            (long.as_str(), "characters long, over the budget of 4096"),
        ] {
            let compiled = CompiledRule::compile(rule, 1);
            let err = compiled.program.as_ref().unwrap_err();
            assert!(
                err.starts_with("over budget: it ") && err.contains(why),
                "{err}"
            );
        }
        let two = "spec.model.id.split('/').all(a, spec.model.id.split('/').exists(b, a == b))";
        assert!(
            CompiledRule::compile(two, 1).program.is_ok(),
            "two levels are fine"
        );
    }

    #[test]
    fn the_cost_budget_is_a_count_from_the_rule_and_the_object_never_a_time() {
        let with_env = |n: usize| {
            let mut md = gpu_vllm();
            md.spec.env = Some(
                (0..n)
                    .map(|i| k8s_openapi::api::core::v1::EnvVar {
                        name: format!("E{i}"),
                        value: Some("v".into()),
                        ..Default::default()
                    })
                    .collect(),
            );
            md
        };
        // Quadratic in the length of spec.env: its nodes times 250 times 250 is over the
        // budget, whatever the machine; with 20 entries it runs.
        let rule = CompiledRule::compile(
            "spec.env.all(a, spec.env.all(b, b.name != a.name + 'x'))",
            5,
        );
        let big = RuleInput::new(&with_env(250));
        assert_eq!(rule.cost(&big), rule.measure.nodes as u64 * 250 * 250);
        let refused = rule.eval(&big, &big.context()).unwrap_err();
        assert!(
            refused.starts_with("over budget for this ModelDeployment: an estimated")
                && refused.contains("2 nested comprehensions over up to 250 items"),
            "{refused}"
        );
        assert_eq!(
            rule.eval(&big, &big.context()).unwrap_err(),
            refused,
            "same verdict again"
        );
        let small = RuleInput::new(&with_env(20));
        assert_eq!(
            rule.eval(&small, &small.context()),
            Ok(true),
            "not disabled"
        );

        // A rule without comprehensions costs its nodes, whatever the object.
        let simple = CompiledRule::compile("spec.engine.type == 'vllm'", 1);
        assert_eq!(simple.cost(&big), simple.measure.nodes as u64);
        assert_eq!(simple.eval(&big, &big.context()), Ok(true));

        // kubectl's last-applied copy of the object is not part of the input (core's cache
        // drops it), so it neither widens the input nor can be matched.
        let mut applied = with_env(1);
        applied.metadata.annotations = Some(BTreeMap::from([(
            crate::reflect::LAST_APPLIED.to_string(),
            "x".repeat(10_000),
        )]));
        assert!(RuleInput::new(&applied).widest < 100);
    }

    /// As the SDK's README says: `metadata.labels` and `metadata.annotations` are present
    /// (empty) on a ModelDeployment without any, so a rule guarded by `in` is safe there,
    /// while indexing a missing key fails.
    #[test]
    fn metadata_maps_are_present_when_empty() {
        let plain = md(json!({"model": {"id": "a/b"}}));
        let mut labelled = plain.clone();
        labelled.metadata.labels = Some(BTreeMap::from([("team".into(), "ml".into())]));
        let eval = |rule: &str, md: &ModelDeployment| {
            let input = RuleInput::new(md);
            CompiledRule::compile(rule, 1).eval(&input, &input.context())
        };
        let guarded = "'team' in metadata.labels && metadata.labels['team'] == 'ml'";
        assert_eq!(eval(guarded, &plain), Ok(false));
        assert_eq!(eval(guarded, &labelled), Ok(true));
        assert_eq!(eval("size(metadata.annotations) == 0", &plain), Ok(true));
        assert_eq!(
            eval("metadata.name == 'm' && metadata.namespace == 'ns'", &plain),
            Ok(true)
        );
        assert!(eval("metadata.labels['team'] == 'ml'", &plain).is_err());
    }

    #[test]
    fn bad_rules_are_reported_and_skipped() {
        let configs = [
            provider(
                "bad",
                V,
                false,
                true,
                AGG,
                &[
                    ("spec.engine.type ==", 100),
                    ("spec.nope.deeper == 1", 90),
                    ("1 + 1", 80),
                    ("true", 1),
                ],
            ),
            provider("good", V, false, true, AGG, &[("true", 2)]),
        ];
        let s = run(&gpu_vllm(), &configs);
        assert!(
            matches!(&s.outcome, Outcome::Selected { provider, .. } if provider == "good"),
            "{s:?}"
        );
        let idx: Vec<(usize, bool)> = s.rule_errors.iter().map(|e| (e.index, e.compile)).collect();
        assert_eq!(
            idx,
            vec![(0, true), (1, false), (2, false)],
            "{:?}",
            s.rule_errors
        );
        assert!(s.rule_errors.iter().all(|e| e.provider == "bad"));
        assert_eq!(s.clean_providers, vec![("good".to_string(), Some(1))]);
    }

    #[test]
    fn has_guards_only_the_last_step() {
        let cpu = md(json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}));
        // `resources` is absent: `has(spec.resources.gpu)` alone fails (it guards only its
        // last step), the form that guards every step works.
        let configs = [
            provider(
                "unguarded",
                &[EngineType::Llamacpp],
                true,
                false,
                AGG,
                &[(
                    "!has(spec.resources.gpu) || spec.resources.gpu.count == 0",
                    100,
                )],
            ),
            provider(
                "safe",
                &[EngineType::Llamacpp],
                true,
                false,
                AGG,
                &[(
                    "!has(spec.resources) || !has(spec.resources.gpu) || spec.resources.gpu.count == 0",
                    100,
                )],
            ),
        ];
        let s = run(&cpu, &configs);
        assert!(
            matches!(&s.outcome, Outcome::Selected { provider, .. } if provider == "safe"),
            "{s:?}"
        );
        assert_eq!(s.rule_errors.len(), 1);
        assert_eq!(s.rule_errors[0].provider, "unguarded");
    }

    #[test]
    fn integers_are_signed_and_defaults_applied_and_metadata_visible() {
        let mut m = md(
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 2}}}),
        );
        m.metadata.labels = Some([("team".to_string(), "x".to_string())].into());
        let configs = [provider(
            "p",
            V,
            false,
            true,
            AGG,
            &[(
                "spec.resources.gpu.count * -1 == -2 && spec.scaling.replicas == 1 && spec.model.source == 'huggingface' && spec.serving.mode == 'aggregated' && metadata.labels.team == 'x' && metadata.namespace == 'ns' && metadata.name == 'm'",
                7,
            )],
        )];
        let s = run(&m, &configs);
        assert!(s.rule_errors.is_empty(), "{:?}", s.rule_errors);
        assert!(
            matches!(&s.outcome, Outcome::Selected { priority: 7, .. }),
            "{s:?}"
        );
    }

    #[test]
    fn rules_compile_once_per_generation() {
        let cache = RuleCache::default();
        let c = provider("p", V, false, true, AGG, &[("true", 1)]);
        let a = cache.rules(&c);
        let b = cache.rules(&c);
        assert!(Arc::ptr_eq(&a, &b));
        let mut c2 = (*c).clone();
        c2.metadata.generation = Some(2);
        c2.spec.selection_rules[0].condition = "false".into();
        let d = cache.rules(&c2);
        assert!(!Arc::ptr_eq(&a, &d));
        assert_eq!(&*d[0].condition, "false");
    }

    #[test]
    fn capability_only_providers_are_never_candidates() {
        let mut kc = (*provider("kernelcache", &[], false, true, AGG, &[("true", 1000)])).clone();
        kc.spec.capabilities.as_mut().unwrap().features = vec!["kernelCache".into()];
        let s = run(&gpu_vllm(), &[Arc::new(kc)]);
        assert!(
            matches!(s.outcome, Outcome::NoHealthyProviders { .. }),
            "{s:?}"
        );
    }

    #[test]
    fn evaluate_explains_every_provider() {
        let mut down = (*provider("down", V, false, true, AGG, &[("true", 1)])).clone();
        down.status.as_mut().unwrap().ready = Some(false);
        let configs = [
            Arc::new(down),
            provider("cpu", V, true, false, AGG, &[("true", 1)]),
            provider("named", V, false, true, AGG, &[]),
            provider("nomatch", V, false, true, AGG, &[("false", 9)]),
            provider(
                "win",
                V,
                false,
                true,
                AGG,
                &[("false", 90), ("true", 20), ("1", 5)],
            ),
        ];
        let verdicts = evaluate(
            &gpu_vllm(),
            &configs,
            &RuleCache::default(),
            &Settings::default(),
            now(),
        );
        let standings: Vec<(&str, &Standing)> = verdicts
            .iter()
            .map(|v| (v.provider.as_str(), &v.standing))
            .collect();
        assert_eq!(
            standings,
            [
                (
                    "cpu",
                    &Standing::DoesNotFit("GPU not supported with vllm".into())
                ),
                ("down", &Standing::Unhealthy("not ready".into())),
                ("named", &Standing::NoRules),
                ("nomatch", &Standing::NoRuleMatched),
                (
                    "win",
                    &Standing::Matched {
                        priority: 20,
                        condition: "true".into()
                    }
                ),
            ]
        );
        let win = &verdicts[4];
        let values: Vec<_> = win.rules.iter().map(|r| r.value.clone()).collect();
        assert_eq!(values[..2], [Ok(false), Ok(true)]);
        assert!(values[2].as_ref().unwrap_err().contains("not a bool"));
        assert_eq!(win.priority(), Some(20));
        assert!(
            verdicts[1].rules.is_empty(),
            "unhealthy: rules not evaluated"
        );
        let s = decide(&gpu_vllm(), &verdicts);
        assert!(matches!(&s.outcome, Outcome::Selected { provider, .. } if provider == "win"));
        assert_eq!(s.rule_errors.len(), 1);
    }

    /// Rule texts a provider might write, well-formed or not: CEL tokens in any order.
    fn rule_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let token = prop_oneof![
            Just("spec"),
            Just("metadata"),
            Just("."),
            Just("engine"),
            Just("type"),
            Just("model"),
            Just("id"),
            Just("labels"),
            Just("resources"),
            Just("gpu"),
            Just("count"),
            Just("("),
            Just(")"),
            Just("["),
            Just("]"),
            Just("{"),
            Just("}"),
            Just(","),
            Just(":"),
            Just("?"),
            Just("&&"),
            Just("||"),
            Just("!"),
            Just("=="),
            Just("!="),
            Just("<"),
            Just(">="),
            Just("+"),
            Just("-"),
            Just("*"),
            Just("/"),
            Just("%"),
            Just(" in "),
            Just("'vllm'"),
            Just("\"a\""),
            Just("0"),
            Just("1"),
            Just("-9223372036854775808"),
            Just("1.5"),
            Just("true"),
            Just("null"),
            Just("has("),
            Just("size("),
            Just(".all(x, "),
            Just(".exists(x, "),
            Just(".map(x, "),
            Just(".filter(x, "),
            Just("x"),
            Just(".matches('^a.*')"),
            Just(".startsWith('a')"),
            Just("int("),
            Just("string("),
            Just("b'\\xff'"),
            Just("'\\u12'"),
            Just("\u{1F600}"),
            Just("`"),
            Just("#"),
        ];
        prop_oneof![
            proptest::collection::vec(token, 0..40).prop_map(|t| t.concat()),
            "\\PC{0,80}",
        ]
    }

    proptest::proptest! {
        /// Whatever a provider writes as a rule, selection neither panics nor loses the
        /// error: a rule that does not compile or fails is reported with its provider and
        /// index, and that provider is not counted as clean.
        #[test]
        fn any_rule_text_is_decided_or_reported_never_a_panic(
            rules in proptest::collection::vec((rule_text(), -5i32..5), 1..4),
            engine in proptest::sample::select(vec!["vllm", "sglang", "trtllm", "llamacpp"]),
            gpus in 0i64..3,
            id in "\\PC{1,20}",
            label in "\\PC{0,10}",
            args in proptest::collection::btree_map("[a-z-]{1,8}", "\\PC{0,8}", 0..3),
        ) {
            let rules: Vec<(&str, i32)> = rules.iter().map(|(c, p)| (c.as_str(), *p)).collect();
            let all: &[EngineType] =
                &[EngineType::Vllm, EngineType::Sglang, EngineType::Trtllm, EngineType::Llamacpp];
            let configs = [
                provider("fuzz", all, true, true, AGG, &rules),
                provider("steady", all, true, true, AGG, &[("true", 0)]),
            ];
            let mut m = md(json!({"model": {"id": id}, "engine": {"type": engine, "args": args},
                "resources": {"gpu": {"count": gpus}}}));
            m.metadata.labels = Some([("team".to_string(), label)].into());
            let s = run(&m, &configs);
            let fuzz_errors: Vec<_> = s.rule_errors.iter().filter(|e| e.provider == "fuzz").collect();
            for e in &fuzz_errors {
                proptest::prop_assert_eq!(&e.condition, rules[e.index].0);
                proptest::prop_assert!(!e.error.is_empty());
            }
            let clean = s.clean_providers.iter().any(|(p, _)| p == "fuzz");
            proptest::prop_assert_eq!(clean, fuzz_errors.is_empty());
            proptest::prop_assert!(matches!(s.outcome, Outcome::Selected { .. }), "{:?}", s.outcome);
        }
    }

    /// The deepest nesting the CRD's length bound lets through is refused by the budget,
    /// not a stack overflow of the parser on the blocking thread that compiles it.
    #[test]
    fn deeply_nested_rules_within_the_length_bound_are_refused_not_a_crash() {
        let half = budget::MAX_LENGTH / 2;
        let deepest = budget::MAX_NESTING + 1;
        for rule in [
            format!("{}true{}", "(".repeat(half - 3), ")".repeat(half - 3)),
            format!("{}true{}", "(".repeat(deepest), ")".repeat(deepest)),
            format!("{}1{}", "[".repeat(half - 1), "]".repeat(half - 1)),
            format!("{}1{}", "int(".repeat(deepest), ")".repeat(deepest)),
            format!("{}1{}", "{1:".repeat(deepest), "}".repeat(deepest)),
            format!("true{}", " && true".repeat((budget::MAX_LENGTH - 4) / 8)),
            format!("spec{}", ".a".repeat(budget::MAX_DEPTH + 1)),
        ] {
            assert!(rule.len() <= budget::MAX_LENGTH, "{}", rule.len());
            // The same stack as a blocking thread of the tokio runtime: 2 MiB.
            let r = rule.clone();
            let error = std::thread::Builder::new()
                .stack_size(2 * 1024 * 1024)
                .spawn(move || CompiledRule::compile(&r, 1).program.err())
                .unwrap()
                .join()
                .unwrap();
            let error = error.unwrap_or_else(|| panic!("accepted: {}...", &rule[..40]));
            assert!(error.contains("over budget"), "{error}");
        }
        // Nesting within the budget parses, whatever the caller's stack.
        let nested = format!(
            "{}true{}",
            "(".repeat(budget::MAX_NESTING),
            ")".repeat(budget::MAX_NESTING)
        );
        let compiled = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || CompiledRule::compile(&nested, 1).program.is_ok())
            .unwrap()
            .join()
            .unwrap();
        assert!(compiled);
    }
}
