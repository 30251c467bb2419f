//! Selection rules compiled and evaluated: the CEL environment (shared with the CRD's own
//! rules), a ModelDeployment as CEL sees it ([`RuleInput`]), each rule compiled once per
//! config generation under a cost budget ([`RuleCache`]), and what a failing rule reports
//! ([`RuleError`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use crate::{InferenceProviderConfig, ModelDeployment};
use cel::common::value::Val;
use cel::objects::{Key, Map as CelMap};
use cel::{Context, Env, Program, Value as CelValue};
use kube::ResourceExt;

/// The CEL environment of selection rules and of the CRD's own rules ([`crate::validation`]).
pub(crate) static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(Env::stdlib()));

/// Convert JSON to a CEL value the way Kubernetes CEL sees it: integers are signed `int`
/// (never `uint`), other numbers `double`, objects maps with string keys.
pub fn to_cel(value: &serde_json::Value) -> CelValue {
    use serde_json::Value as J;
    match value {
        J::Null => CelValue::Null,
        J::Bool(b) => CelValue::Bool(*b),
        J::Number(n) => n.as_i64().map_or_else(
            || CelValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            CelValue::Int,
        ),
        J::String(s) => CelValue::String(Arc::new(s.clone())),
        J::Array(items) => CelValue::List(Arc::new(items.iter().map(to_cel).collect())),
        J::Object(map) => {
            let m: HashMap<Key, CelValue> = map
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            CelValue::Map(CelMap { map: Arc::new(m) })
        }
    }
}

/// The CEL variables of a ModelDeployment: `spec` (defaults applied) and `metadata`
/// (name, namespace, labels, annotations but `kubectl apply`'s last-applied copy of the
/// object, which core's cache drops: a rule must see what core sees).
#[derive(Debug, Clone)]
pub struct RuleInput {
    spec: serde_json::Value,
    metadata: serde_json::Value,
    /// The most items a comprehension can iterate over in this input (see [`widest`]).
    pub(crate) widest: u64,
}

/// The most items one comprehension can iterate over when it ranges over anything in
/// `value` or computed from it: the longest list or map, or the longest string plus one
/// (`split` makes at most that many parts).
fn widest(value: &serde_json::Value) -> u64 {
    use serde_json::Value as J;
    let len = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    match value {
        J::String(s) => len(s.len()).saturating_add(1),
        J::Array(items) => items.iter().map(widest).fold(len(items.len()), u64::max),
        J::Object(map) => map
            .iter()
            .map(|(k, v)| widest(v).max(len(k.len()).saturating_add(1)))
            .fold(len(map.len()), u64::max),
        J::Null | J::Bool(_) | J::Number(_) => 0,
    }
}

impl RuleInput {
    /// Build the variables for `md`.
    pub fn new(md: &ModelDeployment) -> Self {
        let mut spec = serde_json::to_value(&md.spec).unwrap_or_default();
        crate::defaults::apply(&mut spec);
        let mut annotations = md.annotations().clone();
        annotations.remove(crate::reflect::LAST_APPLIED);
        let metadata = serde_json::json!({
            "name": md.name_any(),
            "namespace": md.namespace().unwrap_or_default(),
            "labels": md.labels(),
            "annotations": annotations,
        });
        Self {
            widest: widest(&spec).max(widest(&metadata)),
            spec,
            metadata,
        }
    }

    /// The CEL context holding `spec` and `metadata`; build it once per selection. Its
    /// values borrow this input's strings: nothing is copied but the containers.
    pub fn context(&self) -> Context<'_, '_> {
        let mut ctx = Context::with_env(Arc::clone(&ENV));
        ctx.add_variable_as_val("spec", to_val(&self.spec));
        ctx.add_variable_as_val("metadata", to_val(&self.metadata));
        ctx
    }
}

/// JSON as CEL values, the way [`to_cel`] types it, built in one pass and borrowing the
/// strings: [`Context::add_variable_from_value`] would convert a [`CelValue`] again,
/// copying every map and string (the larger part of a selection's time).
fn to_val(value: &serde_json::Value) -> Box<dyn Val + '_> {
    use cel::common::types::{
        CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString,
    };
    use serde_json::Value as J;
    match value {
        J::Null => Box::new(CelNull),
        J::Bool(b) => Box::new(CelBool::from(*b)),
        J::Number(n) => match n.as_i64() {
            Some(i) => Box::new(CelInt::from(i)),
            None => Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN))),
        },
        J::String(s) => Box::new(CelString::from(s.as_str())),
        J::Array(items) => Box::new(CelList::from(items.iter().map(to_val).collect::<Vec<_>>())),
        J::Object(map) => Box::new(CelMap::from(
            map.iter()
                .map(|(k, v)| (CelMapKey::from(k.as_str()), to_val(v)))
                .collect::<HashMap<_, _>>(),
        )),
    }
}

/// The budget of one selection rule, as Kubernetes bounds the CEL rules of CRDs: its
/// length (also enforced by the InferenceProviderConfig schema), the size of its syntax
/// tree and how deeply comprehensions (`all`, `exists`, `map`, `filter`) nest, checked when
/// it is compiled; and the cost of one evaluation, estimated before it runs from the
/// rule's size and the ModelDeployment's (see [`CompiledRule::cost`]). A rule over budget
/// is reported like a failing one (`SelectionRulesValid=False`) and skipped: a provider
/// cannot slow down selection, or the webhook and Lease threads beside it, with a costly
/// rule.
///
/// The budget is a count, never a time: the same rule and ModelDeployment get the same
/// verdict on every machine and under any load. (A time budget disabled the built-in
/// providers' one-comparison rules on a CPU-starved controller, and core then chose a
/// fallback provider.) Kubernetes bounds its CEL by cost units for the same reason
/// (`apiextensions-apiserver/pkg/apiserver/schema/cel/compilation.go`, `PerCallLimit`).
pub mod budget {
    use std::time::Duration;

    /// Characters of one condition.
    pub const MAX_LENGTH: usize = 4096;
    /// Rules of one InferenceProviderConfig.
    pub const MAX_RULES: usize = 64;
    /// Nodes of a condition's syntax tree (after macro expansion).
    pub const MAX_NODES: usize = 1000;
    /// Comprehensions nested in one another.
    pub const MAX_COMPREHENSION_DEPTH: usize = 2;
    /// Brackets (`(`, `[`, `{`) open at once, counted in the text before it is parsed:
    /// the parser recurses several frames per bracket (about 200 KiB of stack per level
    /// in a debug build), so deeper text would overflow the stack of the thread parsing
    /// it and abort the process instead of being refused.
    pub const MAX_NESTING: usize = 32;
    /// Depth of the syntax tree: evaluation recurses once per level on the caller's stack.
    pub const MAX_DEPTH: usize = 100;
    /// Stack of the thread a rule is parsed on: room for [`MAX_NESTING`] in a debug build
    /// with a margin of two.
    pub const PARSE_STACK: usize = 16 * 1024 * 1024;
    /// Estimated steps of one evaluation against one ModelDeployment: Kubernetes'
    /// `PerCallLimit` for CRD validation rules (`k8s.io/apiserver/pkg/apis/cel/config.go`).
    pub const MAX_COST: u64 = 1_000_000;
    /// Last resort against a rule the estimate misjudges (lists concatenated inside a
    /// comprehension grow past it): an evaluation still running after this long marks
    /// the rule as not to be evaluated again. Legitimate rules take microseconds; this
    /// is far beyond what CPU throttling or a paused process adds to one.
    pub const RUNAWAY: Duration = Duration::from_secs(2);
}

/// Size of a syntax tree, as the budget bounds it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Measure {
    pub(crate) nodes: usize,
    comprehensions: usize,
    depth: usize,
}

/// The deepest bracket nesting of `condition`'s text (brackets in string literals count
/// too: an overestimate only refuses, never lets a deep text reach the parser).
fn nesting(condition: &str) -> usize {
    let (mut open, mut deepest) = (0usize, 0usize);
    for b in condition.bytes() {
        match b {
            b'(' | b'[' | b'{' => {
                open += 1;
                deepest = deepest.max(open);
            }
            b')' | b']' | b'}' => open = open.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Nodes of `expr`, the deepest nesting of comprehensions in it, and its depth.
fn measure(expr: &cel::IdedExpr) -> Measure {
    use cel::common::ast::{EntryExpr, Expr};
    let children: Vec<&cel::IdedExpr> = match &expr.expr {
        Expr::Call(c) => c.target.iter().map(AsRef::as_ref).chain(&c.args).collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(cel::common::ast::MapExpr { entries })
        | Expr::Struct(cel::common::ast::StructExpr { entries, .. }) => entries
            .iter()
            .flat_map(|e| match &e.expr {
                EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                EntryExpr::StructField(f) => vec![&f.value],
            })
            .collect(),
        Expr::Select(sel) => vec![sel.operand.as_ref()],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    };
    let mut out = Measure {
        nodes: 1,
        ..Measure::default()
    };
    for child in children {
        let m = measure(child);
        out.nodes += m.nodes;
        out.comprehensions = out.comprehensions.max(m.comprehensions);
        out.depth = out.depth.max(m.depth);
    }
    out.depth += 1;
    if matches!(expr.expr, Expr::Comprehension(_)) {
        out.comprehensions += 1;
    }
    out
}

/// Why the text of `condition` is over its budget, if it is: checked before parsing.
fn text_over_budget(condition: &str) -> Option<String> {
    if condition.len() > budget::MAX_LENGTH {
        return Some(format!(
            "is {} characters long, over the budget of {}",
            condition.len(),
            budget::MAX_LENGTH
        ));
    }
    let nesting = nesting(condition);
    if nesting > budget::MAX_NESTING {
        return Some(format!(
            "nests brackets {nesting} deep, over the budget of {}",
            budget::MAX_NESTING
        ));
    }
    None
}

/// Why a program of `measure` is over its budget, if it is.
fn over_budget(measure: Measure) -> Option<String> {
    let Measure {
        nodes,
        comprehensions: depth,
        depth: tree,
    } = measure;
    if tree > budget::MAX_DEPTH {
        return Some(format!(
            "is {tree} levels deep, over the budget of {}",
            budget::MAX_DEPTH
        ));
    }
    if nodes > budget::MAX_NODES {
        return Some(format!(
            "has {nodes} nodes, over the budget of {}",
            budget::MAX_NODES
        ));
    }
    if depth > budget::MAX_COMPREHENSION_DEPTH {
        return Some(format!(
            "nests {depth} comprehensions (all, exists, map, filter), over the budget of {}",
            budget::MAX_COMPREHENSION_DEPTH
        ));
    }
    None
}

/// One compiled rule of a config.
#[derive(Debug)]
pub struct CompiledRule {
    /// The CEL source (shared with every verdict on it).
    pub condition: Arc<str>,
    /// Its priority.
    pub priority: i32,
    /// The program, or why it does not compile (or is over its budget).
    pub program: Result<Program, String>,
    /// The program's size, as the budget counts it.
    pub(crate) measure: Measure,
    /// Set once an evaluation ran past [`budget::RUNAWAY`]: the rule is not evaluated
    /// again (until its config changes).
    runaway: std::sync::OnceLock<String>,
}

/// Parse `condition` (within its text budget) on a thread with a stack sized for it
/// ([`budget::PARSE_STACK`]), whatever the caller's stack: a rule is parsed once per
/// config generation, so the thread costs little.
fn parse(condition: &str) -> Result<Program, String> {
    let parsed = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("cel-parse".into())
            .stack_size(budget::PARSE_STACK)
            .spawn_scoped(scope, || ENV.compile(condition))
            .map(std::thread::ScopedJoinHandle::join)
    });
    match parsed {
        Err(e) => Err(format!("could not start the parser thread: {e}")),
        Ok(Err(_panic)) => Err("the CEL parser failed on it".to_string()),
        Ok(Ok(result)) => result.map_err(|e| {
            e.to_string()
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        }),
    }
}

impl CompiledRule {
    pub(crate) fn compile(condition: &str, priority: i32) -> Self {
        let mut measure = Measure::default();
        let program = match text_over_budget(condition) {
            Some(why) => Err(format!("over budget: it {why}")),
            None => parse(condition).and_then(|p| {
                measure = self::measure(p.expression());
                match over_budget(measure) {
                    Some(why) => Err(format!("over budget: it {why}")),
                    None => Ok(p),
                }
            }),
        };
        Self {
            condition: Arc::from(condition),
            priority,
            program,
            measure,
            runaway: std::sync::OnceLock::new(),
        }
    }

    /// The estimated steps of evaluating this rule against `input`: every node of the
    /// rule once per iteration of each comprehension it is nested in, each comprehension
    /// iterating at most [`RuleInput::widest`] items (the way Kubernetes estimates a CEL
    /// rule's cost from the largest lists it may see, here from the actual object).
    pub fn cost(&self, input: &RuleInput) -> u64 {
        let nodes = u64::try_from(self.measure.nodes).unwrap_or(u64::MAX);
        let per_level = input.widest.max(1);
        (0..self.measure.comprehensions).fold(nodes, |cost, _| cost.saturating_mul(per_level))
    }

    /// Evaluate against `input` (whose [`RuleInput::context`] is `ctx`): `Ok(true)` when
    /// the condition holds; an error when it does not compile, is over its budget, fails,
    /// or is not a boolean.
    pub fn eval(&self, input: &RuleInput, ctx: &Context<'_, '_>) -> Result<bool, String> {
        let program = self
            .program
            .as_ref()
            .map_err(|e| format!("does not compile: {e}"))?;
        if let Some(runaway) = self.runaway.get() {
            return Err(runaway.clone());
        }
        let cost = self.cost(input);
        if cost > budget::MAX_COST {
            return Err(format!(
                "over budget for this ModelDeployment: an estimated {cost} steps ({} nodes, {} nested comprehensions over up to {} items), over the budget of {}",
                self.measure.nodes,
                self.measure.comprehensions,
                input.widest,
                budget::MAX_COST
            ));
        }
        // Only a comprehension can run longer than its estimate (lists it concatenates
        // grow); a rule without one evaluates each node once, so is not timed.
        let timed = self.measure.comprehensions > 0;
        let started = timed.then(std::time::Instant::now);
        let result = program.execute(ctx);
        let took = started.map(|s| s.elapsed()).unwrap_or_default();
        if took > budget::RUNAWAY {
            let why = format!(
                "runaway: one evaluation took {} ms (its estimated cost was {cost} steps); it is no longer evaluated",
                took.as_millis(),
            );
            let _ = self.runaway.set(why.clone());
            return Err(why);
        }
        match result {
            Ok(CelValue::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("evaluates to {other:?}, not a bool")),
            Err(e) => Err(format!("evaluation failed: {e}")),
        }
    }
}

#[derive(Debug)]
struct CacheEntry {
    uid: String,
    generation: Option<i64>,
    rules: Arc<Vec<CompiledRule>>,
}

/// Compiled rules per InferenceProviderConfig, recompiled only when the config's
/// generation (or uid) changes.
#[derive(Debug, Default)]
pub struct RuleCache {
    entries: Mutex<HashMap<String, CacheEntry>>,
}

impl RuleCache {
    /// The compiled rules of `config`.
    pub fn rules(&self, config: &InferenceProviderConfig) -> Arc<Vec<CompiledRule>> {
        let name = config.name_any();
        let uid = config.uid().unwrap_or_default();
        let generation = config.metadata.generation;
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(e) = entries.get(&name)
            && e.uid == uid
            && e.generation == generation
            && generation.is_some()
        {
            return Arc::clone(&e.rules);
        }
        let rules = Arc::new(
            config
                .spec
                .selection_rules
                .iter()
                .map(|r| CompiledRule::compile(&r.condition, r.priority))
                .collect::<Vec<_>>(),
        );
        entries.insert(
            name,
            CacheEntry {
                uid,
                generation,
                rules: Arc::clone(&rules),
            },
        );
        rules
    }

    /// Forget configs that no longer exist.
    pub fn retain(&self, names: &[String]) {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.retain(|k, _| names.contains(k));
    }
}

/// A rule that failed, to be reported on its config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    /// The config (provider) name.
    pub provider: String,
    /// Generation of the config.
    pub generation: Option<i64>,
    /// Index of the rule in `spec.selectionRules`.
    pub index: usize,
    /// The rule's CEL source.
    pub condition: String,
    /// What went wrong.
    pub error: String,
    /// Whether it failed to compile (true) or at evaluation (false).
    pub compile: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The borrowed values the context binds are the values [`to_cel`] makes: every
    /// kind of JSON value, typed the same (integers `int`, a number past `i64` `double`).
    #[test]
    fn bound_values_are_typed_as_to_cel_types_them() {
        let json = serde_json::json!({
            "s": "text", "i": -3, "big": u64::MAX, "f": 1.5, "t": true, "n": null,
            "list": [1, "two", [3.0], {"k": "v"}], "map": {"a": {"b": [false]}}, "empty": {},
        });
        let mut ctx = Context::with_env(Arc::clone(&ENV));
        ctx.add_variable_as_val("bound", to_val(&json));
        ctx.add_variable_from_value("converted", to_cel(&json));
        for expr in [
            "bound == converted",
            "type(bound.i) == int && type(converted.i) == int",
            "type(bound.big) == double && type(converted.big) == double",
            "bound.list[3].k == 'v' && size(bound.list) == 4",
            "bound.map.a.b[0] == false && bound.n == null && size(bound.empty) == 0",
            "bound.s.startsWith('te') && 's' in bound",
        ] {
            let program = ENV.compile(expr).unwrap();
            assert_eq!(
                program.execute(&ctx).unwrap(),
                CelValue::Bool(true),
                "{expr}"
            );
        }
        let differs = ENV.compile("bound.s == converted.i").unwrap();
        assert_eq!(differs.execute(&ctx).unwrap(), CelValue::Bool(false));
    }
}
