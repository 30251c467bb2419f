//! Where the browser tests find playwright-core and Chromium: `PLAYWRIGHT_CORE` and
//! `CHROMIUM` (what `tests/e2e/browser/install.sh` prints and scripts/test.sh exports),
//! else where that script puts them.

use std::path::PathBuf;

/// The pinned playwright-core (tests/e2e/browser/install.sh).
pub const PLAYWRIGHT_VERSION: &str = "1.65.1";

/// playwright-core's package directory and Chromium's binary; panics, saying how to
/// install them, when either is missing.
pub fn tools() -> (PathBuf, PathBuf) {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_default();
    let core = std::env::var_os("PLAYWRIGHT_CORE").map_or_else(
        || {
            cache.join(format!(
                "kubeairunway/playwright/{PLAYWRIGHT_VERSION}/node_modules/playwright-core"
            ))
        },
        PathBuf::from,
    );
    let chromium = std::env::var_os("CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        core.join("package.json").exists() && chromium.exists(),
        "the browser tests need playwright-core ({}) and Chromium ({}): run scripts/test.sh or tests/e2e/browser/install.sh, which install them",
        core.display(),
        chromium.display()
    );
    (core, chromium)
}

/// Run the browser script `tests/e2e/browser/<script>` with `args` in headless Chromium
/// ([`tools`]; `SCREENSHOTS` passed on when set) for at most `timeout`: its findings, the
/// JSON of its last line of output. Panics with its whole output when it failed a step
/// (exit status not 0) or printed no findings.
pub async fn run(script: &str, args: &[&str], timeout: std::time::Duration) -> serde_json::Value {
    let (core, chromium) = tools();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("browser")
        .join(script);
    let output = tokio::time::timeout(
        timeout,
        tokio::process::Command::new("node")
            .arg(&script)
            .args(args)
            .env("PLAYWRIGHT_CORE", &core)
            .env("CHROMIUM", &chromium)
            // `SCREENSHOTS=$PWD/docs/images` makes a run save its pages (docs/dashboard.md).
            .envs(std::env::var_os("SCREENSHOTS").map(|d| ("SCREENSHOTS", d)))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{}: no end within {timeout:?}", script.display()))
    .unwrap_or_else(|e| panic!("running node {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let findings: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}"))
        .unwrap_or_else(|e| {
            panic!(
                "{}: no findings ({e}): {stdout}\n{stderr}",
                script.display()
            )
        });
    assert!(
        output.status.success(),
        "{}: {findings:#}\n{stderr}",
        script.display()
    );
    findings
}
