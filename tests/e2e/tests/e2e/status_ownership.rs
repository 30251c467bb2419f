//! Status ownership by server-side apply: core and a provider each apply
//! their own status fields and condition types to the same ModelDeployment; neither
//! erases the other's, and writing a field the other owns is a conflict.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kubeairunway_e2e::{apply_md, core_cluster};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::conditions::{
    self, PROVIDER_COMPATIBLE, PROVIDER_SELECTED, READY, RESOURCE_CREATED, VALIDATED,
};
use serde_json::json;

const CORE: &str = "kubeairunway-controller";
const PROVIDER: &str = "kaito-provider";

fn condition(type_: &str, status: bool, reason: &str, message: &str) -> Condition {
    conditions::new(
        None,
        type_,
        status,
        reason,
        message,
        Some(1),
        k8s_openapi::jiff::Timestamp::now(),
    )
}

fn status_patch(status: serde_json::Value) -> serde_json::Value {
    let mut patch = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment"});
    patch["status"] = status;
    patch
}

fn types(md: &ModelDeployment) -> Vec<String> {
    let mut t: Vec<String> = md
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().map(|c| c.type_.clone()))
        .collect();
    t.sort();
    t
}

#[tokio::test]
async fn core_and_provider_own_their_own_status_fields() {
    let (cluster, client) = core_cluster().await.unwrap();
    let ns = cluster.namespace("ssa");
    let sample = kubeairunway_config::samples::all()
        .into_iter()
        .find(|s| s.name == "cpu-llamacpp")
        .unwrap();
    apply_md(&client, &ns, "user", &sample.manifest)
        .await
        .unwrap();
    let api: Api<ModelDeployment> = Api::namespaced(client, &ns);
    let name = "gemma-cpu";

    // Core's whole set of fields; `extra` adds a condition it does not own.
    let core_status_with = |message: &str, extra: Option<Condition>| {
        let mut conds = vec![
            condition(
                VALIDATED,
                true,
                "ValidationPassed",
                "Schema validation passed",
            ),
            condition(PROVIDER_SELECTED, true, "AutoSelected", message),
        ];
        conds.extend(extra);
        status_patch(json!({
            "provider": {"name": "kaito", "selectedReason": "matched capabilities: engine=llamacpp, gpu=false, mode=aggregated"},
            "conditions": conds,
        }))
    };
    let core_status = |message: &str| core_status_with(message, None);
    let provider_status = |with_ready: bool| {
        let mut conds = vec![
            condition(
                PROVIDER_COMPATIBLE,
                true,
                "CompatibilityVerified",
                "compatible",
            ),
            condition(
                RESOURCE_CREATED,
                true,
                "ResourceCreated",
                "Workspace created",
            ),
        ];
        if with_ready {
            conds.push(condition(
                READY,
                true,
                "DeploymentReady",
                "All replicas are ready",
            ));
        }
        status_patch(json!({
            "phase": "Running",
            "message": "All replicas healthy",
            "provider": {"resourceName": name, "resourceKind": "Workspace"},
            "endpoint": {"service": name, "port": 80},
            "replicas": {"desired": 1, "ready": 1, "available": 1},
            "observedGeneration": 1,
            "conditions": conds,
        }))
    };

    api.patch_status(
        name,
        &PatchParams::apply(CORE),
        &Patch::Apply(core_status("Provider kaito auto-selected")),
    )
    .await
    .unwrap();
    api.patch_status(
        name,
        &PatchParams::apply(PROVIDER),
        &Patch::Apply(provider_status(true)),
    )
    .await
    .unwrap();
    let md = api.get(name).await.unwrap();
    assert_eq!(
        types(&md),
        [
            PROVIDER_COMPATIBLE,
            PROVIDER_SELECTED,
            READY,
            RESOURCE_CREATED,
            VALIDATED
        ]
    );
    let status = md.status.clone().unwrap();
    let provider = status.provider.unwrap();
    assert_eq!(provider.name.as_deref(), Some("kaito"));
    assert_eq!(provider.resource_kind.as_deref(), Some("Workspace"));
    assert_eq!(status.endpoint.unwrap().port, Some(80));

    // Core applies again (only its own fields): the provider's fields and conditions stay.
    api.patch_status(
        name,
        &PatchParams::apply(CORE),
        &Patch::Apply(core_status("re-applied")),
    )
    .await
    .unwrap();
    let md = api.get(name).await.unwrap();
    assert_eq!(
        types(&md),
        [
            PROVIDER_COMPATIBLE,
            PROVIDER_SELECTED,
            READY,
            RESOURCE_CREATED,
            VALIDATED
        ]
    );
    let status = md.status.clone().unwrap();
    assert_eq!(
        status.phase.map(kubeairunway_sdk::api::Phase::as_str),
        Some("Running")
    );
    assert_eq!(
        status.provider.as_ref().unwrap().resource_name.as_deref(),
        Some(name)
    );
    assert_eq!(
        conditions::find(&status.conditions, PROVIDER_SELECTED)
            .unwrap()
            .message,
        "re-applied"
    );

    // The provider drops a condition it owns: only that one goes.
    api.patch_status(
        name,
        &PatchParams::apply(PROVIDER),
        &Patch::Apply(provider_status(false)),
    )
    .await
    .unwrap();
    let md = api.get(name).await.unwrap();
    assert_eq!(
        types(&md),
        [
            PROVIDER_COMPATIBLE,
            PROVIDER_SELECTED,
            RESOURCE_CREATED,
            VALIDATED
        ]
    );
    assert_eq!(
        md.status.unwrap().provider.unwrap().name.as_deref(),
        Some("kaito")
    );

    // The provider writing core's field is a conflict, and changes nothing.
    let grab = status_patch(json!({"provider": {"name": "dynamo"}}));
    let err = api
        .patch_status(name, &PatchParams::apply(PROVIDER), &Patch::Apply(&grab))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409, "{s:?}");
            assert!(
                s.message.contains(CORE),
                "conflict names the owner: {}",
                s.message
            );
        }
        other => panic!("expected a conflict, got {other}"),
    }
    // So is core writing a condition the provider owns.
    let stolen = condition(
        PROVIDER_COMPATIBLE,
        false,
        "Stolen",
        "core must not write ProviderCompatible",
    );
    let grab = core_status_with("re-applied", Some(stolen));
    let err = api
        .patch_status(name, &PatchParams::apply(CORE), &Patch::Apply(&grab))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.message.contains(PROVIDER)),
        "{err}"
    );
    let status = api.get(name).await.unwrap().status.unwrap();
    assert_eq!(status.provider.unwrap().name.as_deref(), Some("kaito"));
    assert_eq!(
        conditions::find(&status.conditions, PROVIDER_COMPATIBLE)
            .unwrap()
            .reason,
        "CompatibilityVerified"
    );
}
