//! The ModelDeployment CRD's own validation rules, evaluated without an API server.
//!
//! Each rule a spec must keep without cluster knowledge (`model.id` for Hugging Face, a GPU
//! for vLLM, both roles in disaggregated mode, ...) is written once: as a CEL rule
//! (`x-kubernetes-validations`) on the API type, from which the CRD is generated. The API
//! server enforces it on every create and update before any admission webhook is called
//! (docs/upstream.md#kubernetes-validation-order), so the rule holds whether or not a
//! webhook is up.
//!
//! Code that must judge a spec with no API server at hand (core's reconciler, for objects
//! stored before a rule existed or kept by validation ratcheting; `kubeairunway render`,
//! offline) calls [`check`], which evaluates the same rule text from the generated schema
//! ([`crate::defaults::spec_schema`]) with the same field paths and messages.

use std::collections::HashMap;
use std::sync::LazyLock;

use cel::{Context, Program, Value as CelValue};
use serde_json::Value;

use crate::selection::{ENV, to_cel};

/// A rule of the CRD that a spec breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Path of the field the rule names, as the API server reports it: `spec` followed
    /// by the rule's `fieldPath` (e.g. `spec.resources.gpu.count`).
    pub field: String,
    /// The rule's message.
    pub message: String,
}

/// Every rule of the spec's schema, compiled once, by its text.
static PROGRAMS: LazyLock<HashMap<String, Result<Program, String>>> = LazyLock::new(|| {
    let mut texts = Vec::new();
    rule_texts(crate::defaults::spec_schema(), &mut texts);
    texts
        .into_iter()
        .map(|text| {
            let program = ENV.compile(text).map_err(|e| e.to_string());
            (text.to_string(), program)
        })
        .collect()
});

/// The text of every rule in `schema` and the schemas below it.
fn rule_texts<'a>(schema: &'a Value, out: &mut Vec<&'a str>) {
    out.extend(
        rules(schema)
            .iter()
            .filter_map(|r| r.get("rule").and_then(Value::as_str)),
    );
    let children = schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|p| p.values())
        .chain(schema.get("additionalProperties"))
        .chain(schema.get("items"));
    for child in children {
        rule_texts(child, out);
    }
}

/// The `x-kubernetes-validations` of one schema.
fn rules(schema: &Value) -> &[Value] {
    schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The rules a ModelDeployment `spec` breaks, as the API server would report them: the
/// spec is read as the API server stores it (null fields dropped, defaults applied), and
/// each rule is evaluated with `self` bound to the value it sits on. Rules on a transition
/// (those that read `oldSelf`) need the previous object and are left to the API server.
pub fn check(spec: &Value) -> Vec<Violation> {
    let mut spec = spec.clone();
    drop_nulls(&mut spec);
    crate::defaults::apply(&mut spec);
    let mut out = Vec::new();
    walk(&spec, crate::defaults::spec_schema(), "spec", &mut out);
    out
}

/// Null fields are absent to CEL's `has()`: the API server prunes them from objects whose
/// schema does not allow null, as ours does not.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// Evaluate the rules of `schema` on `value` (at `path`), then those below it.
fn walk(value: &Value, schema: &Value, path: &str, out: &mut Vec<Violation>) {
    let applicable = rules(schema).iter().filter(|r| {
        r.get("rule")
            .and_then(Value::as_str)
            .is_some_and(|t| !t.contains("oldSelf"))
    });
    let mut bound = None;
    for rule in applicable {
        let this = bound.get_or_insert_with(|| to_cel(value));
        if let Some(broken) = evaluate(rule, this, path) {
            out.push(broken);
        }
    }
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, child) in map {
                if let Some(s) = properties.and_then(|p| p.get(key)) {
                    walk(child, s, &format!("{path}.{key}"), out);
                } else if let Some(s) = additional {
                    walk(child, s, &format!("{path}[{key}]"), out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(item, s, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// One rule on `this`: the violation when it does not hold. A rule that does not compile
/// or whose evaluation fails breaks too (the API server refuses such an object), with why.
fn evaluate(rule: &Value, this: &CelValue, path: &str) -> Option<Violation> {
    let text = rule.get("rule").and_then(Value::as_str)?;
    let message = rule
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| format!("failed rule: {text}"), str::to_string);
    let field = match rule.get("fieldPath").and_then(Value::as_str) {
        Some(relative) => format!("{path}{relative}"),
        None => path.to_string(),
    };
    let outcome = match PROGRAMS.get(text) {
        None => Err("the rule is not in the schema".to_string()),
        Some(Err(e)) => Err(format!("the rule does not compile: {e}")),
        Some(Ok(program)) => {
            let mut ctx = Context::with_env(std::sync::Arc::clone(&ENV));
            ctx.add_variable_from_value("self", this.clone());
            match program.execute(&ctx) {
                Ok(CelValue::Bool(holds)) => Ok(holds),
                Ok(other) => Err(format!("the rule gives {other:?}, not a bool")),
                Err(e) => Err(format!("the rule could not be evaluated: {e}")),
            }
        }
    };
    match outcome {
        Ok(true) => None,
        Ok(false) => Some(Violation { field, message }),
        Err(why) => Some(Violation {
            field,
            message: format!("{message} ({why})"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_rule_of_the_schema_compiles() {
        assert!(PROGRAMS.len() >= 9, "{}", PROGRAMS.len());
        for (text, program) in PROGRAMS.iter() {
            assert!(program.is_ok(), "{text}: {:?}", program.as_ref().err());
        }
    }

    #[test]
    fn a_valid_spec_breaks_no_rule() {
        for spec in [
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}),
            json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
            json!({"model": {"source": "custom"}, "engine": {"type": "llamacpp"}}),
            json!({"model": {"id": "a/b"}, "engine": {"type": "sglang"}, "serving": {"mode": "disaggregated"},
                   "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 2}}}}),
        ] {
            assert_eq!(check(&spec), vec![], "{spec}");
        }
    }

    /// `image` and `engine.image` are one setting: different images are refused, the same
    /// one (or an empty one) is not; read here with the CEL interpreter the SDK embeds.
    #[test]
    fn image_and_engine_image_must_agree() {
        let spec = |image: Value, engine_image: Value| {
            check(
                &json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp", "image": engine_image},
                          "image": image}),
            )
        };
        let differ = spec(json!("a:1"), json!("b:1"));
        assert_eq!(differ.len(), 1, "{differ:?}");
        assert_eq!(differ[0].field, "spec.engine.image");
        for (image, engine_image) in [
            (json!("a:1"), json!("a:1")),
            (json!(""), json!("b:1")),
            (json!("a:1"), json!("")),
            (Value::Null, json!("b:1")),
            (json!("a:1"), Value::Null),
        ] {
            assert_eq!(
                spec(image.clone(), engine_image.clone()),
                [],
                "{image} {engine_image}"
            );
        }
    }

    #[test]
    fn a_broken_rule_names_its_field_and_message_and_nulls_are_absent() {
        let broken = check(&json!({"model": {"id": null}, "engine": {"type": null}}));
        assert_eq!(
            broken,
            vec![Violation {
                field: "spec.model.id".into(),
                message: "model.id is required when source is huggingface".into(),
            }]
        );
        // Two rules at once are both reported, in the schema's order.
        let broken = check(&json!({"model": {"id": ""}, "engine": {"type": "vllm"},
                                   "resources": {"gpu": {"count": 0}}}));
        let fields: Vec<_> = broken.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["spec.model.id", "spec.resources.gpu.count"]);
    }

    /// `spec.warmup` names a Warmup or is inline, never both; `{}` is inline.
    #[test]
    fn spec_warmup_is_a_name_or_inline() {
        let spec = |warmup: Value| json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}, "warmup": warmup});
        for fine in [
            json!({}),
            json!({"name": "w"}),
            json!({"policies": {"parallelism": 1}, "imagesPreload": {"items": ["i:1"]}}),
        ] {
            assert_eq!(check(&spec(fine.clone())), [], "{fine}");
        }
        let both = check(&spec(json!({"name": "w", "kernelCaches": ["k"]})));
        assert_eq!(both.len(), 1, "{both:?}");
        assert_eq!(both[0].field, "spec.warmup.name");
        assert!(both[0].message.contains("not both"), "{both:?}");
        let ttl = check(&spec(
            json!({"policies": {"parallelism": 1, "ttlSecondsAfterFinished": 60}}),
        ));
        assert_eq!(ttl.len(), 1, "{ttl:?}");
        assert_eq!(ttl[0].field, "spec.warmup.policies.ttlSecondsAfterFinished");
    }

    #[test]
    fn a_rule_that_cannot_be_evaluated_breaks_with_why() {
        let rule = json!({"rule": "self.x > 1", "message": "x is too small", "fieldPath": ".x"});
        let broken = evaluate(&rule, &to_cel(&json!({"x": 1})), "spec").unwrap();
        assert_eq!(broken.field, "spec.x");
        assert!(
            broken
                .message
                .starts_with("x is too small (the rule is not in the schema"),
            "{}",
            broken.message
        );
    }

    #[test]
    fn odd_shapes_do_not_panic() {
        for spec in [
            json!(null),
            json!([]),
            json!({"model": 3}),
            json!({"model": {"id": 7}, "engine": []}),
        ] {
            let _ = check(&spec);
        }
    }
}
