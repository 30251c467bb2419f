//! `kernelcache-noop`: exits 0 at once, whatever its arguments.
//!
//! A warmup pulls an image onto a node by running a container of it; the container must
//! exit successfully at once. `sh -c "exit 0"` needs a shell, which distroless and scratch
//! images lack; this binary needs nothing from the image: it is linked statically and
//! copied into the warmup pod through a shared `emptyDir` by
//! `kernelcache-noop --install <dir>` (run from this provider's own image), then run as the
//! command of every image to preload.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

/// The file name the binary installs itself under.
const NAME: &str = "kernelcache-noop";

/// Copy the running binary into `dir` as [`NAME`], executable by anyone (the containers
/// that run it may use any user). Written beside the target and renamed, so a reader
/// never sees half a binary.
fn install(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe()?;
    let partial = dir.join(format!(".{NAME}.partial"));
    std::fs::copy(&me, &partial)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, dir.join(NAME))
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == "--install") {
        let Some(dir) = args.get(1) else {
            eprintln!("usage: {NAME} --install <directory>");
            return ExitCode::FAILURE;
        };
        if let Err(e) = install(Path::new(dir)) {
            eprintln!("{NAME}: installing into {}: {e}", Path::new(dir).display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
