//! The binary as warmup pods use it: installed into a directory, then run with any
//! arguments.

use std::process::Command;

#[test]
fn installs_itself_and_exits_zero_whatever_it_is_given() {
    let dir = std::env::temp_dir().join(format!("kernelcache-noop-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_kernelcache-noop"))
        .args(["--install"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(status.success());
    let installed = dir.join("kernelcache-noop");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&installed).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o755);
    assert!(!dir.join(".kernelcache-noop.partial").exists());
    for args in [&[][..], &["serve", "--port", "8000"][..]] {
        let status = Command::new(&installed)
            .args(args)
            .env_clear()
            .status()
            .unwrap();
        assert!(status.success(), "{args:?}");
    }
    let missing = Command::new(env!("CARGO_BIN_EXE_kernelcache-noop"))
        .arg("--install")
        .status()
        .unwrap();
    assert!(
        !missing.success(),
        "--install without a directory is a usage error"
    );
    let unwritable = Command::new(env!("CARGO_BIN_EXE_kernelcache-noop"))
        .args(["--install", "/proc/no-such-dir"])
        .status()
        .unwrap();
    assert!(!unwritable.success());
    std::fs::remove_dir_all(&dir).unwrap();
}
