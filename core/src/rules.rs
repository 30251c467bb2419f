//! `SelectionRulesValid` on each InferenceProviderConfig: the selection rules that do not
//! compile, are over the cost budget or fail when evaluated, reported once.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kubeairunway_sdk::conditions::{self};
use kubeairunway_sdk::{API_VERSION, InferenceProviderConfig};
use serde_json::json;
use tracing::warn;

use crate::FIELD_MANAGER;
use crate::selection::RuleError;

use crate::context::Context;

/// Condition core sets on an InferenceProviderConfig about its selection rules.
pub const SELECTION_RULES_VALID: &str = "SelectionRulesValid";

/// `SelectionRulesValid=False` reason: a rule does not compile, or is over the budget
/// checked when it is compiled.
pub const INVALID_SELECTION_RULE: &str = "InvalidSelectionRule";

/// `SelectionRulesValid=False` reason: a rule compiles but fails when evaluated.
pub const SELECTION_RULE_FAILED: &str = "SelectionRuleFailed";

/// One `SelectionRulesValid` report core wants on a provider's InferenceProviderConfig.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RuleReport {
    provider: String,
    ok: bool,
    reason: &'static str,
    message: String,
}

/// The reports of one selection: a failure per provider with failing rules (naming each
/// rule, its text and why), "valid" for each provider whose rules all held.
fn rule_reports(errors: &[RuleError], clean: &[(String, Option<i64>)]) -> Vec<RuleReport> {
    let mut by_provider: BTreeMap<&str, Vec<&RuleError>> = BTreeMap::new();
    for e in errors {
        by_provider.entry(e.provider.as_str()).or_default().push(e);
    }
    let failing = by_provider.into_iter().map(|(provider, errs)| RuleReport {
        provider: provider.to_string(),
        ok: false,
        reason: if errs.iter().any(|e| e.compile) {
            INVALID_SELECTION_RULE
        } else {
            SELECTION_RULE_FAILED
        },
        message: errs
            .iter()
            .map(|e| format!("rule {} `{}`: {}", e.index, e.condition, e.error))
            .collect::<Vec<_>>()
            .join("; "),
    });
    let valid = clean.iter().map(|(provider, _)| RuleReport {
        provider: provider.clone(),
        ok: true,
        reason: SELECTION_RULES_VALID,
        message: "Every selection rule compiles and evaluates to a bool".into(),
    });
    failing.chain(valid).collect()
}

/// Whether `next` need not be written over `previous`. Reported at most once per
/// generation each way, so ModelDeployments that evaluate a rule differently cannot flip
/// the condition back and forth (each write of the config wakes every waiting
/// ModelDeployment): a failure is written unless one is already recorded for this
/// generation; "valid" is written only over a report of an older generation.
fn already_reported(previous: Option<&Condition>, next: &Condition, ok: bool) -> bool {
    let same_generation =
        previous.is_some_and(|p| p.observed_generation == next.observed_generation);
    match previous {
        None => ok,
        Some(p) if ok => same_generation || p.status == "True",
        Some(p) => same_generation && p.status == "False",
    }
}

/// Write the selection's rule reports to the providers' InferenceProviderConfigs, each
/// unless already reported.
pub(crate) async fn report_rule_errors(
    ctx: &Context,
    configs: &[Arc<InferenceProviderConfig>],
    errors: &[RuleError],
    clean: &[(String, Option<i64>)],
    now: Timestamp,
) {
    let api: Api<InferenceProviderConfig> = Api::all(ctx.client.clone());
    for report in rule_reports(errors, clean) {
        let Some(config) = configs.iter().find(|c| c.name_any() == report.provider) else {
            continue;
        };
        let previous = config
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, SELECTION_RULES_VALID));
        let c = conditions::new(
            previous,
            SELECTION_RULES_VALID,
            report.ok,
            report.reason,
            report.message,
            config.metadata.generation,
            now,
        );
        if already_reported(previous, &c, report.ok) {
            continue;
        }
        let provider = report.provider;
        if !report.ok {
            warn!(provider = %provider, message = %c.message, "selection rule failed");
        }
        let body = json!({
            "apiVersion": API_VERSION,
            "kind": "InferenceProviderConfig",
            "metadata": {"name": provider},
            "status": {"conditions": [c]},
        });
        if let Err(e) = api
            .patch_status(
                &provider,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&body),
            )
            .await
        {
            warn!(provider = %provider, error = %e, "reporting selection rule errors failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_reports_name_each_failing_rule_and_each_clean_provider() {
        let error = |provider: &str, index, compile| RuleError {
            provider: provider.into(),
            generation: Some(1),
            index,
            condition: format!("c{index}"),
            error: "e".into(),
            compile,
        };
        let reports = rule_reports(
            &[
                error("a", 0, false),
                error("a", 2, true),
                error("b", 1, false),
            ],
            &[("c".into(), Some(1))],
        );
        let summary: Vec<_> = reports
            .iter()
            .map(|r| (r.provider.as_str(), r.ok, r.reason, r.message.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    "a",
                    false,
                    INVALID_SELECTION_RULE,
                    "rule 0 `c0`: e; rule 2 `c2`: e"
                ),
                ("b", false, SELECTION_RULE_FAILED, "rule 1 `c1`: e"),
                (
                    "c",
                    true,
                    SELECTION_RULES_VALID,
                    "Every selection rule compiles and evaluates to a bool"
                ),
            ]
        );
    }

    #[test]
    fn a_rule_report_is_written_once_per_generation_each_way() {
        let now = Timestamp::now();
        let at = |generation, ok| {
            conditions::new(
                None,
                SELECTION_RULES_VALID,
                ok,
                "r",
                "m",
                Some(generation),
                now,
            )
        };
        // Nothing recorded: only a failure is worth writing.
        assert!(already_reported(None, &at(1, true), true));
        assert!(!already_reported(None, &at(1, false), false));
        // A failure of this generation is not written again, nor replaced by "valid".
        assert!(already_reported(Some(&at(1, false)), &at(1, false), false));
        assert!(already_reported(Some(&at(1, false)), &at(1, true), true));
        // A failure of an older generation is replaced either way.
        assert!(!already_reported(Some(&at(1, false)), &at(2, false), false));
        assert!(!already_reported(Some(&at(1, false)), &at(2, true), true));
        // "Valid" is not written again; a failure replaces it.
        assert!(already_reported(Some(&at(1, true)), &at(2, true), true));
        assert!(!already_reported(Some(&at(1, true)), &at(1, false), false));
    }
}
