//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas only
//! one reconciles (webhooks and health checks serve on every replica).
//!
//! The algorithm and timing of client-go's `leaderelection` package:
//! - a candidate reads the Lease every `retry_period`; it may take it when nobody holds
//!   it, or when the holder's record (holder, `renewTime`, transitions) has not changed
//!   for `lease_duration` **as observed on this candidate's own clock** (like client-go's
//!   `observedTime`). The `renewTime` written by another replica is never compared with the
//!   local clock, so clock skew between nodes cannot make a live Lease look expired;
//! - every write is conditional on the resourceVersion read (create, or replace with that
//!   version), so two candidates can never both succeed;
//! - the holder renews every `retry_period`; each attempt, and the sequence of attempts,
//!   is bounded by `renew_deadline` (shorter than `lease_duration`) counted from the last
//!   successful renewal: when it passes, even with a request still hanging, the holder
//!   stops leading, before any other candidate can see the Lease as expired.
//!
//! Why not `kube-lease-manager`: it writes the Lease with strategic-merge patches that are
//! not conditional on a resourceVersion, and judges expiry by comparing the holder's
//! `renewTime` with the local clock; this elector keeps client-go's guarantees above.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

/// Lease settings (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long others wait, from their own observation of the last renewal, before
    /// taking the Lease.
    pub lease_duration: Duration,
    /// How long the holder keeps leading without a successful renewal (shorter than
    /// `lease_duration`).
    pub renew_deadline: Duration,
    /// How often the holder renews and the others look.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// Settings with client-go's default timing.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Refuse timings under which two leaders could overlap.
    pub fn validate(&self) -> Result<(), String> {
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "the renew deadline ({:?}) must be shorter than the lease duration ({:?})",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(format!(
                "the retry period ({:?}) must be shorter than the renew deadline ({:?})",
                self.retry_period, self.renew_deadline
            ));
        }
        Ok(())
    }
}

/// What a candidate last saw of the Lease, and when (on its own clock).
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<Timestamp>,
    transitions: i32,
    duration: Duration,
}

/// One candidate.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
    observed: Option<(Observed, Instant)>,
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn observed(spec: &LeaseSpec) -> Observed {
    Observed {
        holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
        renew_time: spec.renew_time.as_ref().map(|t| t.0),
        transitions: spec.lease_transitions.unwrap_or(0),
        duration: Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
        ),
    }
}

impl LeaderElector {
    /// A candidate for the Lease in `settings`.
    pub fn new(client: Client, settings: LeaseSettings) -> Self {
        Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: None,
        }
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.settings.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// Remember what the Lease says now, restarting the local clock when it changed.
    fn observe(&mut self, record: Observed) {
        if self.observed.as_ref().map(|(o, _)| o) != Some(&record) {
            self.observed = Some((record, Instant::now()));
        }
    }

    /// Whether the Lease, as last observed, is held by someone else who may still be
    /// renewing it.
    fn held_by_other(&self) -> bool {
        let Some((record, since)) = &self.observed else {
            return false;
        };
        match &record.holder {
            None => false,
            Some(h) if *h == self.settings.identity => false,
            Some(_) => since.elapsed() < record.duration,
        }
    }

    /// Take or renew the Lease; `Ok(true)` while this candidate holds it.
    pub async fn try_acquire_or_renew(&mut self) -> kube::Result<bool> {
        let me = self.settings.identity.clone();
        let found = self.api.get_opt(&self.settings.name).await?;
        let now = MicroTime(Timestamp::now());
        let Some(lease) = found else {
            let spec = LeaseSpec {
                holder_identity: Some(me),
                lease_duration_seconds: Some(self.duration_secs()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec.clone()),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observe(observed(&spec));
                    Ok(true)
                }
                Err(e) if conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        self.observe(observed(&spec));
        if self.held_by_other() {
            return Ok(false);
        }
        let mine = spec.holder_identity.as_deref() == Some(me.as_str());
        let next_spec = LeaseSpec {
            holder_identity: Some(me),
            lease_duration_seconds: Some(self.duration_secs()),
            acquire_time: if mine {
                spec.acquire_time.clone()
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(!mine)),
            ..spec
        };
        let mut next = lease;
        next.spec = Some(next_spec.clone());
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => {
                self.observe(observed(&next_spec));
                Ok(true)
            }
            Err(e) if conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Give the Lease up if this candidate holds it, so another takes over at once.
    pub async fn release(&self) -> kube::Result<()> {
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Campaign until `shutdown`, publishing whether this candidate leads on `tx`.
    pub async fn run(
        mut self,
        tx: watch::Sender<bool>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut last_renew: Option<Instant> = None;
        loop {
            // Bounded by what is left of the renew deadline while leading, so a hung
            // request cannot keep a stale leader going.
            let budget = match last_renew {
                Some(t) => self.settings.renew_deadline.saturating_sub(t.elapsed()),
                None => self.settings.renew_deadline,
            };
            let attempt = tokio::select! {
                () = &mut shutdown => break,
                r = tokio::time::timeout(budget, self.try_acquire_or_renew()) => r,
            };
            let leading = match attempt {
                Ok(Ok(true)) => {
                    last_renew = Some(Instant::now());
                    true
                }
                Ok(Ok(false)) => {
                    last_renew = None;
                    false
                }
                Ok(Err(e)) => {
                    warn!(error = %e, lease = %self.settings.name, "lease renewal failed");
                    last_renew.is_some_and(|t| t.elapsed() < self.settings.renew_deadline)
                }
                Err(_) => {
                    warn!(lease = %self.settings.name, "lease renewal timed out");
                    last_renew.is_some_and(|t| t.elapsed() < self.settings.renew_deadline)
                }
            };
            if !leading {
                last_renew = None;
            }
            tx.send_if_modified(|l| {
                if *l == leading {
                    return false;
                }
                if leading {
                    info!(identity = %self.settings.identity, lease = %self.settings.name, "became leader");
                } else {
                    info!(identity = %self.settings.identity, lease = %self.settings.name, "stopped leading");
                }
                *l = leading;
                true
            });
            // While leading, never sleep past the renew deadline.
            let pause = match last_renew {
                Some(t) => self
                    .settings
                    .retry_period
                    .min(self.settings.renew_deadline.saturating_sub(t.elapsed())),
                None => self.settings.retry_period,
            };
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(pause) => {}
            }
        }
        tx.send_replace(false);
        if let Err(e) = self.release().await {
            warn!(error = %e, "releasing the lease failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::{Value, json};
    use tower_test::mock;

    type Handle = mock::Handle<Request<Body>, Response<Body>>;

    fn elector(identity: &str) -> (LeaderElector, Handle) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "ns");
        (
            LeaderElector::new(client, LeaseSettings::new("ns", "lease", identity)),
            handle,
        )
    }

    /// The next request: method, path, body, and where to send the answer.
    async fn next(
        handle: &mut Handle,
    ) -> (
        http::Method,
        String,
        Value,
        mock::SendResponse<Response<Body>>,
    ) {
        let (request, send) = handle.next_request().await.expect("a request");
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (method, path, body, send)
    }

    fn reply(send: mock::SendResponse<Response<Body>>, status: u16, body: &Value) {
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(body).unwrap()))
                .unwrap(),
        );
    }

    fn lease(holder: &str, renew_time: &str, rv: &str) -> Value {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "lease", "namespace": "ns", "resourceVersion": rv},
               "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                        "renewTime": renew_time, "leaseTransitions": 3}})
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_taken_only_after_it_stood_still_for_its_duration_on_the_local_clock() {
        // The holder's clock is years behind ours: comparing its renewTime with our
        // clock would call the Lease expired at once.
        let skewed = lease("other", "2001-01-01T00:00:00.000000Z", "7");
        let (mut me, mut api) = elector("me");
        let server = tokio::spawn(async move {
            for _ in 0..2 {
                let (method, _, _, send) = next(&mut api).await;
                assert_eq!(method, http::Method::GET);
                reply(send, 200, &skewed);
            }
            let (method, _, _, send) = next(&mut api).await;
            assert_eq!(method, http::Method::GET);
            reply(send, 200, &skewed);
            let (method, _, body, send) = next(&mut api).await;
            assert_eq!(method, http::Method::PUT, "taken once it stood still 15 s");
            assert_eq!(body["spec"]["holderIdentity"], "me");
            assert_eq!(body["spec"]["leaseTransitions"], 4);
            assert_eq!(body["metadata"]["resourceVersion"], "7");
            reply(send, 200, &body);
        });
        assert!(!me.try_acquire_or_renew().await.unwrap());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(
            !me.try_acquire_or_renew().await.unwrap(),
            "still live at 10 s"
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(me.try_acquire_or_renew().await.unwrap());
        server.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_record_restarts_the_local_clock() {
        let (mut me, mut api) = elector("me");
        let server = tokio::spawn(async move {
            let renewals = ["2030-01-01T00:00:00.000000Z", "2030-01-01T00:00:02.000000Z"];
            for (i, renew) in renewals.iter().enumerate() {
                let (_, _, _, send) = next(&mut api).await;
                reply(send, 200, &lease("other", renew, &i.to_string()));
            }
        });
        assert!(!me.try_acquire_or_renew().await.unwrap());
        tokio::time::advance(Duration::from_secs(14)).await;
        // The holder renewed in between: 14 s of our clock are not 15 s of standstill.
        assert!(!me.try_acquire_or_renew().await.unwrap());
        server.await.unwrap();
        assert!(me.held_by_other());
        tokio::time::advance(Duration::from_secs(14)).await;
        assert!(me.held_by_other(), "14 s since the last change");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!me.held_by_other());
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflict_on_renewal_means_not_leading() {
        let (mut me, mut api) = elector("me");
        let server = tokio::spawn(async move {
            let (_, _, _, send) = next(&mut api).await;
            reply(send, 200, &lease("me", "2030-01-01T00:00:00.000000Z", "1"));
            let (method, _, _, send) = next(&mut api).await;
            assert_eq!(method, http::Method::PUT);
            reply(
                send,
                409,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
            );
        });
        assert!(!me.try_acquire_or_renew().await.unwrap());
        server.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_renewals_hang_steps_down_at_the_renew_deadline() {
        let (me, mut api) = elector("me");
        let (tx, mut leading) = watch::channel(false);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(me.run(tx, async {
            let _ = stop_rx.await;
        }));
        // Created: leading.
        let (method, _, _, send) = next(&mut api).await;
        assert_eq!(method, http::Method::GET);
        reply(
            send,
            404,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "NotFound", "code": 404, "message": "not found"}),
        );
        let (method, _, body, send) = next(&mut api).await;
        assert_eq!(method, http::Method::POST);
        reply(send, 201, &body);
        leading.wait_for(|l| *l).await.unwrap();
        let led_at = Instant::now();
        // Every later request hangs forever.
        let mut hung = Vec::new();
        let lost = async {
            leading.wait_for(|l| !*l).await.unwrap();
        };
        tokio::pin!(lost);
        loop {
            tokio::select! {
                () = &mut lost => break,
                request = api.next_request() => hung.push(request),
            }
        }
        let after = led_at.elapsed();
        assert!(
            after <= Duration::from_secs(10),
            "stepped down {after:?} after the last renewal, past the 10 s deadline"
        );
        assert!(
            after >= Duration::from_secs(9),
            "stepped down too early: {after:?}"
        );
        drop(stop_tx);
        drop(hung);
        drop(api);
        let _ = run.await;
    }
}
