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
