//! Routing a Service to a loopback address: the test plays the EndpointSlice controller,
//! so that the API server's service resolver (Service port -> EndpointSlice, as
//! kube-apiserver does with `--enable-aggregator-routing`) reaches a webhook served by the
//! test on `127.0.0.1`.

use anyhow::Context;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Field manager of the slices written here.
pub const ENDPOINTSLICE_MANAGER: &str = "testcluster-endpointslice-controller";

/// Default name of the port of a Service this creates.
pub const DEFAULT_PORT_NAME: &str = "https";

/// See [`crate::TestCluster::route_service`].
pub async fn route_service(
    client: &Client,
    namespace: &str,
    name: &str,
    port: u16,
    target: u16,
) -> anyhow::Result<()> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let existing = services
        .get_opt(name)
        .await
        .with_context(|| format!("reading Service {namespace}/{name}"))?;
    let port_name = if let Some(svc) = existing {
        svc.spec
            .and_then(|s| s.ports)
            .unwrap_or_default()
            .into_iter()
            .find(|p| p.port == i32::from(port))
            .with_context(|| format!("Service {namespace}/{name} has no port {port}"))?
            .name
            .unwrap_or_default()
    } else {
        let svc = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"type": "ClusterIP", "ports": [{
                "name": DEFAULT_PORT_NAME, "port": port, "targetPort": DEFAULT_PORT_NAME, "protocol": "TCP",
            }]},
        });
        services
            .patch(
                name,
                &PatchParams::apply(ENDPOINTSLICE_MANAGER),
                &Patch::Apply(&svc),
            )
            .await
            .with_context(|| format!("creating Service {namespace}/{name}"))?;
        DEFAULT_PORT_NAME.to_string()
    };
    let slice_name = format!("{name}-loopback");
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name, "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": ENDPOINTSLICE_MANAGER,
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
        "ports": [{"name": port_name, "port": target, "protocol": "TCP"}],
    });
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    slices
        .patch(
            &slice_name,
            &PatchParams::apply(ENDPOINTSLICE_MANAGER).force(),
            &Patch::Apply(&slice),
        )
        .await
        .with_context(|| format!("writing EndpointSlice {namespace}/{slice_name}"))?;
    Ok(())
}
