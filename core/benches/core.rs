//! Benchmarks (not tests; nothing here is asserted): provider selection per
//! ModelDeployment with five providers and 20 rules, and admission webhook throughput and
//! latency over HTTPS on loopback against a bare TLS echo server measured in the same run.
//! Run with `cargo bench -p kubeairunway-core`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kubeairunway_core::selection::{self, RuleCache, Settings};
use kubeairunway_core::webhook::{self, Foresight, MUTATE_PATH, VALIDATE_PATH, WebhookState};
use kubeairunway_sdk::tls::{CertManager, CertResolver, CertSettings, MemoryCertStore};
use kubeairunway_sdk::{
    InferenceProviderConfig, InferenceProviderConfigSpec, InferenceProviderConfigStatus,
    ModelDeployment,
};
use serde_json::json;

fn providers() -> anyhow::Result<Vec<Arc<InferenceProviderConfig>>> {
    let mut specs = vec![
        (
            "kaito",
            json!({"capabilities": {"engines": ["vllm", "llamacpp"], "servingModes": ["aggregated"], "cpuSupport": true, "gpuSupport": true},
            "selectionRules": [
                {"condition": "!has(spec.resources) || !has(spec.resources.gpu) || spec.resources.gpu.count == 0", "priority": 100},
                {"condition": "spec.engine.type == 'llamacpp'", "priority": 100}]}),
        ),
        (
            "dynamo",
            json!({"capabilities": {"engines": ["vllm", "sglang", "trtllm"], "servingModes": ["aggregated", "disaggregated"], "gpuSupport": true},
            "selectionRules": [
                {"condition": "spec.engine.type == 'trtllm'", "priority": 100},
                {"condition": "spec.engine.type == 'sglang'", "priority": 100},
                {"condition": "spec.serving.mode == 'disaggregated'", "priority": 90},
                {"condition": "has(spec.resources) && has(spec.resources.gpu) && spec.resources.gpu.count > 0 && spec.engine.type == 'vllm'", "priority": 50}]}),
        ),
        (
            "kuberay",
            json!({"capabilities": {"engines": ["vllm"], "servingModes": ["aggregated", "disaggregated"], "gpuSupport": true}}),
        ),
    ];
    let team_rules = |team: &str| {
        json!([
            {"condition": format!("has(metadata.labels.team) && metadata.labels.team == '{team}'"), "priority": 120},
            {"condition": "metadata.namespace.startsWith('prod-')", "priority": 60},
            {"condition": "spec.scaling.replicas > 2", "priority": 40},
            {"condition": "has(spec.resources) && has(spec.resources.gpu) && spec.resources.gpu.count * 2 >= 4", "priority": 30},
            {"condition": "spec.model.id.contains('Llama')", "priority": 20},
            {"condition": "size(metadata.annotations) > 3", "priority": 10},
            {"condition": "spec.engine.trustRemoteCode", "priority": 5},
        ])
    };
    specs.push(("third-a", json!({"capabilities": {"engines": ["vllm", "sglang"], "servingModes": ["aggregated"], "gpuSupport": true}, "selectionRules": team_rules("a")})));
    specs.push(("third-b", json!({"capabilities": {"engines": ["vllm"], "servingModes": ["aggregated"], "cpuSupport": true, "gpuSupport": true}, "selectionRules": team_rules("b")})));
    let mut out = Vec::new();
    for (name, spec) in specs {
        let spec: InferenceProviderConfigSpec = serde_json::from_value(spec)?;
        let mut c = InferenceProviderConfig::new(name, spec);
        c.metadata.generation = Some(1);
        c.metadata.uid = Some(name.into());
        c.status = Some(InferenceProviderConfigStatus {
            ready: Some(true),
            last_heartbeat: Some(Time(Timestamp::now())),
            ..Default::default()
        });
        out.push(Arc::new(c));
    }
    Ok(out)
}

fn deployments() -> anyhow::Result<Vec<ModelDeployment>> {
    let specs = [
        json!({"model": {"id": "meta-llama/Llama-3.1-8B"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 2}}}),
        json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
        json!({"model": {"id": "a/b"}, "engine": {"type": "sglang"}, "resources": {"gpu": {"count": 1}}, "scaling": {"replicas": 4}}),
        json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
               "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 2}}}}),
    ];
    let mut out = Vec::new();
    for (i, spec) in specs.iter().cycle().take(400).enumerate() {
        let mut md = ModelDeployment::new(&format!("m{i}"), serde_json::from_value(spec.clone())?);
        md.metadata.namespace = Some(if i % 3 == 0 { "prod-x" } else { "dev" }.into());
        md.metadata.labels = Some(
            [(
                "team".to_string(),
                if i % 2 == 0 { "a" } else { "b" }.to_string(),
            )]
            .into(),
        );
        out.push(md);
    }
    Ok(out)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(idx).copied().unwrap_or_default()
}

fn bench_selection() -> anyhow::Result<()> {
    let configs = providers()?;
    let rules: usize = configs.iter().map(|c| c.spec.selection_rules.len()).sum();
    let mds = deployments()?;
    let cache = RuleCache::default();
    let settings = Settings::default();
    // Warm up (compiles every rule once).
    for md in &mds {
        let _ = selection::select(md, &configs, &cache, &settings, Timestamp::now());
    }
    let mut times = Vec::new();
    let start = Instant::now();
    // SELECTION_ROUNDS: more rounds for a profiler to sample.
    let rounds: usize = std::env::var("SELECTION_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(10);
    for _ in 0..rounds {
        for md in &mds {
            let t = Instant::now();
            let s = selection::select(md, &configs, &cache, &settings, Timestamp::now());
            times.push(t.elapsed());
            std::hint::black_box(s);
        }
    }
    let total = start.elapsed();
    times.sort();
    #[allow(clippy::cast_precision_loss)]
    let mean = total.as_secs_f64() * 1e6 / times.len() as f64;
    println!(
        "selection: {} providers, {rules} rules: mean {mean:.1} µs, p50 {:?}, p99 {:?} per ModelDeployment ({} selections)",
        configs.len(),
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.len()
    );
    Ok(())
}

/// The webhook, and beside it in the same run the baseline: a bare TLS echo server (the
/// same framework, TLS configuration, certificate, payload and concurrency) that returns
/// the request body. The ratio is the webhook's own cost.
async fn bench_webhook() -> anyhow::Result<()> {
    let certs = MemoryCertStore::default();
    let resolver = Arc::new(CertResolver::default());
    CertManager::new(
        certs.clone(),
        CertSettings {
            service_name: "kubeairunway-webhook".into(),
            namespace: "bench".into(),
            ca_validity: Duration::from_secs(86400),
            cert_validity: Duration::from_secs(3600),
            rotate_before: Duration::from_secs(60),
        },
        Arc::clone(&resolver),
    )
    .ensure()
    .await?;
    let host = "kubeairunway-webhook.bench.svc";
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "kubeairunway.ai", "version": "v1alpha1", "kind": "ModelDeployment"},
            "resource": {"group": "kubeairunway.ai", "version": "v1alpha1", "resource": "modeldeployments"},
            "name": "m", "namespace": "default", "operation": "CREATE", "userInfo": {},
            "object": {"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "m", "namespace": "default"},
                "spec": {"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}}}
    }))?;
    let echo = axum::Router::new().route(
        VALIDATE_PATH,
        axum::routing::post(|body: axum::body::Bytes| async move {
            ([("content-type", "application/json")], body)
        }),
    );
    // The mutating webhook on creation: the validation, the defaults and the finalizer of
    // the provider core will select among the benchmark's providers.
    let providers =
        kubeairunway_sdk::reflect::Cache::fixed(providers()?.into_iter().map(|p| (*p).clone()), ());
    let mutating =
        WebhookState::new(Some(providers)).foreseeing(Foresight::new(true, Settings::default()));
    let apps = [
        ("TLS echo (baseline)", echo, VALIDATE_PATH),
        (
            "webhook (validate)",
            webhook::router(WebhookState::new(None)),
            VALIDATE_PATH,
        ),
        (
            "webhook (mutate a creation)",
            webhook::router(mutating),
            MUTATE_PATH,
        ),
    ];
    let mut p99s = Vec::new();
    for (name, app, path) in apps {
        let addr = serve(app, Arc::clone(&resolver))?;
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .resolve(host, addr);
        for ca in certs.published() {
            for cert in reqwest::Certificate::from_pem_bundle(ca.as_bytes())? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let url = format!("https://{host}:{}{path}", addr.port());
        let client = builder.build()?;
        // A first pass warms connections and handshakes up; the second is measured.
        drive(
            &format!("{name} (warm-up)"),
            client.clone(),
            url.clone(),
            body.clone(),
        )
        .await?;
        p99s.push(drive(name, client, url, body.clone()).await?);
    }
    println!(
        "webhook p99 / TLS echo p99: validate {:.2}x, mutate a creation {:.2}x",
        p99s[1].as_secs_f64() / p99s[0].as_secs_f64(),
        p99s[2].as_secs_f64() / p99s[0].as_secs_f64()
    );
    Ok(())
}

/// Serve `app` over HTTPS on a loopback port.
fn serve(app: axum::Router, resolver: Arc<CertResolver>) -> anyhow::Result<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let tls = kubeairunway_sdk::tls::server_config(resolver)?;
    let server = axum_server::from_tcp_rustls(
        listener,
        axum_server::tls_rustls::RustlsConfig::from_config(tls),
    )?;
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    Ok(addr)
}

/// POST `body` to `url` from 16 concurrent clients, 500 times each; print the figures and
/// return the p99 latency.
async fn drive(
    name: &str,
    client: reqwest::Client,
    url: String,
    body: Vec<u8>,
) -> anyhow::Result<Duration> {
    let concurrency = 16;
    let per_task = 500;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let t = Instant::now();
                let response = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                // Read whole, as the API server reads an answer: a response dropped
                // unread resets its stream, and an HTTP/2 server ends a connection that
                // sees too many resets.
                let ok = match response {
                    Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                    _ => false,
                };
                if ok {
                    lat.push(t.elapsed());
                }
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await?);
    }
    let elapsed = start.elapsed();
    lat.sort();
    #[allow(clippy::cast_precision_loss)]
    let rps = lat.len() as f64 / elapsed.as_secs_f64();
    let p99 = percentile(&lat, 0.99);
    println!(
        "{name}, HTTPS loopback, {concurrency} concurrent clients: {} ok of {} requests, {rps:.0} req/s, p50 {:?}, p99 {p99:?}",
        lat.len(),
        concurrency * per_task,
        percentile(&lat, 0.5),
    );
    Ok(p99)
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // `cargo bench -p kubeairunway-core -- selection` (or `webhook`) runs one part.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let runs = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    if runs("selection") {
        bench_selection()?;
    }
    if !runs("webhook") {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench_webhook())
}
