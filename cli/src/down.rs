//! `kubeairunway down`: stop what `up` started with this state directory: a running
//! `up` (SIGTERM: it stops its controllers) and the local API server. On a real cluster
//! nothing is deleted: the ModelDeployments, their upstream objects and the CRDs stay.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::Terminal;
use crate::cluster;
use crate::up::{is_up_process, read_state, state_file};

/// `down`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Stop a running `up` but keep the local API server (and what it holds).
    #[arg(long)]
    pub keep_cluster: bool,
}

/// Run `down`.
pub fn run(args: &Args, state_dir: &Path, term: &mut Terminal) -> anyhow::Result<i32> {
    let mut stopped_something = false;
    if let Some(state) = read_state(state_dir) {
        if state.pid == std::process::id() {
            term.err("`up` runs in this very process; not stopping it\n");
        } else if is_up_process(state.pid) {
            Command::new("kill")
                .arg("-TERM")
                .arg(state.pid.to_string())
                .status()
                .context("sending SIGTERM to `kubeairunway up`")?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while is_up_process(state.pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if is_up_process(state.pid) {
                anyhow::bail!(
                    "`kubeairunway up` (pid {}) did not stop within 30s",
                    state.pid
                );
            }
            term.err(&format!(
                "stopped `kubeairunway up` (pid {}) and its controllers\n",
                state.pid
            ));
            stopped_something = true;
        }
        let _ = std::fs::remove_file(state_file(state_dir));
    }
    let dir = cluster::local_dir(state_dir);
    let running = ["apiserver", "etcd"]
        .iter()
        .any(|n| dir.join(format!("{n}.pid")).is_file());
    if running && !args.keep_cluster {
        kubeairunway_testcluster::stop_detached(&dir)
            .with_context(|| format!("stopping the local API server in {}", dir.display()))?;
        term.err(&format!(
            "stopped the local API server (its files stay in {}; the next `up` starts a new one)\n",
            dir.display()
        ));
        stopped_something = true;
    }
    if !stopped_something {
        term.err(&format!(
            "nothing to stop: no `kubeairunway up` runs and no local API server in {}\n",
            state_dir.display()
        ));
    }
    Ok(0)
}
