//! Admission webhooks for ModelDeployment, speaking `admission.k8s.io/v1`
//! AdmissionReview.
//!
//! - Validating (`/validate-modeldeployment`): that an explicitly named provider is
//!   registered and serves, a field that does not decode, a flag set both in `engine.args`
//!   and `engine.extraArgs`, warnings, and for an inline warmup custom action whether its
//!   author may create pods there, asked of the API server ([`crate::access`]). The rules a
//!   CRD can state are the CRD's, enforced by the API server before this webhook is called.
//! - Mutating (`/mutate-modeldeployment`): on creation the validating checks first (one
//!   admission call per create: the API server calls the validating webhook for changes
//!   of the spec only, unless the chart asks for it on creation too), then the defaults,
//!   and on creation the finalizer of the provider core will select, as a JSON patch.
//!
//! Every request gets an AdmissionReview back, malformed ones included (`allowed: false`
//! with the reason); nothing a client sends makes the handler panic.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::runtime::reflector::ObjectRef;
use kubeairunway_sdk::{InferenceProviderConfig, ModelDeployment, finalizers, labels};
use serde_json::Value;
use tracing::{debug, warn};

use crate::access;
use crate::selection::{self, Outcome, RuleCache};
use crate::validation::{
    provider_does_not_serve, provider_not_installed, validate, warnings, webhook_errors,
};
use kubeairunway_sdk::engine_choice;

/// Path of the validating webhook.
pub const VALIDATE_PATH: &str = "/validate-modeldeployment";
/// Path of the mutating webhook.
pub const MUTATE_PATH: &str = "/mutate-modeldeployment";
/// Largest request body accepted (the API server sends at most a few MiB).
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// What the webhook knows about a named provider.
enum Registration {
    /// The cache has not synced (or there is none): cannot tell.
    Unknown,
    /// No InferenceProviderConfig of that name.
    Missing,
    /// Registered, lists engines.
    Serving,
    /// Registered, but only capabilities (no engines).
    CapabilityOnly,
}

/// How the mutating webhook foresees the provider core will select: core's own selection
/// settings, over a rule cache of its own.
#[derive(Clone, Debug)]
pub struct Foresight {
    /// Whether core runs the built-in selector (`--enable-provider-selector`); without it
    /// only an explicitly named provider is foreseen.
    pub selector: bool,
    /// Core's selection settings.
    pub settings: selection::Settings,
    rules: Arc<RuleCache>,
}

impl Foresight {
    /// Foresee as core selects with these settings.
    pub fn new(selector: bool, settings: selection::Settings) -> Self {
        Self {
            selector,
            settings,
            rules: Arc::default(),
        }
    }
}

/// Where the webhook looks up registered providers.
#[derive(Clone)]
pub struct WebhookState {
    providers: Option<kubeairunway_sdk::reflect::Cache<InferenceProviderConfig>>,
    foresight: Option<Foresight>,
    access: Option<kube::Client>,
}

impl std::fmt::Debug for WebhookState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookState")
            .field("providers", &self.providers.is_some())
            .field("foresight", &self.foresight)
            .field("access", &self.access.is_some())
            .finish()
    }
}

impl WebhookState {
    /// Webhooks that check explicitly named providers against this cache (`None`: never
    /// check).
    pub fn new(
        providers: Option<kubeairunway_sdk::reflect::Cache<InferenceProviderConfig>>,
    ) -> Self {
        Self {
            providers,
            foresight: None,
            access: None,
        }
    }

    /// Also ask the API server, with this client, whether the author of an inline warmup
    /// custom action may create pods in its namespace ([`crate::access`]); without it (a
    /// webhook answering offline) nobody is asked.
    pub fn reviewing_access(mut self, client: kube::Client) -> Self {
        self.access = Some(client);
        self
    }

    /// Also write, when a ModelDeployment is created, the finalizer of the provider core
    /// will select ([`Foresight`]), so that the provider does not have to add it: one
    /// request fewer per ModelDeployment. A wrong guess (the providers changed in
    /// between) holds nothing: core removes it when it selects another provider.
    pub fn foreseeing(mut self, foresight: Foresight) -> Self {
        self.foresight = Some(foresight);
        self
    }

    /// The provider core will select for `md` (defaults applied), when the cache of
    /// providers has synced and one will be (`checked`: `md` is known to be valid).
    fn foreseen_provider(&self, md: &ModelDeployment, checked: Checked) -> Option<String> {
        let foresight = self.foresight.as_ref()?;
        let store = self.providers.as_ref().filter(|s| s.is_synced())?;
        if labels::is_paused(md.metadata.annotations.as_ref())
            || (checked == Checked::No && !validate(&md.spec).is_valid())
        {
            return None;
        }
        if let Some(name) = md.spec.provider_name() {
            return matches!(self.provider_registered(name), Registration::Serving)
                .then(|| name.to_string());
        }
        if !foresight.selector {
            return None;
        }
        let configs = store.store.state();
        let now = Timestamp::now();
        // With no engine in the spec, selection runs over the engine core will choose.
        let resolved;
        let md = if md.spec.engine.type_.is_some() {
            md
        } else {
            let choice = engine_choice::choose_engine(
                md,
                &configs,
                &foresight.rules,
                &foresight.settings,
                now,
            );
            resolved = engine_choice::with_engine(md, choice.engine()?);
            &resolved
        };
        let chosen = selection::select(md, &configs, &foresight.rules, &foresight.settings, now);
        match chosen.outcome {
            Outcome::Selected { provider, .. } => Some(provider),
            _ => None,
        }
    }

    /// What the cache knows of a provider.
    fn provider_registered(&self, name: &str) -> Registration {
        let Some(store) = self.providers.as_ref() else {
            return Registration::Unknown;
        };
        if !store.is_synced() {
            return Registration::Unknown;
        }
        match store.store.get(&ObjectRef::new(name)) {
            None => Registration::Missing,
            Some(c) if c.spec.serves() => Registration::Serving,
            Some(_) => Registration::CapabilityOnly,
        }
    }
}

/// The webhook routes.
pub fn router(state: WebhookState) -> Router {
    Router::new()
        .route(VALIDATE_PATH, post(validate_handler))
        .route(MUTATE_PATH, post(mutate_handler))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(Arc::new(state))
}

pub use kubeairunway_sdk::admission::review_json;

fn respond(resp: AdmissionResponse) -> Response {
    match review_json(resp).and_then(|v| serde_json::to_vec(&v)) {
        Ok(body) => (
            StatusCode::OK,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A response for a request that could not be read, keeping its uid when it has one.
fn invalid(raw: Option<&Value>, reason: &str) -> AdmissionResponse {
    let mut resp = AdmissionResponse::invalid(reason);
    if let Some(uid) = raw
        .and_then(|v| v.pointer("/request/uid"))
        .and_then(Value::as_str)
    {
        resp.uid = uid.to_string();
    }
    if let Some(api_version) = raw
        .and_then(|v| v.get("apiVersion"))
        .and_then(Value::as_str)
        .filter(|v| v.starts_with("admission.k8s.io/"))
    {
        resp.types.api_version = api_version.to_string();
    }
    resp
}

/// Parse a request body into an AdmissionRequest for a ModelDeployment.
fn parse(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, Box<AdmissionResponse>> {
    let raw: Value = serde_json::from_slice(body)
        .map_err(|e| Box::new(invalid(None, &format!("malformed AdmissionReview: {e}"))))?;
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_value(raw.clone()).map_err(|e| {
            Box::new(invalid(
                Some(&raw),
                &format!("malformed AdmissionReview: {e}"),
            ))
        })?;
    if review.types.kind != "AdmissionReview" {
        return Err(Box::new(invalid(
            Some(&raw),
            &format!("expected kind AdmissionReview, got {:?}", review.types.kind),
        )));
    }
    let req: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|_| Box::new(invalid(Some(&raw), "AdmissionReview without a request")))?;
    if req.kind.group != kubeairunway_sdk::GROUP || req.kind.kind != "ModelDeployment" {
        let reason = format!(
            "this webhook admits kubeairunway.ai ModelDeployments, not {}/{} {}",
            req.kind.group, req.kind.version, req.kind.kind
        );
        return Err(Box::new(AdmissionResponse::from(&req).deny(reason)));
    }
    Ok(req)
}

/// The typed ModelDeployment; an error names the field that does not decode (for example
/// `spec.scaling.replicas: invalid type: string "two", expected i32`).
fn typed(obj: &DynamicObject) -> Result<ModelDeployment, String> {
    typed_value(serde_json::to_value(obj).map_err(|e| e.to_string())?)
}

/// [`typed`], from the object as JSON.
fn typed_value(value: Value) -> Result<ModelDeployment, String> {
    serde_path_to_error::deserialize(value)
        .map_err(|e| format!("invalid ModelDeployment: {}: {}", e.path(), e.inner()))
}

/// Decide a validating request.
pub fn review_validate(
    req: &AdmissionRequest<DynamicObject>,
    state: &WebhookState,
) -> AdmissionResponse {
    let resp = AdmissionResponse::from(req);
    let Some(obj) = req.object.as_ref() else {
        // DELETE and CONNECT carry no object: nothing to validate.
        return resp;
    };
    if matches!(req.operation, Operation::Delete | Operation::Connect) {
        return resp;
    }
    if obj.metadata.deletion_timestamp.is_some() {
        // Never block finalizers from being removed.
        return resp;
    }
    let md = match typed(obj) {
        Ok(md) => md,
        Err(e) => return resp.deny(e),
    };
    // The CRD's own rules (engine.type required, GPUs, disaggregated roles, ...) are not
    // repeated here: the API server evaluates them before it calls this webhook and
    // refuses a spec that breaks one, so a copy here would never refuse anything. What is
    // left is what a CRD cannot say: warnings, and whether a named provider is registered.
    // What a CRD rule cannot say: a flag set both in engine.args and engine.extraArgs.
    if let Some(error) = webhook_errors(&md.spec).into_iter().next() {
        return resp.deny(format!("{}: {}", error.field, error.message));
    }
    let mut resp = resp;
    let warnings = warnings(&md.spec);
    if !warnings.is_empty() {
        resp.warnings = Some(warnings);
    }
    if let Some(name) = md.spec.provider_name() {
        let old_name = req
            .old_object
            .as_ref()
            .and_then(|o| typed(o).ok())
            .and_then(|o| o.spec.provider_name().map(str::to_string));
        if old_name.as_deref() != Some(name) {
            match state.provider_registered(name) {
                Registration::Serving => {}
                Registration::CapabilityOnly => return resp.deny(provider_does_not_serve(name)),
                Registration::Missing => return resp.deny(provider_not_installed(name)),
                Registration::Unknown => {
                    resp.warnings.get_or_insert_with(Vec::new).push(format!(
                        "could not check that provider '{name}' is installed yet"
                    ));
                }
            }
        }
    }
    resp
}

/// Decide a mutating request: the defaults, and on creation the finalizer of the
/// provider core will select, as a JSON patch.
pub fn review_mutate(
    req: &AdmissionRequest<DynamicObject>,
    state: &WebhookState,
) -> AdmissionResponse {
    mutate_review(req, state, Checked::No)
}

/// Whether the object under review is known to keep the CRD's rules and the webhook's
/// (checked already in this review: not checked again, the costliest part of a review).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Checked {
    Yes,
    No,
}

/// [`review_mutate`], the object's validity `checked` or not.
fn mutate_review(
    req: &AdmissionRequest<DynamicObject>,
    state: &WebhookState,
    checked: Checked,
) -> AdmissionResponse {
    let resp = AdmissionResponse::from(req);
    let Some(obj) = req.object.as_ref() else {
        return resp;
    };
    if matches!(req.operation, Operation::Delete | Operation::Connect) {
        return resp;
    }
    let original = match serde_json::to_value(obj) {
        Ok(v) => v,
        Err(e) => return resp.deny(format!("unreadable object: {e}")),
    };
    if original.get("spec").is_none() {
        // Nothing to default; validation reports the missing spec.
        return resp;
    }
    let mut defaulted = original.clone();
    if let Some(spec) = defaulted.get_mut("spec") {
        crate::defaults::apply(spec);
    }
    if req.operation == Operation::Create {
        add_foreseen_finalizer(&mut defaulted, state, checked);
    }
    let patch = json_patch::diff(&original, &defaulted);
    if patch.0.is_empty() {
        return resp;
    }
    match resp.clone().with_patch(patch) {
        Ok(r) => r,
        Err(e) => resp.deny(format!("building patch: {e}")),
    }
}

/// Add the finalizer of the provider core will select to `object` (a ModelDeployment
/// with its defaults), if one is foreseen.
fn add_foreseen_finalizer(object: &mut Value, state: &WebhookState, checked: Checked) {
    let Some(md) = serde_json::from_value::<ModelDeployment>(object.clone()).ok() else {
        return;
    };
    let Some(provider) = state.foreseen_provider(&md, checked) else {
        return;
    };
    let Some(finalizers) = finalizers::with(&md, &finalizers::of_provider(&provider)) else {
        return;
    };
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("finalizers".into(), Value::from(finalizers));
    }
}

/// Answer a validating request body with the checks that need no request of their own
/// (what [`validate_checked`] does before it asks the API server anything).
pub fn validate_body(body: &[u8], state: &WebhookState) -> AdmissionResponse {
    validate_parsed(body, state).0
}

/// Answer a validating request body (what the HTTP handler does, without HTTP): the pure
/// checks, then, for an inline custom action, the author's right to create pods.
pub async fn validate_checked(body: &[u8], state: &WebhookState) -> AdmissionResponse {
    let (r, review) = validate_parsed(body, state);
    ask_access(r, review, state).await
}

/// `r`, or the refusal of the custom action's author when `review` (the access review a
/// validation needs) says no.
async fn ask_access(
    r: AdmissionResponse,
    review: Option<SubjectAccessReview>,
    state: &WebhookState,
) -> AdmissionResponse {
    match (review, &state.access) {
        (Some(review), Some(client)) => {
            match kubeairunway_sdk::access::ask(client, access::CUSTOM_ACTION_FIELD, &review).await
            {
                Some(refusal) => {
                    debug!(uid = %r.uid, %refusal, "refused a custom action");
                    kubeairunway_sdk::access::forbidden(r, refusal)
                }
                None => r,
            }
        }
        _ => r,
    }
}

/// The pure answer, and the SubjectAccessReview to ask when it admits.
fn validate_parsed(
    body: &[u8],
    state: &WebhookState,
) -> (AdmissionResponse, Option<SubjectAccessReview>) {
    match parse(body) {
        Ok(req) => {
            let r = review_validate(&req, state);
            debug!(uid = %req.uid, allowed = r.allowed, name = %req.name, namespace = ?req.namespace, "validated");
            let review = r.allowed.then(|| access_review(&req)).flatten();
            (r, review)
        }
        Err(r) => {
            warn!(reason = %r.result.message, "rejected a malformed validating request");
            (*r, None)
        }
    }
}

/// The SubjectAccessReview `req` needs ([`access::review_for`]), for an object that
/// decodes (one that does not was denied already).
fn access_review(req: &AdmissionRequest<DynamicObject>) -> Option<SubjectAccessReview> {
    let new = typed(req.object.as_ref()?).ok()?;
    let old = req.old_object.as_ref().and_then(|o| typed(o).ok());
    access::review_for(req, &new, old.as_ref())
}

/// Whether the API server will refuse `req`'s object after mutation by the CRD's own
/// schema or rules (it validates between the mutating and the validating webhooks): then
/// the mutating webhook leaves the refusal to it, with its own words and every field it
/// names, as when the validating webhook checked creations.
fn crd_refuses(req: &AdmissionRequest<DynamicObject>) -> bool {
    let Some(obj) = req.object.as_ref() else {
        return false;
    };
    let Ok(value) = serde_json::to_value(obj) else {
        return true;
    };
    // `check` reads the spec with its defaults, as the API server will see it.
    value
        .get("spec")
        .is_none_or(|spec| !kubeairunway_sdk::validation::check(spec).is_empty())
        || typed_value(value).is_err()
}

/// Answer a mutating request body with the checks that need no request of their own
/// (what [`mutate_checked`] does before it asks the API server anything).
pub fn mutate_body(body: &[u8], state: &WebhookState) -> AdmissionResponse {
    mutate_parsed(body, state).0
}

/// Answer a mutating request body (what the HTTP handler does, without HTTP): on creation
/// the validation ([`validate_checked`]'s, the custom action's access review included),
/// then the defaults and the foreseen finalizer, the validation's warnings kept.
pub async fn mutate_checked(body: &[u8], state: &WebhookState) -> AdmissionResponse {
    let (r, review) = mutate_parsed(body, state);
    ask_access(r, review, state).await
}

/// The pure answer to a mutating request, and the SubjectAccessReview to ask when it
/// admits a creation.
fn mutate_parsed(
    body: &[u8],
    state: &WebhookState,
) -> (AdmissionResponse, Option<SubjectAccessReview>) {
    let req = match parse(body) {
        Ok(req) => req,
        Err(r) => {
            warn!(reason = %r.result.message, "rejected a malformed mutating request");
            return (*r, None);
        }
    };
    if req.operation != Operation::Create || crd_refuses(&req) {
        return (review_mutate(&req, state), None);
    }
    let verdict = review_validate(&req, state);
    debug!(uid = %req.uid, allowed = verdict.allowed, name = %req.name, namespace = ?req.namespace, "validated on creation");
    if !verdict.allowed {
        return (verdict, None);
    }
    // Neither refused by the CRD's rules (`crd_refuses`) nor by the webhook's.
    let mut r = mutate_review(&req, state, Checked::Yes);
    if r.allowed
        && let Some(warnings) = verdict.warnings
    {
        r.warnings.get_or_insert_with(Vec::new).extend(warnings);
    }
    let review = r.allowed.then(|| access_review(&req)).flatten();
    (r, review)
}

async fn validate_handler(State(state): State<Arc<WebhookState>>, body: Bytes) -> Response {
    respond(validate_checked(&body, &state).await)
}

async fn mutate_handler(State(state): State<Arc<WebhookState>>, body: Bytes) -> Response {
    respond(mutate_checked(&body, &state).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;
    use serde_json::json;

    fn review() -> Value {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": "kubeairunway.ai", "version": "v1alpha1", "kind": "ModelDeployment"},
                "resource": {"group": "kubeairunway.ai", "version": "v1alpha1", "resource": "modeldeployments"},
                "name": "m", "namespace": "ns", "operation": "UPDATE", "userInfo": {"username": "x"},
                "object": {"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
                    "metadata": {"name": "m", "namespace": "ns", "labels": {"a": "b"}},
                    "spec": {"model": {"id": "a/b", "servedName": "s"}, "engine": {"type": "vllm", "args": {"k": "v"}},
                        "provider": {"name": "p", "overrides": {"x": 1}},
                        "serving": {"mode": "disaggregated"},
                        "resources": {"gpu": {"count": 1}},
                        "scaling": {"replicas": 2, "prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 1}}}}},
                "oldObject": {"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
                    "metadata": {"name": "m", "namespace": "ns"}, "spec": {"model": {"id": "a/b"}, "engine": {"type": "sglang"}}}
            }
        })
    }

    /// Every JSON pointer of a value.
    fn pointers(v: &Value, at: &str, out: &mut Vec<String>) {
        out.push(at.to_string());
        match v {
            Value::Object(m) => m
                .iter()
                .for_each(|(k, c)| pointers(c, &format!("{at}/{k}"), out)),
            Value::Array(a) => a
                .iter()
                .enumerate()
                .for_each(|(i, c)| pointers(c, &format!("{at}/{i}"), out)),
            _ => {}
        }
    }

    #[test]
    fn any_mangled_review_gets_an_answer_never_a_panic() {
        let state = WebhookState::new(None);
        let base = review();
        let mut paths = Vec::new();
        pointers(&base, "", &mut paths);
        let replacements = [
            Value::Null,
            json!(0),
            json!(-1),
            json!(1e308),
            json!(u64::MAX),
            json!("x"),
            json!(""),
            json!("a".repeat(10_000)),
            json!([]),
            json!({}),
            json!(true),
            json!([{"type": 1}]),
        ];
        let mut answered = 0;
        for path in &paths {
            for r in &replacements {
                let mut v = base.clone();
                if path.is_empty() {
                    v = r.clone();
                } else if let Some(slot) = v.pointer_mut(path) {
                    *slot = r.clone();
                }
                let body = serde_json::to_vec(&v).unwrap();
                for resp in [validate_body(&body, &state), mutate_body(&body, &state)] {
                    assert!(review_json(resp).is_ok());
                    answered += 1;
                }
            }
        }
        // Truncated bodies at every length.
        let body = serde_json::to_vec(&base).unwrap();
        for n in 0..body.len() {
            let resp = validate_body(&body[..n], &state);
            assert!(!resp.allowed, "truncated at {n}");
            answered += 1;
        }
        assert!(answered > 1000);
    }

    proptest::proptest! {
        /// Any value at any field of the spec: both webhooks answer; a spec that does not
        /// decode is refused with the field that does not (the changed one, a field
        /// inside it, or the object holding it when it is now missing).
        #[test]
        fn any_value_anywhere_in_the_spec_is_answered_and_a_refusal_names_the_field(
            at in proptest::sample::select({
                let mut paths = Vec::new();
                pointers(&review()["request"]["object"]["spec"], "/request/object/spec", &mut paths);
                paths
            }),
            value in proptest::prop_oneof![
                proptest::strategy::Just(Value::Null),
                proptest::prelude::any::<bool>().prop_map(Value::from),
                proptest::prelude::any::<i64>().prop_map(Value::from),
                proptest::prelude::any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::from)),
                "\\PC{0,10}".prop_map(Value::from),
                proptest::collection::vec("\\PC{0,4}".prop_map(Value::from), 0..3).prop_map(Value::from),
                proptest::collection::btree_map("[a-zA-Z]{1,6}", proptest::prelude::any::<i32>(), 0..3)
                    .prop_map(|m| serde_json::to_value(m).unwrap()),
            ],
        ) {
            let state = WebhookState::new(None);
            let mut v = review();
            *v.pointer_mut(&at).unwrap() = value;
            let body = serde_json::to_vec(&v).unwrap();
            let validated = validate_body(&body, &state);
            proptest::prop_assert_eq!(&validated.uid, "u");
            let mutated = mutate_body(&body, &state);
            proptest::prop_assert_eq!(&mutated.uid, "u");
            let message = validated.result.message.clone();
            if let Some(rest) = message.strip_prefix("invalid ModelDeployment: ") {
                let named = rest.split(':').next().unwrap_or_default();
                let changed = at.trim_start_matches("/request/object/").replace('/', ".");
                proptest::prop_assert!(
                    named.starts_with(&changed) || changed.starts_with(named),
                    "changed {changed}, refusal names {named}: {message}"
                );
            }
        }
    }

    /// A flag set both in `engine.args` and `engine.extraArgs` is refused, naming the
    /// field and both spellings, as AI Runway's webhook refuses it.
    #[test]
    fn a_flag_in_both_args_and_extra_args_is_denied() {
        let state = WebhookState::new(None);
        let mut v = review();
        v["request"]["object"]["spec"]["provider"] = json!({});
        v["request"]["object"]["spec"]["engine"]["extraArgs"] = json!(["--k=w"]);
        let resp = validate_body(&serde_json::to_vec(&v).unwrap(), &state);
        assert!(!resp.allowed);
        assert!(
            resp.result.message.starts_with(
                "spec.engine.extraArgs: the flag --k is set both in spec.engine.args (\"k\")"
            ),
            "{}",
            resp.result.message
        );
        v["request"]["object"]["spec"]["engine"]["extraArgs"] = json!(["--other", "k"]);
        let resp = validate_body(&serde_json::to_vec(&v).unwrap(), &state);
        assert!(resp.allowed, "{}", resp.result.message);
    }

    /// On creation the mutating webhook validates first, as the validating webhook does
    /// (the API server calls only the mutating one for a create): what validation refuses
    /// is refused with the same message, its warnings come with the patch; a change of the
    /// spec is left to the validating webhook.
    #[test]
    fn a_creation_is_validated_by_the_mutating_webhook_too() {
        let state = WebhookState::new(None);
        let mut v = review();
        v["request"]["operation"] = json!("CREATE");
        v["request"]["object"]["spec"] = json!({"model": {"id": "a/b"},
            "engine": {"type": "vllm", "args": {"k": "v"}, "extraArgs": ["--k=w"]}});
        let body = serde_json::to_vec(&v).unwrap();
        let (validated, mutated) = (validate_body(&body, &state), mutate_body(&body, &state));
        assert!(!validated.allowed && !mutated.allowed);
        assert_eq!(mutated.result.message, validated.result.message);
        assert!(mutated.patch.is_none());
        // The same change of an existing object: the mutating webhook only defaults.
        v["request"]["operation"] = json!("UPDATE");
        let resp = mutate_body(&serde_json::to_vec(&v).unwrap(), &state);
        assert!(resp.allowed, "{}", resp.result.message);
        // A creation the CRD's own rules refuse (no GPU for vLLM): left to the API
        // server's words, as when the validating webhook checked creations.
        let mut crd = v.clone();
        crd["request"]["operation"] = json!("CREATE");
        crd["request"]["object"]["spec"]["resources"] = json!({"gpu": {"count": 0}});
        let resp = mutate_body(&serde_json::to_vec(&crd).unwrap(), &state);
        assert!(resp.allowed, "{}", resp.result.message);
        // A valid creation: the defaults' patch, and the validation's warnings with it (a
        // served name a custom source ignores).
        let mut v = review();
        v["request"]["operation"] = json!("CREATE");
        v["request"]["object"]["spec"] = json!({"model": {"id": "a/b", "source": "custom", "servedName": "s"},
            "engine": {"type": "vllm"}});
        let body = serde_json::to_vec(&v).unwrap();
        let (validated, mutated) = (validate_body(&body, &state), mutate_body(&body, &state));
        assert!(
            validated.allowed && mutated.allowed,
            "{}",
            mutated.result.message
        );
        assert!(mutated.patch.is_some());
        assert!(validated.warnings.as_ref().is_some_and(|w| !w.is_empty()));
        for w in validated.warnings.unwrap() {
            assert!(
                mutated.warnings.as_ref().is_some_and(|m| m.contains(&w)),
                "{w}"
            );
        }
    }

    /// A vLLM spec with no GPU request is patched to one GPU (the default AI Runway's
    /// webhook gives); one with `gpu.count: 0` keeps it, for the CRD's rule to refuse.
    #[test]
    fn a_gpu_engine_without_a_gpu_request_is_patched_to_one_gpu() {
        let patched = |spec: Value| {
            let mut v = review();
            v["request"]["operation"] = json!("CREATE");
            v["request"]["object"]["spec"] = spec;
            let resp = mutate_body(&serde_json::to_vec(&v).unwrap(), &WebhookState::new(None));
            assert!(resp.allowed);
            let mut object = v["request"]["object"].clone();
            if let Some(patch) = resp.patch {
                let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
                json_patch::patch(&mut object, &patch).unwrap();
            }
            object["spec"]["resources"].clone()
        };
        assert_eq!(
            patched(json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}})),
            json!({"gpu": {"count": 1, "type": "nvidia.com/gpu"}})
        );
        assert_eq!(
            patched(
                json!({"model": {"id": "a/b"}, "engine": {"type": "trtllm"}, "resources": {"memory": "8Gi"}})
            ),
            json!({"memory": "8Gi", "gpu": {"count": 1, "type": "nvidia.com/gpu"}})
        );
        assert_eq!(
            patched(
                json!({"model": {"id": "a/b"}, "engine": {"type": "sglang"}, "resources": {"gpu": {"count": 0}}})
            ),
            json!({"gpu": {"count": 0, "type": "nvidia.com/gpu"}})
        );
        assert_eq!(
            patched(json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}})),
            Value::Null
        );
    }

    #[test]
    fn patch_is_base64_in_the_review() {
        let mut v = review();
        v["request"]["operation"] = json!("CREATE");
        let resp = mutate_body(&serde_json::to_vec(&v).unwrap(), &WebhookState::new(None));
        let json = review_json(resp).unwrap();
        assert!(json["response"]["patch"].is_string(), "{json}");
        assert_eq!(json["response"]["patchType"], "JSONPatch");
    }

    /// A ready provider with a fresh heartbeat, serving vLLM on GPUs, with `rules`.
    #[allow(clippy::needless_pass_by_value)] // reads better at the call sites
    fn provider(name: &str, rules: Value) -> InferenceProviderConfig {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let spec = serde_json::from_value(json!({
            "capabilities": {"engines": ["vllm"], "servingModes": ["aggregated"], "gpuSupport": true},
            "selectionRules": rules,
        }))
        .unwrap();
        let mut c = InferenceProviderConfig::new(name, spec);
        c.metadata.generation = Some(1);
        c.metadata.uid = Some(name.into());
        c.status = Some(kubeairunway_sdk::InferenceProviderConfigStatus {
            ready: Some(true),
            last_heartbeat: Some(Time(Timestamp::now())),
            ..Default::default()
        });
        c
    }

    /// The finalizers of the object `mutate_body` returns for `spec` and `operation`.
    fn finalizers_after(
        state: &WebhookState,
        operation: &str,
        metadata: Value,
        spec: Value,
    ) -> Value {
        let mut v = review();
        v["request"]["operation"] = json!(operation);
        v["request"]["object"]["metadata"] = metadata;
        v["request"]["object"]["spec"] = spec;
        let resp = mutate_body(&serde_json::to_vec(&v).unwrap(), state);
        assert!(resp.allowed, "{}", resp.result.message);
        let mut object = v["request"]["object"].clone();
        if let Some(patch) = resp.patch {
            let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
            json_patch::patch(&mut object, &patch).unwrap();
        }
        object["metadata"]["finalizers"].clone()
    }

    /// On creation, the finalizer of the provider core will select is written: the one
    /// named, or the one the rules choose; none when none will be, when the caches cannot
    /// tell, when the ModelDeployment is paused, and never on an update.
    #[test]
    fn creation_gets_the_finalizer_of_the_provider_core_will_select() {
        let providers = [
            provider("low", json!([{"condition": "true", "priority": 10}])),
            provider(
                "high",
                json!([{"condition": "spec.model.id.startsWith('big/')", "priority": 50}]),
            ),
        ];
        let cache = kubeairunway_sdk::reflect::Cache::fixed(providers, ());
        let settings = selection::Settings::default();
        let state = WebhookState::new(Some(cache.clone()))
            .foreseeing(Foresight::new(true, settings.clone()));
        let meta = json!({"name": "m", "namespace": "ns", "finalizers": ["user.example/keep"]});
        let vllm = |id: &str| json!({"model": {"id": id}, "engine": {"type": "vllm"}});
        assert_eq!(
            finalizers_after(&state, "CREATE", meta.clone(), vllm("big/m")),
            json!(["user.example/keep", "kubeairunway.ai/high-provider"])
        );
        assert_eq!(
            finalizers_after(&state, "CREATE", meta.clone(), vllm("small/m")),
            json!(["user.example/keep", "kubeairunway.ai/low-provider"])
        );
        let mut named = vllm("big/m");
        named["provider"] = json!({"name": "low"});
        assert_eq!(
            finalizers_after(&state, "CREATE", meta.clone(), named.clone()),
            json!(["user.example/keep", "kubeairunway.ai/low-provider"])
        );
        // No engine: the provider core selects over the engine it chooses (vLLM).
        assert_eq!(
            finalizers_after(
                &state,
                "CREATE",
                meta.clone(),
                json!({"model": {"id": "big/m"}})
            ),
            json!(["user.example/keep", "kubeairunway.ai/high-provider"])
        );
        let keep = json!(["user.example/keep"]);
        // No provider fits a CPU-only llama.cpp spec.
        let cpu = json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}});
        assert_eq!(finalizers_after(&state, "CREATE", meta.clone(), cpu), keep);
        assert_eq!(
            finalizers_after(&state, "UPDATE", meta.clone(), vllm("big/m")),
            keep
        );
        let paused = json!({"name": "m", "namespace": "ns", "finalizers": ["user.example/keep"],
            "annotations": {"kubeairunway.ai/reconcile-paused": "true"}});
        assert_eq!(
            finalizers_after(&state, "CREATE", paused, vllm("big/m")),
            keep
        );
        // Without the built-in selector only a named provider is foreseen.
        let custom = WebhookState::new(Some(cache)).foreseeing(Foresight::new(false, settings));
        assert_eq!(
            finalizers_after(&custom, "CREATE", meta.clone(), vllm("big/m")),
            keep
        );
        assert_eq!(
            finalizers_after(&custom, "CREATE", meta.clone(), named),
            json!(["user.example/keep", "kubeairunway.ai/low-provider"])
        );
        // Without a cache (or one not synced) nothing is foreseen.
        let blind = WebhookState::new(None)
            .foreseeing(Foresight::new(true, selection::Settings::default()));
        assert_eq!(
            finalizers_after(&blind, "CREATE", meta, vllm("big/m")),
            keep
        );
    }
}
