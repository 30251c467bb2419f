//! Handing the cache roots to the agent's non-root user. The kubelet makes a hostPath
//! `DirectoryOrCreate` root-owned, and an earlier agent running as root left root-owned
//! caches there; the agent's init container (`kernelcache-own-roots`, root with
//! `CAP_CHOWN` alone) runs [`own_tree`] on each root before the agent starts.
//!
//! Nothing else writes the roots meanwhile (a DaemonSet's pod is replaced, not doubled, on
//! its node; serving pods mount caches read-only), so a plain walk is safe: links are
//! changed themselves and never followed, other filesystems are not entered.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt as _, lchown};
use std::path::{Path, PathBuf};

/// Flags of `kernelcache-own-roots`: make the cache roots owned by the agent's user.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "kernelcache-own-roots", version)]
pub struct Cli {
    /// The agent's uid.
    #[arg(long)]
    pub uid: u32,
    /// The agent's gid.
    #[arg(long)]
    pub gid: u32,
    /// The roots (each changed with everything under it).
    #[arg(required = true)]
    pub roots: Vec<PathBuf>,
}

/// Run [`own_tree`] on every root of `cli`.
pub fn run(cli: &Cli) -> anyhow::Result<()> {
    for root in &cli.roots {
        let changed = own_tree(root, cli.uid, cli.gid)
            .map_err(|e| anyhow::anyhow!("{}: {e}", root.display()))?;
        tracing::info!(root = %root.display(), changed, uid = cli.uid, gid = cli.gid, "cache root owned by the agent's user");
    }
    Ok(())
}

/// Make everything under `root` (itself included) owned by `uid:gid`; returns how many
/// entries changed. The root is changed last, so a root already owned by `uid:gid` means
/// an earlier run finished, and nothing is walked.
pub fn own_tree(root: &Path, uid: u32, gid: u32) -> io::Result<u64> {
    let top = fs::symlink_metadata(root)?;
    if !top.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            root.display()
        )));
    }
    if top.uid() == uid && top.gid() == gid {
        return Ok(0);
    }
    let mut changed = 0;
    // Depth first; a directory is pushed back (`true`) to be changed after its entries.
    let mut stack = vec![(root.to_path_buf(), false)];
    while let Some((path, entries_done)) = stack.pop() {
        let meta = fs::symlink_metadata(&path)?;
        if meta.dev() != top.dev() {
            continue;
        }
        if meta.is_dir() && !entries_done {
            stack.push((path.clone(), true));
            for entry in fs::read_dir(&path)? {
                stack.push((entry?.path(), false));
            }
            continue;
        }
        if meta.uid() != uid || meta.gid() != gid {
            lchown(&path, Some(uid), Some(gid))?;
            changed += 1;
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn owner(p: &Path) -> (u32, u32) {
        let m = fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid())
    }

    /// Run as root (CI's test container): a tree with a link pointing outside it is
    /// handed over, the link itself changed, its target not; a second run walks nothing.
    #[test]
    fn hands_the_tree_over_without_following_links() {
        if !rustix::process::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs the tests as root: chown needs it"
            );
            eprintln!("skipped: chown needs root");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        fs::write(&secret, b"x").unwrap();
        let cache = root.path().join("ml/triton/sha256-aa");
        fs::create_dir_all(&cache).unwrap();
        fs::write(cache.join("k.cubin"), b"k").unwrap();
        symlink(&secret, cache.join("link")).unwrap();
        symlink(outside.path(), root.path().join("dirlink")).unwrap();

        let changed = own_tree(root.path(), 65532, 65533).unwrap();
        // The root, ml, triton, sha256-aa, k.cubin and the two links.
        assert_eq!(changed, 7);
        for p in [
            root.path().to_path_buf(),
            cache.clone(),
            cache.join("k.cubin"),
            cache.join("link"),
            root.path().join("dirlink"),
        ] {
            assert_eq!(owner(&p), (65532, 65533), "{}", p.display());
        }
        assert_eq!(owner(&secret), (0, 0), "a link's target is not changed");
        assert_eq!(owner(outside.path()), (0, 0));
        assert_eq!(own_tree(root.path(), 65532, 65533).unwrap(), 0);
        // A root that is a link is refused.
        assert!(own_tree(&root.path().join("dirlink"), 1, 1).is_err());
    }
}
