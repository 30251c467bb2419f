//! Logs of everything `up` runs in one place: every controller's log lines go to one
//! file (level from `RUST_LOG`, default `info`); the terminal shows only errors, one line
//! each, between `up`'s own progress lines.

use std::io::IsTerminal as _;
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Send the process's logs to `file` (appended) and errors to standard error. Returns
/// false when the process already has a logger (the first one stays).
pub fn init(file: &Path) -> anyhow::Result<bool> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .with_context(|| format!("opening the log file {}", file.display()))?;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let to_file = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(Mutex::new(log))
        .with_filter(filter);
    // kube's client logs every failed request as an error, the polls of a server that is
    // starting included: those stay in the file.
    let to_terminal = tracing_subscriber::fmt::layer()
        .compact()
        .without_time()
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::new("error,kube_client=off,kube_runtime=off"));
    Ok(tracing_subscriber::registry()
        .with(to_file)
        .with(to_terminal)
        .try_init()
        .is_ok())
}
