//! `kubeairunway cache build|verify`: kernel-cache images on the kernel-cache crate's
//! library. `build` packages a Triton cache directory or a vLLM cache root in the GKM/MCV
//! compat format (`build::package`), pushes it with the credentials Docker or Podman keep
//! (`build::push`, `build::docker_auth`) and optionally signs it with a cosign key
//! (`sign::sign`: a Sigstore bundle as cosign 3 writes by default, or cosign's legacy
//! simple-signing object); `verify` says what the kernel-cache controller would decide about an
//! image under the cluster's KernelCachePolicy (`verify::explain`, then the controller's
//! own `decide::verdict`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use kubeairunway_kernelcache_api::{KernelCachePolicySpec, Verification};
use kubeairunway_kernelcache_artifact::image::{CacheType, Target, normalize_arch};
use kubeairunway_kernelcache_controller::decide::{self, Verdict, reasons};
use kubeairunway_kernelcache_signing::build;
use kubeairunway_kernelcache_signing::sign;
use kubeairunway_kernelcache_signing::verify;
use serde::Serialize;

use crate::Terminal;
use crate::output::{self, Format};

/// `cache`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// `cache` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Package a Triton or vLLM cache directory as a cache image, push it, optionally
    /// sign it.
    Build(BuildArgs),
    /// The verdict the kernel-cache controller would reach on an image under the cluster's
    /// KernelCachePolicy (or a policy file).
    Verify(VerifyArgs),
    /// Model caches: Hugging Face models in the standard cache layout (`pull`).
    Model(crate::modelcache::Args),
}

/// `--type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// A Triton kernel cache directory (`TRITON_CACHE_DIR`).
    Triton,
    /// A vLLM cache root (`VLLM_CACHE_ROOT`, holding `torch_compile_cache/`).
    Vllm,
}

impl From<Kind> for CacheType {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Triton => CacheType::Triton,
            Kind::Vllm => CacheType::Vllm,
        }
    }
}

/// `--signature-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SignatureFormat {
    /// A Sigstore bundle (cosign 3's default).
    Bundle,
    /// cosign's legacy simple-signing format.
    Legacy,
}

impl From<SignatureFormat> for sign::Format {
    fn from(format: SignatureFormat) -> Self {
        match format {
            SignatureFormat::Bundle => sign::Format::Bundle,
            SignatureFormat::Legacy => sign::Format::Legacy,
        }
    }
}

/// A registry spoken to over plain HTTP, as the controller's and agent's flag of the same
/// name.
#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// A registry spoken to over plain HTTP (repeatable; air-gapped mirrors, tests).
    #[arg(
        long = "plain-http-registry",
        env = "PLAIN_HTTP_REGISTRIES",
        value_delimiter = ',',
        value_name = "HOST:PORT"
    )]
    pub plain_http_registries: Vec<String>,
}

/// `cache build`.
#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The cache directory: a `TRITON_CACHE_DIR`, or a `VLLM_CACHE_ROOT` (with `--type
    /// vllm`).
    pub dir: PathBuf,
    /// The image to push: `registry/repository:tag`. Credentials are the ones Docker or
    /// Podman keep (`docker login`, `podman login`).
    pub image: String,
    /// What kind of cache the directory holds.
    #[arg(long = "type", value_enum, default_value = "triton")]
    pub kind: Kind,
    /// A GPU target the cache was built for, `BACKEND:ARCH[:WARP_SIZE]` (`cuda:90`,
    /// `cuda:sm_90`, `hip:gfx90a:64`; repeatable). Required for vLLM, whose caches do not
    /// record it; for Triton read from the kernels' own metadata, and checked against them
    /// when given. Without a warp size, the one the GPUs report (32 for CUDA and AMD RDNA,
    /// 64 for other AMD GPUs).
    #[arg(long = "target", value_name = "BACKEND:ARCH[:WARP]", value_parser = parse_target)]
    pub targets: Vec<Target>,
    /// Sign the pushed image with this cosign private key (`cosign generate-key-pair`'s
    /// `cosign.key`; its password from `COSIGN_PASSWORD`, as cosign reads it). The
    /// KernelCachePolicy then lists the public key (`cosign.pub`).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// The signature format with `--key`: `bundle`, the Sigstore bundle cosign 3 writes by
    /// default (an OCI referrer of the image, under the `sha256-<hex>` tag where the
    /// registry has no referrers API), or `legacy`, cosign's simple-signing object
    /// (`sha256-<hex>.sig`, as `cosign sign --new-bundle-format=false`) for verifiers
    /// that read only that format.
    #[arg(long, value_enum, default_value = "bundle", requires = "key")]
    pub signature_format: SignatureFormat,
    /// The registries spoken to over plain HTTP.
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Format,
}

/// `cache verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The image: `registry/repository:tag` or `registry/repository@sha256:...`.
    pub image: String,
    /// The cluster's KernelCachePolicy to verify under (the controller's `--policy`).
    #[arg(long, default_value = "default", conflicts_with = "policy_file")]
    pub policy: String,
    /// Verify under the KernelCachePolicy in this file (YAML or JSON) instead; no cluster
    /// is needed.
    #[arg(long, value_name = "FILE")]
    pub policy_file: Option<PathBuf>,
    /// Kubeconfig of the cluster (default: KUBECONFIG, the local cluster of `up`, then
    /// ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The registries spoken to over plain HTTP.
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Format,
}

/// Parse `BACKEND:ARCH[:WARP_SIZE]`.
pub fn parse_target(text: &str) -> Result<Target, String> {
    let mut parts = text.split(':');
    let (Some(backend), Some(arch)) = (parts.next(), parts.next()) else {
        return Err(format!(
            "{text:?} is not BACKEND:ARCH[:WARP_SIZE] (e.g. cuda:90, hip:gfx90a:64)"
        ));
    };
    let backend = backend.to_ascii_lowercase();
    if !matches!(backend.as_str(), "cuda" | "hip") {
        return Err(format!("backend {backend:?} is neither cuda nor hip"));
    }
    if arch.is_empty() {
        return Err(format!("{text:?} names no architecture"));
    }
    let warp_size = parts
        .next()
        .map(|w| {
            w.parse::<u32>()
                .map_err(|_| format!("warp size {w:?} is not a number"))
        })
        .transpose()?;
    if parts.next().is_some() {
        return Err(format!("{text:?} has more than three parts"));
    }
    Ok(Target {
        backend,
        arch: normalize_arch(arch),
        warp_size,
    })
}

/// What `cache build` made.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Built {
    /// The pushed image, pinned to its digest: what a KernelCache names.
    pub pinned: String,
    /// The image's labels.
    pub labels: BTreeMap<String, String>,
    /// The signer the controller will report (`sha256:<key fingerprint>`), when signed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
}

/// The public key of a cosign private key, and the signer name the controller reports.
fn signer_of(key: &[u8], password: &[u8]) -> anyhow::Result<String> {
    use sigstore::crypto::signing_key::SigStoreKeyPair;
    let pair = SigStoreKeyPair::from_encrypted_pem(key, password)
        .or_else(|_| SigStoreKeyPair::from_pem(key))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let public = pair
        .public_key_to_pem()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    verify::key_fingerprint(&public).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Run `cache build`.
pub async fn run_build(args: &BuildArgs, term: &mut Terminal) -> anyhow::Result<i32> {
    // Read the key first: a bad key or password fails before anything is pushed.
    let key = match &args.key {
        Some(path) => {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let password = std::env::var("COSIGN_PASSWORD").unwrap_or_default();
            let signer = signer_of(&pem, password.as_bytes()).with_context(|| {
                format!(
                    "{} is not a cosign private key readable with COSIGN_PASSWORD",
                    path.display()
                )
            })?;
            Some((pem, password, signer))
        }
        None => None,
    };
    let auth = crate::trust::auth_for(&args.image)?;
    term.err(&format!("packaging {}\n", args.dir.display()));
    let dir = args.dir.clone();
    let (kind, targets) = (CacheType::from(args.kind), args.targets.clone());
    let built = tokio::task::spawn_blocking(move || build::package(&dir, kind, &targets))
        .await?
        .with_context(|| format!("packaging {}", args.dir.display()))?;
    term.err(&format!(
        "pushing {} ({} bytes compressed)\n",
        args.image,
        built.layer.len()
    ));
    let plain_http = args.registry.plain_http_registries.clone();
    let pinned = build::push(&built, &args.image, &auth, plain_http.clone()).await?;
    let mut signer = None;
    if let Some((pem, password, name)) = key {
        term.err(&format!("signing {pinned}\n"));
        let format = sign::Format::from(args.signature_format);
        sign::sign(
            &pinned,
            &pem,
            password.as_bytes(),
            &auth,
            plain_http,
            format,
        )
        .await?;
        signer = Some(name);
    }
    let result = Built {
        pinned,
        labels: built.labels,
        signer,
    };
    term.out(&match args.output {
        Format::Table => build_text(&result),
        Format::Yaml => output::yaml(&result)?,
        Format::Json => output::json(&result)?,
    });
    Ok(0)
}

/// `cache build`'s human-readable result.
pub fn build_text(built: &Built) -> String {
    let mut out = format!("pushed {}\n", built.pinned);
    for (k, v) in &built.labels {
        let _ = writeln!(out, "  {k}: {v}");
    }
    let _ = match &built.signer {
        Some(signer) => writeln!(
            out,
            "signed by {signer} (a KernelCachePolicy in mode key verifies it with the public key)"
        ),
        None => writeln!(out, "not signed (give --key to sign with a cosign key)"),
    };
    out
}

/// What `cache verify` found.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    /// The image as given.
    pub image: String,
    /// Pinned to the digest its tag names now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
    /// Where the policy came from (`KernelCachePolicy/default`, or a file).
    pub policy: String,
    /// The controller's verdict: whether nodes may use the image, its `Verified`
    /// condition's reason and message.
    pub verdict: Verdict,
    /// The verification, as the KernelCache's `status.verification` would show it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
}

/// The policy to verify under: from the file, or the cluster's (`None` when the cluster
/// has none of that name). Returns it with where it came from.
async fn policy(
    args: &VerifyArgs,
    state_dir: &Path,
) -> anyhow::Result<(Option<KernelCachePolicySpec>, String)> {
    crate::trust::policy_of(
        &args.policy,
        args.policy_file.as_deref(),
        args.kubeconfig.as_deref(),
        state_dir,
    )
    .await
}

/// Run `cache verify`: exit code 0 when the controller would let nodes use the image.
pub async fn run_verify(
    args: &VerifyArgs,
    state_dir: &Path,
    term: &mut Terminal,
) -> anyhow::Result<i32> {
    let (spec, origin) = policy(args, state_dir).await?;
    let auth = crate::trust::auth_for(&args.image)?;
    let result = match spec {
        None => Verified {
            image: args.image.clone(),
            pinned: None,
            policy: origin.clone(),
            verdict: decide::verdict(false, false, &no_policy(&args.policy)),
            verification: None,
        },
        Some(spec) => {
            term.err(&format!("verifying {} under {origin}\n", args.image));
            let explained = verify::explain(
                &spec,
                &args.image,
                &auth,
                args.registry.plain_http_registries.clone(),
            )
            .await
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.image))?;
            Verified {
                image: args.image.clone(),
                pinned: Some(explained.pinned),
                policy: origin,
                verdict: decide::verdict(true, explained.image.is_some(), &explained.verification),
                verification: Some(explained.verification),
            }
        }
    };
    term.out(&match args.output {
        Format::Table => verify_text(&result),
        Format::Yaml => output::yaml(&result)?,
        Format::Json => output::json(&result)?,
    });
    Ok(if result.verdict.usable {
        0
    } else {
        crate::terminal::FAILURE
    })
}

/// The verification the controller shows when there is no policy.
fn no_policy(name: &str) -> Verification {
    Verification {
        message: Some(format!("no KernelCachePolicy '{name}'")),
        ..Verification::default()
    }
}

/// `cache verify`'s human-readable result.
pub fn verify_text(v: &Verified) -> String {
    let mut out = format!("Image:    {}\n", v.image);
    if let Some(pinned) = &v.pinned {
        let _ = writeln!(out, "Pinned:   {pinned}");
    }
    let mode = v
        .verification
        .as_ref()
        .and_then(|x| serde_json::to_value(x.mode).ok())
        .and_then(|m| m.as_str().map(|m| format!(" (mode {m})")))
        .unwrap_or_default();
    let _ = writeln!(out, "Policy:   {}{mode}", v.policy);
    let _ = writeln!(
        out,
        "Verified: {} {}: {}",
        if v.verdict.usable { "True" } else { "False" },
        v.verdict.reason,
        v.verdict.message
    );
    out.push_str(if v.verdict.usable {
        "Nodes may stage it: a KernelCache naming it becomes usable.\n"
    } else if v.verdict.reason == reasons::NO_POLICY {
        "Every cache is refused until the policy exists (see docs/kernelcache.md, \"Controller\").\n"
    } else {
        "A KernelCache naming it stays unusable: no node stages it.\n"
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_as_the_labels_spell_them() {
        let t = parse_target("cuda:sm_90").unwrap();
        assert_eq!((t.backend.as_str(), t.arch.as_str()), ("cuda", "90"));
        assert_eq!(t.warp_size, None);
        let t = parse_target("HIP:gfx90a:64").unwrap();
        assert_eq!(
            (t.backend.as_str(), t.arch.as_str(), t.warp_size),
            ("hip", "gfx90a", Some(64))
        );
        for bad in ["cuda", "cuda:", "metal:1", "hip:gfx90a:x", "cuda:90:32:1"] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn without_a_policy_nothing_is_usable() {
        let v = Verified {
            image: "r/x:v1".into(),
            pinned: None,
            policy: "KernelCachePolicy/default".into(),
            verdict: decide::verdict(false, false, &no_policy("default")),
            verification: None,
        };
        assert!(!v.verdict.usable);
        let text = verify_text(&v);
        assert!(
            text.contains("Verified: False NoPolicy: no KernelCachePolicy 'default'\n"),
            "{text}"
        );
    }
}
