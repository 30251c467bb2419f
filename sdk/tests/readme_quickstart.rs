//! The README's quick start builds and passes its test as a third party's crate would:
//! the README's `Cargo.toml`, `src/lib.rs`, `src/main.rs` and `tests/provider.rs`, taken
//! from the README itself, as a crate outside this workspace that reaches the SDK by a
//! path dependency, so only the published API (and the `testing` feature, for its test) is
//! in reach.
//!
//! To cost little on warm caches it shares this workspace's target directory, its
//! `Cargo.lock` (copied, so every dependency resolves to the same version and reuses the
//! same artifacts), its build profiles and `.cargo/config.toml` (cargo runs from the
//! workspace root), and never reaches the network (`--offline`). The crate lives at `<target>/tmp/readme-quickstart` (its own `[workspace]`),
//! so its own fingerprints survive from one run to the next.
//!
//! What that leaves: the first run in a target directory builds about 110 dependency
//! units the workspace's own builds do not make, since a crate that depends on the SDK
//! alone resolves other features than the whole workspace (tokio without `test-util`,
//! serde_json without `float_roundtrip`, and everything above them); later runs check
//! only this crate, and the SDK when it changed. Forcing the workspace's features onto
//! it would make it cheaper and prove less: they are a third party's features.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failing loudly is the point

use std::path::{Path, PathBuf};
use std::process::Command;

const README: &str = include_str!("../README.md");

/// The body of the first fenced block whose info string starts with `lang` and whose
/// text contains `needle`.
fn fenced(markdown: &str, lang: &str, needle: &str) -> Option<String> {
    let mut lines = markdown.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .collect();
        let body = body.join("\n") + "\n";
        if info.starts_with(lang) && body.contains(needle) {
            return Some(body);
        }
    }
    None
}

/// The workspace root (the SDK's parent directory).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The target directory this test was built in: the parent of `CARGO_TARGET_TMPDIR`
/// (`<target>/tmp`, which cargo gives integration tests for their files).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The workspace manifest's `[profile.*]` sections, verbatim: the profile is part of
/// every artifact's identity, so the same settings reuse the same artifacts.
fn profiles(manifest: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            inside = line.starts_with("[profile.");
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The README's dependencies with the SDK reached by path instead of the registry (its
/// other keys, `features`, kept).
fn dependencies(toml: &str, sdk: &Path) -> String {
    let path = format!("path = {:?}", sdk.display().to_string());
    toml.lines()
        .map(|line| {
            if !line.trim_start().starts_with("kubeairunway-sdk") {
                return line.to_string();
            }
            match line.split_once("version = \"0.1\"") {
                Some((before, after)) => format!("{before}{path}{after}"),
                None => format!("kubeairunway-sdk = {{ {path} }}"),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The README's crate (`Cargo.toml`, `src/lib.rs`, `src/main.rs`, `tests/provider.rs`)
/// written to `<target>/tmp/readme-quickstart`, outside the workspace; its directory.
fn write_crate() -> PathBuf {
    let toml = fenced(README, "toml", "[dependencies]").expect("the README's Cargo.toml");
    assert!(
        toml.contains("kubeairunway-sdk") && toml.contains("[dev-dependencies]"),
        "the quick start depends on the SDK, and on its testing feature to test:\n{toml}"
    );
    let lib = fenced(README, "rust", "impl Provider for").expect("the README's provider");
    let main = fenced(README, "rust", "fn main()").expect("the README's binary");
    let test = fenced(README, "rust", "#[tokio::test]").expect("the README's test");
    let root = workspace();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-quickstart");
    for sub in ["src", "tests"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let manifest = format!(
        "[package]\nname = \"my-provider\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
         publish = false\n\n# Not a member of the SDK's workspace.\n[workspace]\n\n{}\n{}",
        dependencies(&toml, Path::new(env!("CARGO_MANIFEST_DIR"))),
        profiles(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()),
    );
    write_if_changed(&dir.join("Cargo.toml"), &manifest);
    write_if_changed(&dir.join("src/lib.rs"), &lib);
    write_if_changed(&dir.join("src/main.rs"), &main);
    write_if_changed(&dir.join("tests/provider.rs"), &test);
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    dir
}

/// Cargo `args` on the README's crate, from the workspace root (its .cargo/config.toml
/// applies, as to every build here) into this workspace's target directory.
fn cargo(dir: &Path, args: &[&str]) -> std::process::Output {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    // Without the variables cargo sets for this test process (CARGO_PKG_NAME, ...): build
    // scripts that read them (ring's does, with rerun-if-env-changed) would otherwise be
    // run again here, and again by the next workspace build, which shares their output.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&key.as_ref())
        {
            command.env_remove(key.as_ref());
        }
    }
    command
        .current_dir(workspace())
        .args(args)
        .args(["--offline", "--message-format=short"])
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir())
        .output()
        .unwrap()
}

/// The README's crate builds outside the workspace, and its test passes: its provider
/// (a StatefulSet and a headless Service) reaches `Running` on the SDK's test API server,
/// and writes nothing more once converged.
#[test]
fn the_readme_provider_builds_and_passes_its_test_outside_the_workspace() {
    let dir = write_crate();
    let output = cargo(&dir, &["test", "--quiet"]);
    assert!(
        output.status.success(),
        "the README's provider crate ({}) does not build or its test fails:\n{}\n{}",
        dir.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("test a_model_deployment_runs_on_a_statefulset_and_converges ... ok")
            || stdout.contains("1 passed"),
        "the README's test ran:\n{stdout}"
    );
}

/// Write `content` unless the file holds it already (its mtime is cargo's fingerprint).
fn write_if_changed(path: &Path, content: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(content) {
        std::fs::write(path, content).unwrap();
    }
}

#[test]
fn fenced_blocks_are_found_by_language_and_content() {
    let md = "text\n```toml\n[package]\n```\n```rust,no_run\nfn a() {}\n```\n```toml\n[dependencies]\nx = \"1\"\n```\n";
    assert_eq!(
        fenced(md, "toml", "[dependencies]").as_deref(),
        Some("[dependencies]\nx = \"1\"\n")
    );
    assert_eq!(fenced(md, "rust", "fn a").as_deref(), Some("fn a() {}\n"));
    assert_eq!(fenced(md, "rust", "fn b"), None);
    assert_eq!(
        dependencies(
            "kubeairunway-sdk = \"0.1\"\nanyhow = \"1\"\nkubeairunway-sdk = { version = \"0.1\", features = [\"testing\"] }",
            Path::new("/s")
        ),
        "kubeairunway-sdk = { path = \"/s\" }\nanyhow = \"1\"\nkubeairunway-sdk = { path = \"/s\", features = [\"testing\"] }\n"
    );
}
