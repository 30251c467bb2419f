//! The kernel-cache walk-through of docs/kernelcache.md, run as written: its blocks
//! marked ```` ```sh walkthrough ```` in order in one `bash` (`set -euo pipefail`, from
//! the repository root), each block's output checked against the block after it marked
//! as ```` ```text walkthrough:output ```` (`...` stands for any text). The setup block
//! (```` ```sh walkthrough:setup ````: cargo builds, the local API server, a
//! registry) is not run: this test runs under cargo and gives the same variables instead,
//! its own API server (`KUBECONFIG`), registry (`REGISTRY`) and directory (`WORK`), and on
//! `PATH` the commands as the binaries run them (`e2e-tools` linked as `kubeairunway`,
//! `kernelcache-controller`, `kernelcache-agent`), the fetched cosign CLI and `kubectl`.

use std::fmt::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kubeairunway_e2e::cache_images::start_registry;

/// A fenced block of the walk-through.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Block {
    /// Run by the test.
    Run(String),
    /// Shown to readers, replaced by the test's own setup.
    Setup(String),
    /// What the `Run` block before it prints.
    Output(String),
}

/// The walk-through's blocks in `doc`, in order.
fn blocks(doc: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let kind = match line.trim_end() {
            "```sh walkthrough" => Block::Run,
            "```sh walkthrough:setup" => Block::Setup,
            "```text walkthrough:output" => Block::Output,
            _ => continue,
        };
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| l.trim_end() != "```")
            .collect();
        out.push(kind(body.join("\n") + "\n"));
    }
    out
}

/// Whether `line` is what `expected` shows (`...` stands for any text).
fn shows(expected: &str, line: &str) -> bool {
    let mut parts = expected.split("...");
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// The marker printed before each block's output.
fn marker(n: usize) -> String {
    format!("@@ walkthrough block {n} @@")
}

/// The script the test runs: every `Run` block, each after its marker.
fn script(blocks: &[Block]) -> String {
    let mut script = String::from("set -euo pipefail\n");
    for (n, block) in blocks.iter().enumerate() {
        if let Block::Run(body) = block {
            let _ = write!(script, "echo '{}'\n{body}", marker(n));
        }
    }
    script
}

/// A command on `PATH`, or `None`.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[test]
fn blocks_are_read_in_order_and_outputs_match_with_ellipses() {
    let doc = "x\n```sh walkthrough:setup\nsetup\n```\n```sh walkthrough\na\nb\n```\n```text walkthrough:output\nout ...\n```\n```sh\nnot\n```\n";
    assert_eq!(
        blocks(doc),
        vec![
            Block::Setup("setup\n".into()),
            Block::Run("a\nb\n".into()),
            Block::Output("out ...\n".into()),
        ]
    );
    assert!(shows(
        "pushed .../vadd@sha256:...",
        "pushed 127.0.0.1:5/vadd@sha256:ab"
    ));
    assert!(shows("a...b...c", "abc"));
    assert!(shows("exact", "exact"));
    assert!(!shows("exact", "exact "));
    assert!(!shows(
        "pushed .../vadd@sha256:...",
        "pushed 127.0.0.1:5/other@sha256:ab"
    ));
    assert!(!shows("...x", "y"));
    assert_eq!(
        script(&blocks(doc)),
        format!("set -euo pipefail\necho '{}'\na\nb\n", marker(1))
    );
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[tokio::test]
async fn the_kernelcache_walkthrough_runs_as_written() {
    let doc = std::fs::read_to_string(repository().join("docs/kernelcache.md")).unwrap();
    let blocks = blocks(&doc);
    assert!(
        blocks.iter().filter(|b| matches!(b, Block::Run(_))).count() >= 5,
        "the walk-through blocks of docs/kernelcache.md are missing: {blocks:?}"
    );
    // kubectl: `KUBECTL` (scripts/test.sh installs one), else the one on PATH.
    let kubectl = std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| on_path("kubectl"));
    let needed = (crate::kernelcache_verify::cosign(), kubectl);
    let (cosign, kubectl) = match needed {
        (Ok(cosign), Some(kubectl)) => (cosign, kubectl),
        (cosign, kubectl) => {
            let reason = format!("cosign: {cosign:?}, kubectl: {kubectl:?}");
            assert!(
                std::env::var_os("CI").is_none(),
                "the walk-through needs cosign and kubectl in CI: {reason}"
            );
            println!("skipping the kernel-cache walk-through (outside CI): {reason}");
            return;
        }
    };

    // What the setup block gives: binaries on PATH, an API server, a registry, WORK.
    let work = tempfile::tempdir().unwrap();
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in [
        "kubeairunway",
        "kernelcache-controller",
        "kernelcache-agent",
    ] {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_e2e-tools"), bin.join(name)).unwrap();
    }
    std::os::unix::fs::symlink(&cosign, bin.join("cosign")).unwrap();
    std::os::unix::fs::symlink(&kubectl, bin.join("kubectl")).unwrap();
    let cluster = kubeairunway_e2e::private_cluster("walkthrough")
        .await
        .unwrap();
    let registry = start_registry("walkthrough").unwrap();
    let path = std::env::join_paths(
        std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();

    let (out_file, err_file) = (work.path().join("stdout"), work.path().join("stderr"));
    let mut child = std::process::Command::new("bash")
        .arg("-c")
        .arg(script(&blocks))
        .current_dir(repository())
        .env("PATH", path)
        .env("HOME", work.path())
        .env("WORK", work.path())
        .env("REGISTRY", registry.addr())
        .env("KUBECONFIG", cluster.kubeconfig())
        // The test machine's disk may be fuller than the agent's default floor (5% of the
        // filesystem) allows: a machine setting, like the ones above.
        .env("MIN_FREE", "1Mi")
        .env_remove("PLAIN_HTTP_REGISTRIES")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file).unwrap())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    // A bound so that a hang fails the test with what it printed (the walk-through's own
    // waits time out well before).
    let mut status = None;
    for _ in 0..3000 {
        status = child.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The script's own background jobs (the controller and the agent), whatever happened.
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
    let out = std::fs::read_to_string(&out_file).unwrap();
    let err = std::fs::read_to_string(&err_file).unwrap();
    let mut logs = String::new();
    for f in ["controller.log", "agent.log"] {
        let text = std::fs::read_to_string(work.path().join(f)).unwrap_or_default();
        let _ = write!(logs, "--- {f}\n{text}");
    }
    let context = format!("stdout:\n{out}\nstderr:\n{err}\n{logs}");
    let status = status.unwrap_or_else(|| panic!("the walk-through hung\n{context}"));
    assert!(status.success(), "the walk-through failed\n{context}");

    // Each block printed what the document shows after it.
    let mut checked = 0;
    for (n, pair) in blocks.windows(2).enumerate() {
        let [Block::Run(_), Block::Output(expected)] = pair else {
            continue;
        };
        let printed: Vec<&str> = out
            .split(&format!("{}\n", marker(n)))
            .nth(1)
            .unwrap_or_else(|| panic!("block {n} never ran\n{context}"))
            .lines()
            .take_while(|l| !l.starts_with("@@ walkthrough block "))
            .collect();
        let expected: Vec<&str> = expected.lines().collect();
        assert_eq!(
            printed.len(),
            expected.len(),
            "block {n} printed {printed:#?}, the document shows {expected:#?}\n{context}"
        );
        for (line, shown) in printed.iter().zip(&expected) {
            assert!(
                shows(shown, line),
                "block {n} printed {line:?}, the document shows {shown:?}\n{context}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 3, "too few outputs shown: {checked}");
}
