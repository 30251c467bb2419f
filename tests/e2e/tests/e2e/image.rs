//! The platform's image, proven without a container engine: the runtime root the
//! Dockerfile builds (`image/rootfs.sh`: Debian's glibc, libgcc, CA certificates) and the
//! binaries of `image/binaries.txt` (as `cargo build` made them) are assembled into an OCI
//! image with the Dockerfile's user and command, pushed to a real loopback registry
//! (`kubeairunway_testcluster::registry`), pulled back, checked against the digests and
//! diff IDs, unpacked, and every binary is run with `--version` from the unpacked root:
//! through the root's own dynamic loader, and only after `ld.so --list` shows that every
//! library it loads is the root's (a library the image lacks fails the test instead of
//! being found on this machine).
//!
//! Needs the binaries built (`scripts/test.sh` runs `cargo build --bins` first); without
//! them the test is skipped with a message, except in CI, where it fails.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use kubeairunway_e2e::cache_images::{oci_client, start_registry};
use oci_client::Reference;
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::{
    IMAGE_CONFIG_MEDIA_TYPE, IMAGE_LAYER_GZIP_MEDIA_TYPE, IMAGE_LAYER_MEDIA_TYPE,
};
use oci_client::secrets::RegistryAuth;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The Dockerfile's `USER` and `CMD`.
const USER: &str = "65532:65532";
const CMD: &str = "/kubeairunway-controller";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn image_binaries() -> Vec<String> {
    std::fs::read_to_string(repo().join("image/binaries.txt"))
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Where cargo put this build's binaries: the profile directory above `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// The OCI architecture, the Debian one (for `image/rootfs.sh`) and the dynamic loader and
/// library directory inside the root, of this machine.
fn platform() -> (&'static str, &'static str, &'static str) {
    match std::env::consts::ARCH {
        "x86_64" => (
            "amd64",
            "lib64/ld-linux-x86-64.so.2",
            "usr/lib/x86_64-linux-gnu",
        ),
        "aarch64" => (
            "arm64",
            "lib/ld-linux-aarch64.so.1",
            "usr/lib/aarch64-linux-gnu",
        ),
        other => panic!("no image for {other}"),
    }
}

/// A writer that hashes what passes through (the diff ID of an uncompressed layer).
struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A tar layer built by `fill`, gzipped or not, and its diff ID (the digest of the tar).
fn layer<W: Write>(
    out: W,
    fill: impl FnOnce(&mut tar::Builder<Hashing<W>>) -> std::io::Result<()>,
) -> (W, String) {
    let mut builder = tar::Builder::new(Hashing {
        inner: out,
        hash: Sha256::new(),
    });
    builder.mode(tar::HeaderMode::Deterministic);
    builder.follow_symlinks(false);
    fill(&mut builder).unwrap();
    let hashing = builder.into_inner().unwrap();
    (
        hashing.inner,
        format!("sha256:{:x}", hashing.hash.finalize()),
    )
}

fn sha256_file(path: &Path) -> String {
    let mut hash = Sha256::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut hash).unwrap();
    format!("sha256:{:x}", hash.finalize())
}

#[tokio::test]
async fn the_image_is_pushed_pulled_unpacked_and_every_binary_runs_from_its_root() {
    let binaries = image_binaries();
    let dir = profile_dir();
    let missing: Vec<&String> = binaries.iter().filter(|b| !dir.join(b).is_file()).collect();
    if !missing.is_empty() {
        assert!(
            std::env::var("CI").is_err(),
            "binaries {missing:?} are not in {}: scripts/test.sh builds them (cargo build --bins)",
            dir.display()
        );
        eprintln!("binaries {missing:?} not built: skipping (cargo build --workspace --bins)");
        return;
    }
    let (arch, loader, libdir) = platform();
    let work = tempfile::tempdir().unwrap();

    // The runtime root, exactly as the Dockerfile's rootfs stage makes it.
    let rootfs = work.path().join("rootfs");
    let out = Command::new("bash")
        .arg(repo().join("image/rootfs.sh"))
        .arg(&rootfs)
        .arg(arch)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "image/rootfs.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The root as a gzip layer, as images usually are; the binaries (hundreds of MB in a
    // debug build) uncompressed, which OCI allows, so that the test spends no minutes in
    // an unoptimized gzip.
    let (base, base_id) = layer(GzEncoder::new(Vec::new(), Compression::fast()), |b| {
        b.append_dir_all(".", &rootfs)
    });
    let base = base.finish().unwrap();
    let (bins, bins_id) = layer(Vec::new(), |b| {
        for bin in &binaries {
            let mut file = File::open(dir.join(bin))?;
            let mut header = tar::Header::new_gnu();
            header.set_size(file.metadata()?.len());
            header.set_mode(0o755);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mtime(0);
            b.append_data(&mut header, bin, &mut file)?;
        }
        Ok(())
    });
    let config = json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "User": USER,
            "Cmd": [CMD],
            "WorkingDir": "/",
            "Labels": {"org.opencontainers.image.source": "https://github.com/kubeairunway/kubeairunway"},
        },
        "rootfs": {"type": "layers", "diff_ids": [base_id, bins_id]},
    });

    let registry = start_registry("image").unwrap();
    let reference: Reference = format!(
        "{}/kubeairunway/kubeairunway:{}",
        registry.addr(),
        env!("CARGO_PKG_VERSION")
    )
    .parse()
    .unwrap();
    let auth = RegistryAuth::Anonymous;
    let client = oci_client();
    client
        .push(
            &reference,
            &[
                ImageLayer::new(base, IMAGE_LAYER_GZIP_MEDIA_TYPE.into(), None),
                ImageLayer::new(bins, IMAGE_LAYER_MEDIA_TYPE.into(), None),
            ],
            Config::new(
                serde_json::to_vec(&config).unwrap(),
                IMAGE_CONFIG_MEDIA_TYPE.into(),
                None,
            ),
            &auth,
            None,
        )
        .await
        .unwrap();

    // Pull it back as a runtime would: manifest, config, then each layer by digest.
    let fresh = oci_client();
    let (manifest, _digest, pulled_config) = fresh
        .pull_manifest_and_config(&reference, &auth)
        .await
        .unwrap();
    let pulled_config: Value = serde_json::from_str(&pulled_config).unwrap();
    assert_eq!(pulled_config["config"]["User"], USER);
    assert_eq!(pulled_config["config"]["Cmd"], json!([CMD]));
    assert_eq!(pulled_config["architecture"], arch);
    let diff_ids = pulled_config["rootfs"]["diff_ids"].as_array().unwrap();
    assert_eq!(manifest.layers.len(), diff_ids.len());
    let root = work.path().join("unpacked");
    std::fs::create_dir(&root).unwrap();
    for (descriptor, diff_id) in manifest.layers.iter().zip(diff_ids) {
        let path = work.path().join("layer");
        let mut file = tokio::fs::File::create(&path).await.unwrap();
        fresh
            .pull_blob(&reference, descriptor, &mut file)
            .await
            .unwrap();
        tokio::io::AsyncWriteExt::flush(&mut file).await.unwrap();
        drop(file);
        assert_eq!(sha256_file(&path), descriptor.digest, "layer digest");
        let file = BufReader::new(File::open(&path).unwrap());
        let tar: Box<dyn Read> = match descriptor.media_type.as_str() {
            IMAGE_LAYER_GZIP_MEDIA_TYPE => Box::new(GzDecoder::new(file)),
            IMAGE_LAYER_MEDIA_TYPE => Box::new(file),
            other => panic!("unexpected layer type {other}"),
        };
        let mut hash = Sha256::new();
        let mut tee = TeeReader {
            inner: tar,
            hash: &mut hash,
        };
        let mut archive = tar::Archive::new(&mut tee);
        archive.set_preserve_permissions(true);
        archive.unpack(&root).unwrap();
        // The rest of the stream (tar's end blocks) belongs to the diff ID too.
        std::io::copy(&mut tee, &mut std::io::sink()).unwrap();
        assert_eq!(
            Value::String(format!("sha256:{:x}", hash.finalize())),
            *diff_id,
            "diff ID"
        );
        std::fs::remove_file(&path).unwrap();
    }

    // Every binary, from the unpacked root, with the root's loader and libraries only.
    let loader = root.join(loader);
    let libdir = root.join(libdir);
    assert!(loader.is_file(), "the image has no {}", loader.display());
    for bin in &binaries {
        let exe = root.join(bin);
        let list = Command::new(&loader)
            .env_clear()
            .arg("--inhibit-cache")
            .arg("--library-path")
            .arg(&libdir)
            .arg("--list")
            .arg(&exe)
            .output()
            .unwrap();
        let listed = String::from_utf8_lossy(&list.stdout);
        assert!(list.status.success(), "{bin}: ld.so --list: {listed}");
        for line in listed.lines().filter(|l| l.contains("=>")) {
            let target = line.split("=>").nth(1).unwrap().trim();
            assert!(
                target.starts_with(root.to_str().unwrap()),
                "{bin} loads a library the image does not have: {line}"
            );
        }
        let out = Command::new(&loader)
            .env_clear()
            .arg("--inhibit-cache")
            .arg("--library-path")
            .arg(&libdir)
            .arg(&exe)
            .arg("--version")
            .current_dir(&root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{bin} --version: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{bin} {}", env!("CARGO_PKG_VERSION"))
        );
    }
    // The CA bundle the registries' TLS is verified with, and the nonroot user.
    let bundle = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    assert!(bundle.matches("BEGIN CERTIFICATE").count() > 100);
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.contains(&format!("nonroot:x:{USER}:")));
}

/// A reader that hashes what it reads.
struct TeeReader<'a, R> {
    inner: R,
    hash: &'a mut Sha256,
}

impl<R: Read> Read for TeeReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}
