//! A property test of a provider's `spec.provider.overrides` handling.
//!
//! Users write overrides by hand, so a provider meets every shape of them: documented keys
//! holding the wrong type, a negative number, an empty string, a typo one level down.
//! [`check_overrides`] renders a ModelDeployment with random overrides built from the
//! provider's documented (typed) paths and checks the contract of the SDK's overrides
//! parsing: rendering never panics; a refusal names the override
//! (`provider.overrides.<key>`); a key the provider does not know under one of its typed
//! keys is refused; an accepted rendering passes the caller's own check (typically the
//! upstream CRD schema). Top-level keys other than the typed ones are not the provider's:
//! the runtime merges them into the primary object ([`crate::overrides`]).
//!
//! Cases: `PROPTEST_CASES` (default 256).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, Value};

use crate::api::ModelDeployment;
use crate::provider::{RenderError, Rendered};

/// Keys no provider documents, to be reported as unknown wherever they appear.
const TYPOS: [&str; 3] = ["replicsa", "x-unknown", ""];

/// Leaf values: well-formed ones (so accepted renderings are reached) and hostile ones.
fn leaf(samples: Vec<Value>) -> BoxedStrategy<Value> {
    let hostile = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-3i64..5).prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::from)),
        "\\PC{0,12}".prop_map(Value::from),
        Just(Value::String(String::new())),
        Just(Value::Array(Vec::new())),
        Just(Value::Object(Map::new())),
    ];
    if samples.is_empty() {
        hostile.boxed()
    } else {
        prop_oneof![3 => proptest::sample::select(samples), 2 => hostile].boxed()
    }
}

/// Put `value` at dotted `path` in `root`, making objects on the way (replacing non-objects).
fn insert(root: &mut Map<String, Value>, path: &str, value: Value) {
    let mut parts = path.split('.').peekable();
    let mut at = root;
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            at.insert(part.to_string(), value);
            return;
        }
        let slot = at
            .entry(part.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        let Value::Object(next) = slot else {
            return;
        };
        at = next;
    }
}

/// Random overrides: each documented path (with sample values for it) present or not, and
/// typo keys at the top or under a documented object.
fn overrides(paths: &[(&str, Vec<Value>)]) -> BoxedStrategy<(Value, Vec<String>)> {
    let known: Vec<(String, BoxedStrategy<Value>)> = paths
        .iter()
        .map(|(p, samples)| ((*p).to_string(), leaf(samples.clone())))
        .collect();
    // Typos go under typed keys only: a top-level one is part of the merge patch.
    let parents: Vec<String> = paths
        .iter()
        .filter_map(|(p, _)| p.rsplit_once('.').map(|(parent, _)| parent.to_string()))
        .collect();
    let entries: Vec<BoxedStrategy<Option<(String, Value)>>> = known
        .into_iter()
        .map(|(p, s)| proptest::option::of(s.prop_map(move |v| (p.clone(), v))).boxed())
        .collect();
    let typos = if parents.is_empty() {
        Just(Vec::new()).boxed()
    } else {
        proptest::collection::vec(
            (
                proptest::sample::select(parents),
                proptest::sample::select(TYPOS.to_vec()),
            ),
            0..3,
        )
        .boxed()
    };
    (entries, typos)
        .prop_map(|(entries, typos)| {
            let mut root = Map::new();
            for (path, value) in entries.into_iter().flatten() {
                insert(&mut root, &path, value);
            }
            let mut unknown = Vec::new();
            for (parent, typo) in typos {
                let path = format!("{parent}.{typo}");
                insert(&mut root, &path, Value::from(1));
                unknown.push(path);
            }
            (Value::Object(root), unknown)
        })
        .boxed()
}

/// Render `base` with random overrides (see the module docs) and check the contract.
///
/// `paths` are the provider's typed override paths (dotted, e.g. `head.resources.cpu`),
/// each with a few valid sample values; `render` is the provider's render; `check` gets
/// every accepted rendering (return an error message to fail the property).
///
/// # Panics
/// With the failing overrides (minimised) when the contract does not hold.
pub fn check_overrides<R, C>(
    base: &ModelDeployment,
    paths: &[(&str, Vec<Value>)],
    render: R,
    check: C,
) where
    R: Fn(&ModelDeployment) -> Result<Rendered, RenderError>,
    C: Fn(&ModelDeployment, &Rendered) -> Result<(), String>,
{
    let mut runner = TestRunner::new(Config::default());
    let outcome = runner.run(&overrides(paths), |(value, unknown)| {
        let mut md = base.clone();
        let Value::Object(map) = value else {
            unreachable!("overrides are objects")
        };
        md.spec
            .provider
            .get_or_insert_with(Default::default)
            .overrides = Some(map);
        let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| render(&md)))
            .map_err(|_| TestCaseError::fail("render panicked"))?;
        match rendered {
            Err(e) => {
                prop_assert!(
                    e.0.contains("provider.overrides."),
                    "a refusal must name the override: {}",
                    e.0
                );
            }
            Ok(r) => {
                prop_assert!(
                    unknown.is_empty(),
                    "accepted with the unknown overrides {unknown:?}"
                );
                check(&md, &r).map_err(TestCaseError::fail)?;
            }
        }
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}
