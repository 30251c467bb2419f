//! Pull throughput from the loopback stand-in of the hub against huggingface_hub's own
//! downloader (`snapshot_download`, pinned in tests/hfhub-venv.sh) on the same files in
//! the same run, and the peak RSS (`VmHWM`) of this process while pulling one large file.
//! Prints figures; asserts nothing. Sizes: `BENCH_FILES` files of `BENCH_FILE_MB` MiB
//! (default 4 x 128), large files of `BENCH_LARGE_MB` MiB (default 256 and 1024).
//!
//! `cargo bench -p kubeairunway-modelcache-hub --bench pull`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_precision_loss)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kubeairunway_modelcache_hub::testing::{Content, StandIn, StandInFile, commit_id};
use kubeairunway_modelcache_hub::{Hub, HubOptions, PullOptions, RepoId, pull};

const MIB: u64 = 1 << 20;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A `kB` field of `/proc/self/status` (`VmHWM`: peak resident set; `VmRSS`: now), in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resets `VmHWM` to the current RSS (Linux: `5` into `clear_refs`); false if refused.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn judge() -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hfhub-venv.sh");
    let out = Command::new("bash").arg(&script).output().ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

const PY: &str = r"
import sys
from huggingface_hub import snapshot_download
snapshot_download(sys.argv[1], revision='main', cache_dir=sys.argv[2], max_workers=int(sys.argv[3]))
";

async fn ours(url: &str, repo: &str, cache: &Path, parallel: usize) -> f64 {
    let hub = Hub::new(&HubOptions {
        endpoint: url.to_string(),
        ..HubOptions::default()
    })
    .unwrap();
    let options = PullOptions {
        parallel,
        ..PullOptions::default()
    };
    let start = Instant::now();
    pull(&hub, cache, &RepoId::parse(repo).unwrap(), "main", &options)
        .await
        .unwrap();
    start.elapsed().as_secs_f64()
}

fn theirs(py: &Path, url: &str, repo: &str, cache: &Path, parallel: usize) -> f64 {
    let start = Instant::now();
    let out = Command::new(py)
        .args([
            "-c",
            PY,
            repo,
            cache.to_str().unwrap(),
            &parallel.to_string(),
        ])
        .env("HF_ENDPOINT", url)
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    start.elapsed().as_secs_f64()
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let count = env_u64("BENCH_FILES", 4);
    let file_mb = env_u64("BENCH_FILE_MB", 128);
    let larges: Vec<u64> = std::env::var("BENCH_LARGE_MB").ok().map_or_else(
        || vec![256, 1024],
        |v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
    );
    let parallel = 4;
    let stand_in = StandIn::start().await;
    let files: Vec<StandInFile> = (0..count)
        .map(|i| {
            StandInFile::new(
                &format!("model-{i:05}.safetensors"),
                Content::Pattern {
                    len: file_mb * MIB,
                    seed: u8::try_from(i % 256).unwrap_or(0),
                },
                true,
            )
        })
        .chain([StandInFile::regular("config.json", b"{\"bench\": true}\n")])
        .collect();
    let total: u64 = files.iter().map(|f| f.content.len()).sum();
    stand_in.commit("bench/model", "main", &commit_id("bench"), files);
    println!(
        "throughput: {count} LFS files of {file_mb} MiB + config.json ({:.0} MiB), {parallel} at a time, loopback stand-in in this process",
        total as f64 / MIB as f64
    );
    let py = judge();
    if py.is_none() {
        println!("  huggingface_hub not installable here: only our figures");
    }
    let mb = total as f64 / MIB as f64;
    for round in 1..=2 {
        let dir = tempfile::tempdir().unwrap();
        let t = ours(&stand_in.url, "bench/model", dir.path(), parallel).await;
        println!(
            "  round {round}: kubeairunway-modelcache-hub  {t:6.2} s  {:7.1} MiB/s",
            mb / t
        );
        drop(dir);
        if let Some(py) = &py {
            let dir = tempfile::tempdir().unwrap();
            let (py, url, path) = (py.clone(), stand_in.url.clone(), dir.path().to_path_buf());
            let t = tokio::task::spawn_blocking(move || {
                theirs(&py, &url, "bench/model", &path, parallel)
            })
            .await
            .unwrap();
            println!(
                "  round {round}: huggingface_hub 1.29.0       {t:6.2} s  {:7.1} MiB/s (process start included)",
                mb / t
            );
        }
    }

    for large in larges {
        let repo = format!("bench/large-{large}");
        let file = StandInFile::new(
            "model.safetensors",
            Content::Pattern {
                len: large * MIB,
                seed: 42,
            },
            true,
        );
        stand_in.commit(&repo, "main", &commit_id(&repo), vec![file]);
        let dir = tempfile::tempdir().unwrap();
        let reset = reset_peak_rss();
        let before = status_kib("VmRSS");
        let t = ours(&stand_in.url, &repo, dir.path(), parallel).await;
        let peak = status_kib("VmHWM");
        println!(
            "one file of {large} MiB: {t:.2} s ({:.1} MiB/s); RSS before {:.1} MiB, peak during the pull {:.1} MiB{}",
            large as f64 / t,
            before as f64 / 1024.0,
            peak as f64 / 1024.0,
            if reset {
                ""
            } else {
                " (VmHWM could not be reset: peak of the whole run)"
            }
        );
    }
}
