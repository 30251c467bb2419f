//! Staging throughput: `Puller::stage` (pull from a real loopback registry, digest
//! verification while streaming, safe extraction, manifest check, Triton rewrite) against
//! `tar -xzf` of the same layer from disk, and the safe extraction alone from disk.
//!
//! A benchmark that prints figures, not a test: `cargo bench -p
//! kubeairunway-kernelcache-artifact --bench stage` (needs the loopback registry binary the e2e harness fetches into
//! `~/.cache/kubeairunway/`). `STAGE_BENCH_MB` sets the layer's content size (default 64),
//! `STAGE_BENCH_RUNS` the number of rounds (default 3). Each round runs the three in turn
//! and the ratio is taken per round, against that round's `tar -xzf`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_precision_loss)] // a benchmark: failing loudly is the point

use std::io::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use flate2::Compression;
use flate2::write::GzEncoder;
use kubeairunway_kernelcache_artifact::extract::{self, Limits};
use kubeairunway_kernelcache_artifact::oci::{Puller, pin};
use kubeairunway_testcluster::registry::Registry;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{IMAGE_CONFIG_MEDIA_TYPE, IMAGE_LAYER_GZIP_MEDIA_TYPE};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::json;

/// Deterministic bytes, about half compressible like real kernel binaries: runs of
/// pseudo-random bytes and of repeated instruction-like words.
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x.is_multiple_of(2) {
            out.extend_from_slice(&x.to_le_bytes());
        } else {
            out.extend_from_slice(&[0x4c, 0x8b, 0x05, 0x00, 0x00, 0x00, 0x90, 0x90]);
        }
    }
    out.truncate(len);
    out
}

struct Layer {
    tar: tar::Builder<GzEncoder<Vec<u8>>>,
    bytes: u64,
    files: u64,
}

impl Layer {
    fn append(&mut self, path: &str, data: &[u8]) {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        self.tar.append_data(&mut header, path, data).unwrap();
        self.bytes += data.len() as u64;
        self.files += 1;
    }
}

/// A Triton cache layer of `total` content bytes: per kernel a hash directory with a
/// binary, its metadata and a group file, plus the manifest. Returns the gzip tar, its
/// content bytes and its file count.
fn layer(total: u64) -> (Vec<u8>, u64, u64) {
    let mut l = Layer {
        tar: tar::Builder::new(GzEncoder::new(Vec::new(), Compression::default())),
        bytes: 0,
        files: 0,
    };
    let mut kernel = 0u64;
    while l.bytes < total {
        kernel += 1;
        let hash = format!("{kernel:052X}");
        let size = 4096 + usize::try_from(kernel * 7919 % 61_440).unwrap();
        let meta = json!({"name": format!("kernel_{kernel}"), "target": {"backend": "cuda", "arch": 90, "warp_size": 32}, "num_warps": 4});
        let group = json!({"child_paths": {
            format!("kernel_{kernel}.cubin"): format!("/workspace/.triton/cache/{hash}/kernel_{kernel}.cubin"),
            format!("kernel_{kernel}.json"): format!("/workspace/.triton/cache/{hash}/kernel_{kernel}.json"),
        }});
        l.append(
            &format!("io.triton.cache/{hash}/kernel_{kernel}.cubin"),
            &content(kernel, size),
        );
        l.append(
            &format!("io.triton.cache/{hash}/kernel_{kernel}.json"),
            &serde_json::to_vec(&meta).unwrap(),
        );
        l.append(
            &format!("io.triton.cache/{hash}/__grp__kernel_{kernel}.json"),
            &serde_json::to_vec(&group).unwrap(),
        );
    }
    let manifest =
        json!({"triton": [{"hash": "all", "backend": "cuda", "arch": "90", "warp_size": 32}]});
    l.append(
        "io.triton.manifest/manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    let gz = l.tar.into_inner().unwrap().finish().unwrap();
    (gz, l.bytes, l.files)
}

async fn push(registry: &Registry, gz: &[u8], content_bytes: u64) -> String {
    let reference: Reference = format!("{}/bench/triton:v1", registry.addr())
        .parse()
        .unwrap();
    let labels = json!({
        "cache.triton.image/entry-count": "1",
        "cache.triton.image/cache-size-bytes": content_bytes.to_string(),
        "cache.triton.image/summary": json!({"targets": [{"backend": "cuda", "arch": "90", "warp_size": 32}]}).to_string(),
    });
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux", "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))
    .unwrap();
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..ClientConfig::default()
    });
    client
        .push(
            &reference,
            &[ImageLayer::new(
                gz.to_vec(),
                IMAGE_LAYER_GZIP_MEDIA_TYPE.to_string(),
                None,
            )],
            Config::new(config, IMAGE_CONFIG_MEDIA_TYPE.to_string(), None),
            &RegistryAuth::Anonymous,
            None,
        )
        .await
        .unwrap();
    let puller = Puller::new(RegistryAuth::Anonymous, vec![registry.addr().to_string()]);
    let digest = puller.resolve(&reference.to_string()).await.unwrap();
    pin(&reference.to_string(), &digest).unwrap()
}

fn best(times: &[Duration]) -> Duration {
    times.iter().copied().min().unwrap_or_default()
}

fn report(what: &str, times: &[Duration], bytes: u64, files: u64) {
    let t = best(times).as_secs_f64();
    let (mb, f) = (bytes as f64 / 1e6, files as f64);
    println!(
        "{what:<44} best of {}: {t:>7.3} s  {:>8.1} MB/s  {:>9.0} files/s",
        times.len(),
        mb / t,
        f / t
    );
}

#[tokio::main]
async fn main() {
    kubeairunway_sdk::process::install_crypto_provider();
    let mb: u64 = std::env::var("STAGE_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let runs: usize = std::env::var("STAGE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3);
    let (gz, bytes, files) = layer(mb << 20);
    println!(
        "layer: {files} files, {:.1} MB content, {:.1} MB gzip",
        bytes as f64 / 1e6,
        gz.len() as f64 / 1e6
    );

    let work = tempfile::tempdir().unwrap();
    let registry = Registry::start(
        &kubeairunway_testcluster::cache_dir()
            .join("runs")
            .join(format!("{}-bench-registry", std::process::id())),
    )
    .unwrap();
    let pinned = push(&registry, &gz, bytes).await;
    let puller = Puller::new(RegistryAuth::Anonymous, vec![registry.addr().to_string()]);

    let file = work.path().join("layer.tar.gz");
    std::fs::File::create(&file)
        .unwrap()
        .write_all(&gz)
        .unwrap();
    // Rounds of the three, interleaved: on a shared machine the load drifts, and each
    // round's `tar -xzf` is the fair denominator of its staging.
    let (mut stage, mut tar_xzf, mut safe) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let root = work.path().join(format!("stage-{run}"));
        let started = Instant::now();
        let staged = puller
            .stage(
                &pinned,
                &root,
                "bench",
                "triton",
                Some("/var/cache/kubeairunway/kernels/triton"),
                Limits::default(),
            )
            .await
            .unwrap();
        stage.push(started.elapsed());
        assert_eq!(staged.extracted.bytes, bytes);

        let dir = work.path().join(format!("tar-{run}"));
        std::fs::create_dir_all(&dir).unwrap();
        let started = Instant::now();
        let status = Command::new("tar")
            .arg("-xzf")
            .arg(&file)
            .arg("-C")
            .arg(&dir)
            .status()
            .unwrap();
        tar_xzf.push(started.elapsed());
        assert!(status.success());

        let root = work.path().join(format!("extract-{run}"));
        let started = Instant::now();
        let reader = std::io::BufReader::new(std::fs::File::open(&file).unwrap());
        extract::extract(reader, &root, &root.join("c"), Limits::default()).unwrap();
        safe.push(started.elapsed());
    }
    report(
        "Puller::stage (pull+verify+safe extract)",
        &stage,
        bytes,
        files,
    );
    report(
        "extract::extract from disk (safe, atomic)",
        &safe,
        bytes,
        files,
    );
    report("tar -xzf from disk", &tar_xzf, bytes, files);
    let mut ratios: Vec<f64> = stage
        .iter()
        .zip(&tar_xzf)
        .map(|(s, t)| s.as_secs_f64() / t.as_secs_f64())
        .collect();
    ratios.sort_by(f64::total_cmp);
    println!(
        "best stage / best tar -xzf: {:.2}x the time",
        best(&stage).as_secs_f64() / best(&tar_xzf).as_secs_f64()
    );
    println!(
        "stage / tar -xzf of the same round: best {:.2}x, median {:.2}x ({})",
        ratios[0],
        ratios[ratios.len() / 2],
        ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
}
