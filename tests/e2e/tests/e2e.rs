//! End-to-end tests against a real Kubernetes API server (one per test process, started
//! on first use; tests keep apart by namespace). See `kubeairunway-testcluster`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: failing loudly is the point

#[path = "e2e/builtin_api.rs"]
mod builtin_api;
#[path = "e2e/builtin_api_kinds.rs"]
mod builtin_api_kinds;
#[path = "e2e/builtin_api_policy.rs"]
mod builtin_api_policy;
#[path = "e2e/builtin_api_rbac.rs"]
mod builtin_api_rbac;
#[path = "e2e/charts.rs"]
mod charts;
#[path = "e2e/charts_rbac.rs"]
mod charts_rbac;
/// The example third-party provider of the SDK, driven by `sdk_runtime`.
#[path = "../../../sdk/examples/chatserver/provider.rs"]
mod chatserver;
#[path = "e2e/cli.rs"]
mod cli;
#[path = "e2e/cli_cache.rs"]
mod cli_cache;
#[path = "e2e/core_chart.rs"]
mod core_chart;
#[path = "e2e/core_engine.rs"]
mod core_engine;
#[path = "e2e/core_leader.rs"]
mod core_leader;
#[path = "e2e/core_selection.rs"]
mod core_selection;
#[path = "e2e/core_webhook.rs"]
mod core_webhook;
#[path = "e2e/crds.rs"]
mod crds;
#[path = "e2e/dashboard.rs"]
mod dashboard;
#[path = "e2e/dashboard_in_cluster.rs"]
mod dashboard_in_cluster;
#[path = "e2e/dynamo.rs"]
mod dynamo;
#[path = "e2e/dynamo_operator.rs"]
mod dynamo_operator;
#[path = "e2e/faults.rs"]
mod faults;
#[path = "e2e/gateway.rs"]
mod gateway;
#[path = "e2e/image.rs"]
mod image;
#[path = "e2e/kaito.rs"]
mod kaito;
#[path = "e2e/kernelcache.rs"]
mod kernelcache;
#[path = "e2e/kernelcache_agent.rs"]
mod kernelcache_agent;
#[path = "e2e/kernelcache_controller.rs"]
mod kernelcache_controller;
#[path = "e2e/kernelcache_mcv.rs"]
mod kernelcache_mcv;
#[path = "e2e/kernelcache_verify.rs"]
mod kernelcache_verify;
#[path = "e2e/kernelcache_walkthrough.rs"]
mod kernelcache_walkthrough;
#[path = "e2e/kernelcache_webhook.rs"]
mod kernelcache_webhook;
#[path = "e2e/kuberay.rs"]
mod kuberay;
#[path = "e2e/kuberay_operator.rs"]
mod kuberay_operator;
#[path = "e2e/modelcache.rs"]
mod modelcache;
#[path = "e2e/modelcache_mount.rs"]
mod modelcache_mount;
#[path = "e2e/modelcache_oci.rs"]
mod modelcache_oci;
#[path = "e2e/modelcache_slots.rs"]
mod modelcache_slots;
#[path = "e2e/providers_rbac.rs"]
mod providers_rbac;
#[path = "e2e/reference_compat.rs"]
mod reference_compat;
#[path = "e2e/samples.rs"]
mod samples;
#[path = "e2e/sdk_builtin.rs"]
mod sdk_builtin;
#[path = "e2e/sdk_mock.rs"]
mod sdk_mock;
#[path = "e2e/sdk_runtime.rs"]
mod sdk_runtime;
#[path = "e2e/status_ownership.rs"]
mod status_ownership;
#[path = "e2e/upstream_crds.rs"]
mod upstream_crds;
#[path = "e2e/warmup.rs"]
mod warmup;
#[path = "e2e/webhook_client_auth.rs"]
mod webhook_client_auth;
