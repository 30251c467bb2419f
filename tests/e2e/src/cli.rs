//! The command line, run in-process as a user runs it.

use std::ffi::OsString;

use kubeairunway_cli::Terminal;

/// Run `kubeairunway args...` in-process: (exit code, stdout, stderr).
pub async fn run(args: &[&str]) -> (i32, String, String) {
    let (mut term, captured) = Terminal::capture();
    let argv: Vec<OsString> = std::iter::once("kubeairunway")
        .chain(args.iter().copied())
        .map(OsString::from)
        .collect();
    let code = kubeairunway_cli::run(argv, &mut term).await;
    (code, captured.out(), captured.err())
}
