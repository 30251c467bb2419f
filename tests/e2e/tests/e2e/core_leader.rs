//! Leader election on a `coordination.k8s.io/v1` Lease (served by the test API server), and
//! two full controller processes (`app::run`, in-process) of which only the leader
//! reconciles, with their health and metrics endpoints.

use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kubeairunway_core::app::{self, Cli};
use kubeairunway_e2e::{apply_md, core_cluster, eventually};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::leader::{LeaderElector, LeaseSettings};
use serde_json::json;

fn lease(ns: &str, identity: &str, duration_ms: u64) -> LeaseSettings {
    LeaseSettings {
        namespace: ns.into(),
        name: "core-test".into(),
        identity: identity.into(),
        lease_duration: Duration::from_millis(duration_ms),
        renew_interval: Duration::from_millis(200),
    }
}

#[tokio::test]
async fn core_leader_election_on_a_lease() {
    let (cluster, client) = core_cluster().await.unwrap();
    let ns = cluster.namespace("core-lease");
    let a = LeaderElector::new(client.clone(), lease(&ns, "a", 4000));
    let b = LeaderElector::new(client.clone(), lease(&ns, "b", 4000));
    assert!(
        a.try_acquire_or_renew().await.unwrap(),
        "a takes the free lease"
    );
    let l: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let got = l.get("core-test").await.unwrap();
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "b must wait: {got:?}"
    );
    assert!(a.try_acquire_or_renew().await.unwrap(), "a renews");
    a.release().await.unwrap();
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "b takes the released lease"
    );
    assert!(!a.try_acquire_or_renew().await.unwrap());

    // b stops renewing: after the lease duration a takes over.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert!(
        a.try_acquire_or_renew().await.unwrap(),
        "a takes the expired lease"
    );
    let l: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let spec = l.get("core-test").await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(2));
    assert_eq!(spec.lease_duration_seconds, Some(4));
}

fn free_addr() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

async fn get(url: &str) -> Option<(u16, String)> {
    let resp = reqwest::get(url).await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

#[tokio::test]
async fn core_two_replicas_one_leader() {
    let (cluster, client) = core_cluster().await.unwrap();
    crate::core_selection::register_providers(&client).await;
    let ns = cluster.namespace("core-replicas");

    let mut replicas = Vec::new();
    for name in ["replica-a", "replica-b"] {
        let metrics = free_addr();
        let cli = Cli::try_parse_from([
            "kubeairunway-controller",
            "--enable-webhooks=false",
            "--provider-heartbeat-max-age=1h",
            &format!("--watch-namespace={ns}"),
            &format!("--namespace={ns}"),
            &format!("--pod-name={name}"),
            &format!("--metrics-bind-address={metrics}"),
            // Long enough that a loaded machine never loses a renewal; the leader releases
            // the Lease when stopped, so the takeover below does not wait for it.
            "--leader-election-lease-duration=15s",
            "--leader-election-renew-interval=1s",
        ])
        .unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let c = cluster.client().await.unwrap();
        tokio::spawn(async move {
            app::run(cli, c, async {
                let _ = stop_rx.await;
            })
            .await
            .unwrap();
        });
        replicas.push((name, metrics, stop_tx));
    }

    // Both serve health; both become ready.
    for (_, metrics, _) in &replicas {
        let ready = format!("http://{metrics}/readyz");
        eventually(20, "readyz", || async {
            get(&ready).await.filter(|(s, _)| *s == 200)
        })
        .await
        .unwrap();
        assert_eq!(
            get(&format!("http://{metrics}/healthz")).await.unwrap().0,
            200
        );
    }

    let md = |name: &str| {
        json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": name},
            "spec": {"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}})
    };
    apply_md(&client, &ns, "user", &md("first")).await.unwrap();
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    eventually(20, "selection by the leader", || async {
        api.get("first")
            .await
            .ok()
            .filter(|m| m.selected_provider() == Some("kaito"))
    })
    .await
    .unwrap();

    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder = leases
        .get("kubeairunway-controller")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    // Only the leader reconciled: only its metrics have reconciliations.
    for (name, metrics, _) in &replicas {
        let (_, text) = get(&format!("http://{metrics}/metrics")).await.unwrap();
        let reconciled = text.contains("kubeairunway_reconciliation_duration_seconds_count{");
        assert_eq!(
            reconciled,
            *name == holder,
            "{name} (leader {holder}):\n{text}"
        );
        if *name == holder {
            assert!(
                text.contains(&format!(
                    "kubeairunway_modeldeployment_total{{namespace=\"{ns}\",phase=\"Unknown\"}} 1"
                )),
                "{text}"
            );
            assert!(
                text.contains(
                    "kubeairunway_provider_selection{provider=\"kaito\",reason=\"auto\"} 1"
                ),
                "{text}"
            );
        }
    }

    // Stop the leader: the other replica takes over and reconciles new objects.
    let idx = replicas.iter().position(|(n, _, _)| *n == holder).unwrap();
    let (_, _, stop) = replicas.remove(idx);
    let _ = stop.send(());
    let other = replicas[0].0;
    eventually(20, "the other replica to lead", || async {
        leases
            .get("kubeairunway-controller")
            .await
            .ok()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| h == other)
    })
    .await
    .unwrap();
    apply_md(&client, &ns, "user", &md("second")).await.unwrap();
    eventually(20, "selection by the new leader", || async {
        api.get("second")
            .await
            .ok()
            .filter(|m| m.selected_provider() == Some("kaito"))
    })
    .await
    .unwrap();
}
