//! A real OCI registry on loopback (the CNCF distribution registry, from Debian's
//! `docker-registry` package, unpacked into the user cache by `fetch-registry.sh`), tied
//! to the test process like the API server.

use std::fmt::Write as _;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use std::{fs, thread};

use anyhow::{Context, bail};

/// A running registry (plain HTTP on 127.0.0.1).
#[derive(Debug)]
pub struct Registry {
    addr: String,
    dir: PathBuf,
    process: Child,
    user: Option<(String, String)>,
}

impl Registry {
    /// Start a registry storing its data under `dir` (emptied first), open to anyone.
    pub fn start(dir: &Path) -> anyhow::Result<Self> {
        Self::start_as(dir, None)
    }

    /// Start a registry that requires `user`'s name and password for every request
    /// (distribution's `htpasswd` access controller: a `Basic` challenge, 401 without them
    /// or with wrong ones).
    pub fn start_with_user(dir: &Path, user: &str, password: &str) -> anyhow::Result<Self> {
        Self::start_as(dir, Some((user.to_string(), password.to_string())))
    }

    fn start_as(dir: &Path, user: Option<(String, String)>) -> anyhow::Result<Self> {
        let bin = binary()?;
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        fs::create_dir_all(dir.join("data"))?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.join("data").display()
        );
        if let Some((name, password)) = &user {
            let hash = bcrypt::hash(password, 4).context("hashing the registry password")?;
            fs::write(dir.join("htpasswd"), format!("{name}:{hash}\n"))?;
            let _ = write!(
                config,
                "auth:\n  htpasswd:\n    realm: test-registry\n    path: {}\n",
                dir.join("htpasswd").display()
            );
        }
        fs::write(dir.join("config.yml"), config)?;
        let log = fs::File::create(dir.join("registry.log"))?;
        let process = Command::new("sh")
            .arg("-c")
            .arg(r#"exec 3<&0; "$@" </dev/null & pid=$!; (cat <&3 >/dev/null; kill -TERM $pid 2>/dev/null; sleep 3; kill -KILL $pid 2>/dev/null) & exec 3<&-; wait $pid"#)
            .arg("watchdog")
            .arg(&bin)
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting docker-registry")?;
        let mut registry = Registry {
            addr,
            dir: dir.to_path_buf(),
            process,
            user,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !registry.answers() {
            if let Some(status) = registry.process.try_wait()? {
                bail!(
                    "registry exited ({status}): {}",
                    fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!("registry not ready after 30s");
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(registry)
    }

    fn answers(&self) -> bool {
        use std::io::Write;
        let Ok(mut s) = TcpStream::connect(&self.addr) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n").is_err() {
            return false;
        }
        // 401: it answers, and asks for credentials.
        let mut head = [0u8; 12];
        s.read_exact(&mut head).is_ok()
            && head.starts_with(b"HTTP/1.")
            && (&head[9..12] == b"200" || (self.user.is_some() && &head[9..12] == b"401"))
    }

    /// The name and password it requires, when it requires some.
    pub fn user(&self) -> Option<(&str, &str)> {
        self.user.as_ref().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// `127.0.0.1:<port>`, the registry part of image references.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Where the registry keeps its blobs (`docker/registry/v2/blobs/...`), for tests that
    /// tamper with stored content.
    pub fn storage(&self) -> PathBuf {
        self.dir.join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        drop(self.process.stdin.take());
        let _ = self.process.wait();
    }
}

/// The `docker-registry` binary, unpacked by `fetch-registry.sh` when missing.
pub fn binary() -> anyhow::Result<PathBuf> {
    let bin = crate::cache_dir().join("bin/docker-registry");
    if bin.is_file() {
        return Ok(bin);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fetch-registry.sh");
    let status = Command::new("bash")
        .arg(&script)
        .env("KUBEAIRUNWAY_TESTCLUSTER_CACHE", crate::cache_dir())
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() {
        bail!("{} failed ({status})", script.display());
    }
    Ok(bin)
}
