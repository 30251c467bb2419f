//! Kubernetes events (`events.k8s.io/v1`) as every controller of the platform publishes
//! them: the same events kube's `Recorder` writes, with the same repeat rule (an event
//! repeated within six minutes by the same reporter, about the same object, with the same
//! type, action, reason and related object, counts up the first one's `series` instead of
//! creating another, as client-go's event broadcaster does), at a fraction of the memory.
//!
//! kube's recorder (kube-runtime 5.0.0, `events.rs`) keeps every event it published in
//! the last six minutes whole, and walks all of them on every publish to drop the old
//! ones. A provider publishes about two events per ModelDeployment it deploys, so a
//! rollout of 10,000 held 20,000 events (about 1.5 kB each) and made 20,000 walks of up
//! to 20,000 entries. Here an event that may repeat is remembered by a hash of its key,
//! with its name and count, and old ones are dropped at most once a minute.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
pub use kube::runtime::events::{Event, EventType, Reporter};

/// `Warning` when `warning`, else `Normal`: the flag pure decisions return.
pub fn event_type(warning: bool) -> EventType {
    if warning {
        EventType::Warning
    } else {
        EventType::Normal
    }
}

/// An event of `reason` with `note` for `action`, a warning when `warning`.
pub fn event(warning: bool, reason: &str, note: String, action: &str) -> Event {
    Event {
        type_: event_type(warning),
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    }
}
use serde_json::json;

/// How long a published event may be counted up by a repeat (kube's and client-go's).
const REPEAT_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// How often the events too old to repeat are forgotten.
const SWEEP_EVERY: SignedDuration = SignedDuration::from_mins(1);

/// What is remembered of a published event.
#[derive(Clone, Debug)]
struct Published {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

impl Published {
    /// Whether a repeat at `now` still counts up this event.
    fn repeatable(&self, now: Timestamp) -> bool {
        self.last + REPEAT_WINDOW > now
    }
}

#[derive(Debug)]
struct Memory {
    published: HashMap<u64, Published>,
    swept: Timestamp,
}

/// Publishes events for one reporter (controller and instance).
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    memory: Arc<Mutex<Memory>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder reporting as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            memory: Arc::new(Mutex::new(Memory {
                published: HashMap::new(),
                swept: Timestamp::now(),
            })),
        }
    }

    /// What makes two events the same event, as kube's `EventKey`: type, action, reason,
    /// reporter, the object it is about and the related one (not the note).
    fn key(&self, ev: &Event, regarding: &ObjectReference) -> u64 {
        fn reference(r: &ObjectReference, h: &mut impl Hasher) {
            (&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid).hash(h);
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        matches!(ev.type_, EventType::Warning).hash(&mut h);
        (&ev.action, &ev.reason).hash(&mut h);
        (&self.reporter.controller, &self.reporter.instance).hash(&mut h);
        reference(regarding, &mut h);
        if let Some(related) = &ev.secondary {
            reference(related, &mut h);
        }
        h.finish()
    }

    /// The event as kube's recorder creates it.
    fn event(&self, ev: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_ref().unwrap_or(&self.reporter.controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_string(),
            ),
            related: ev.secondary.clone(),
            ..K8sEvent::default()
        }
    }

    /// The earlier publication `key` may count up, if any; forgets the expired ones at
    /// most once per [`SWEEP_EVERY`].
    fn repeat_of(&self, key: u64, now: Timestamp) -> Option<Published> {
        let mut memory = self.memory.lock().ok()?;
        if memory.swept + SWEEP_EVERY <= now {
            memory.published.retain(|_, p| p.repeatable(now));
            memory.swept = now;
        }
        memory
            .published
            .get(&key)
            .filter(|p| p.repeatable(now))
            .cloned()
    }

    fn remember(&self, key: u64, published: Published) {
        if let Ok(mut memory) = self.memory.lock() {
            memory.published.insert(key, published);
        }
    }

    /// Publish `ev` about `regarding`, in its namespace (`default` for cluster-scoped
    /// objects): a new event, or a repeat counted on the earlier one.
    ///
    /// # Errors
    /// The API server's refusal of the event.
    pub async fn publish(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = self.key(ev, regarding);
        if let Some(earlier) = self.repeat_of(key, now) {
            let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &earlier.namespace);
            let count = earlier.count.saturating_add(1);
            // Only the series changes, as client-go patches a repeat
            // (`createPatchBytesForSeries`, tools/events/event_broadcaster.go).
            let series = json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}});
            match api
                .patch(
                    &earlier.name,
                    &PatchParams::default(),
                    &Patch::Merge(&series),
                )
                .await
            {
                Ok(_) => {
                    self.remember(
                        key,
                        Published {
                            count,
                            last: now,
                            ..earlier
                        },
                    );
                    return Ok(());
                }
                // Gone (events expire): publish it anew.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let event = self.event(ev, regarding, now);
        let namespace = event
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        self.remember(
            key,
            Published {
                namespace,
                name: event.metadata.name.unwrap_or_default(),
                count: 1,
                last: now,
            },
        );
        Ok(())
    }

    /// Events remembered for repeats (for tests of the memory bound).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.memory.lock().map_or(0, |m| m.published.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn recorder() -> (Recorder, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let reporter = Reporter {
            controller: "test-controller".into(),
            instance: None,
        };
        (
            Recorder::new(Client::new(service, "default"), reporter),
            handle,
        )
    }

    fn md(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("kubeairunway.ai/v1alpha1".into()),
            kind: Some("ModelDeployment".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        }
    }

    fn ev(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        }
    }

    /// Answer the next request with its own body (status `status`); return its method,
    /// path and body.
    async fn answer(handle: &mut Handle, status: u16) -> (String, String, serde_json::Value) {
        let (request, send) = handle.next_request().await.expect("a request");
        let (method, path) = (
            request.method().to_string(),
            request.uri().path().to_string(),
        );
        let body: serde_json::Value =
            serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
        let reply = if status == 404 {
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound", "message": "gone"})
        } else {
            body.clone()
        };
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap(),
        );
        (method, path, body)
    }

    #[tokio::test]
    async fn a_repeat_counts_up_the_first_event_and_anything_else_is_a_new_one() {
        let (recorder, mut api) = recorder();

        // The first event is created, as kube's recorder creates it.
        let publish = tokio::spawn({
            let r = recorder.clone();
            async move { r.publish(&ev("DriftDetected", "edited"), &md("a")).await }
        });
        let (method, path, body) = answer(&mut api, 201).await;
        publish.await.unwrap().unwrap();
        assert_eq!(
            (method.as_str(), path.as_str()),
            ("POST", "/apis/events.k8s.io/v1/namespaces/ns/events")
        );
        assert_eq!(body["reason"], "DriftDetected");
        assert_eq!(body["type"], "Warning");
        assert_eq!(body["reportingController"], "test-controller");
        assert_eq!(body["reportingInstance"], "test-controller");
        assert_eq!(body["regarding"]["name"], "a");
        let name = body["metadata"]["name"].as_str().unwrap().to_string();
        assert!(name.starts_with("a."), "{name}");

        // The same event again (another note, as kube's key ignores notes): its series.
        for count in [2, 3] {
            let publish = tokio::spawn({
                let r = recorder.clone();
                async move { r.publish(&ev("DriftDetected", "again"), &md("a")).await }
            });
            let (method, path, body) = answer(&mut api, 200).await;
            publish.await.unwrap().unwrap();
            assert_eq!(method, "PATCH");
            assert_eq!(
                path,
                format!("/apis/events.k8s.io/v1/namespaces/ns/events/{name}")
            );
            assert_eq!(body["series"]["count"], count);
            assert_eq!(
                body.as_object().unwrap().len(),
                1,
                "only the series: {body}"
            );
        }

        // Another reason, or another object: new events.
        for (reason, object) in [("Released", "a"), ("DriftDetected", "b")] {
            let publish = tokio::spawn({
                let r = recorder.clone();
                async move { r.publish(&ev(reason, "x"), &md(object)).await }
            });
            let (method, _, _) = answer(&mut api, 201).await;
            publish.await.unwrap().unwrap();
            assert_eq!(method, "POST", "{reason} about {object}");
        }
        assert_eq!(recorder.remembered(), 3);

        // A repeat of an event that is gone is published anew.
        let publish = tokio::spawn({
            let r = recorder.clone();
            async move { r.publish(&ev("Released", "x"), &md("a")).await }
        });
        assert_eq!(answer(&mut api, 404).await.0, "PATCH");
        assert_eq!(answer(&mut api, 201).await.0, "POST");
        publish.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn events_too_old_to_repeat_are_forgotten_at_the_next_sweep() {
        let (recorder, _api) = recorder();
        let now = Timestamp::now();
        let old = now - REPEAT_WINDOW - SignedDuration::from_secs(1);
        for (key, last) in [(1, old), (2, now)] {
            recorder.remember(
                key,
                Published {
                    namespace: "ns".into(),
                    name: format!("e{key}"),
                    count: 1,
                    last,
                },
            );
        }
        // Not yet swept: the old one is not a repeat, but still held.
        assert!(recorder.repeat_of(1, now).is_none());
        assert!(recorder.repeat_of(2, now).is_some());
        assert_eq!(recorder.remembered(), 2);
        // A minute later, the sweep drops it.
        let later = now + SWEEP_EVERY;
        assert!(recorder.repeat_of(2, later).is_some());
        assert_eq!(recorder.remembered(), 1);
    }
}
