//! `kubeairunway cache model pull`: the node agent's download code run locally: for
//! `hf://`, the Hugging Face download (`kubeairunway-modelcache-hub`: the same cache
//! layout, verification and resume); for `oci://registry/repo@sha256:...`, the OCI model
//! artifact pull (`kubeairunway_kernelcache_artifact::modelpack`: by digest, every blob
//! verified, tar layers extracted safely, published under a model id). The result is an
//! `HF_HUB_CACHE` directory that vLLM, SGLang and TensorRT-LLM read with
//! `HF_HUB_OFFLINE=1`.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use kubeairunway_kernelcache_api::model::oci_model_id;
use kubeairunway_kernelcache_artifact::allow::RegistryOptions;
use kubeairunway_kernelcache_artifact::extract::Limits;
use kubeairunway_kernelcache_artifact::modelpack::pull::{ModelReport, Target};
use kubeairunway_kernelcache_artifact::oci::Puller;
use kubeairunway_modelcache_hub::client::DEFAULT_ENDPOINT;
use kubeairunway_modelcache_hub::{Hub, HubOptions, PullOptions, PullReport, RepoId, pull};
use oci_client::secrets::RegistryAuth;
use serde::Serialize;

use crate::Terminal;
use crate::output::{self, Format};

/// `cache model`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// `cache model` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Download a Hugging Face model (or an OCI model artifact, pinned by digest) into a
    /// cache directory (the standard HF cache layout), verifying every file and resuming
    /// what an earlier run left unfinished.
    Pull(PullArgs),
}

/// `cache model pull`.
#[derive(Debug, clap::Args)]
pub struct PullArgs {
    /// The model: `hf://org/name`, `org/name`, or `oci://registry/repo@sha256:<64 hex>` (a
    /// ModelPack artifact or a KitOps ModelKit).
    pub source: String,
    /// The model id an `oci://` artifact is published as (what engines are given);
    /// default: the last two segments of its repository.
    #[arg(long, value_name = "ORG/NAME")]
    pub model_id: Option<String>,
    /// Registries of `oci://` sources.
    #[command(flatten)]
    pub registries: RegistryOptions,
    /// Verify an `oci://` artifact's signature before pulling anything, under the
    /// cluster's KernelCachePolicy of this name, as the kernel-cache controller does for a
    /// ModelCache (a refused artifact is not pulled; exit code 1).
    #[arg(long, value_name = "NAME", conflicts_with = "policy_file")]
    pub policy: Option<String>,
    /// As `--policy`, under the KernelCachePolicy in this file (YAML or JSON); no cluster
    /// is needed.
    #[arg(long, value_name = "FILE")]
    pub policy_file: Option<PathBuf>,
    /// Kubeconfig of the cluster `--policy` is read from (default: KUBECONFIG, the local
    /// cluster of `up`, then ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The cache directory (what `HF_HUB_CACHE` names; `$HF_HOME/hub` by default in
    /// huggingface_hub).
    #[arg(long, env = "HF_HUB_CACHE", value_name = "DIR")]
    pub cache_dir: PathBuf,
    /// A branch, tag or commit.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// The hub's URL.
    #[arg(long, env = "HF_ENDPOINT", default_value = DEFAULT_ENDPOINT, value_name = "URL")]
    pub hf_endpoint: String,
    /// A file holding a Hugging Face access token (gated and private models).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Only files matching this pattern (fnmatch-like, `*` crosses `/`; repeatable).
    #[arg(long = "include", value_name = "GLOB")]
    pub include: Vec<String>,
    /// Files downloaded at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub parallel: u16,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Format,
}

/// What a SOURCE names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A Hugging Face repository.
    Hf(RepoId),
    /// An OCI model artifact, `registry/repo@sha256:<64 hex>`.
    Oci(String),
}

/// The model a SOURCE names: `hf://org/name` or `org/name`, or an `oci://` artifact pinned
/// to a digest.
pub fn parse_source(source: &str) -> anyhow::Result<Source> {
    let id = match source.split_once("://") {
        Some(("hf", rest)) => rest,
        Some(("oci", reference)) => {
            let pinned = reference.split_once("@sha256:").is_some_and(|(name, hex)| {
                !name.is_empty()
                    && hex.len() == 64
                    && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            });
            anyhow::ensure!(
                pinned,
                "an oci:// source is pinned to a digest: oci://registry/repo@sha256:<64 hex>"
            );
            return Ok(Source::Oci(reference.to_string()));
        }
        Some((scheme, _)) => {
            anyhow::bail!(
                "{scheme}:// sources are not supported (hf://org/name, oci://registry/repo@sha256:...)"
            )
        }
        None => source,
    };
    Ok(Source::Hf(RepoId::parse(id)?))
}

/// A token file's token (its first line, trimmed).
fn read_token(path: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let token = text.lines().next().unwrap_or_default().trim().to_string();
    anyhow::ensure!(!token.is_empty(), "{} holds no token", path.display());
    Ok(token)
}

/// What `-o json|yaml` prints.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Pulled<'a> {
    repo: &'a str,
    revision: &'a str,
    commit: &'a str,
    hf_hub_cache: &'a Path,
    snapshot: &'a Path,
    bytes_total: u64,
    bytes_received: u64,
    files: Vec<PulledFile<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PulledFile<'a> {
    path: &'a str,
    size: u64,
    etag: &'a str,
    received: u64,
    cached: bool,
}

/// The human summary of a pull.
fn summary(report: &PullReport) -> String {
    let mut table = output::Table::new(&["FILE", "SIZE", "RECEIVED", "STATE"]);
    for f in &report.files {
        let state = if f.cached {
            "cached"
        } else if f.resumed > 0 {
            "resumed"
        } else {
            "downloaded"
        };
        table.row(vec![
            f.path.clone(),
            f.size.to_string(),
            f.received.to_string(),
            state.to_string(),
        ]);
    }
    let cache = report.cache_dir.display();
    format!(
        "{}@{} = commit {}\n{}{} files, {} bytes ({} received)\nsnapshot: {}\nuse: HF_HUB_CACHE={cache} HF_HUB_OFFLINE=1 (or HF_HOME=<dir> when the cache is <dir>/hub)\n",
        report.repo,
        report.revision,
        report.commit,
        table.render(),
        report.files.len(),
        report.bytes_total,
        report.bytes_received,
        report.snapshot.display(),
    )
}

/// The cache directory, created and made absolute.
fn cache_dir(args: &PullArgs) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(&args.cache_dir)
        .with_context(|| format!("creating {}", args.cache_dir.display()))?;
    std::fs::canonicalize(&args.cache_dir)
        .with_context(|| format!("resolving {}", args.cache_dir.display()))
}

/// What `-o json|yaml` prints for an `oci://` source.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PulledArtifact<'a> {
    reference: &'a str,
    digest: &'a str,
    model_id: &'a str,
    revision: &'a str,
    commit: &'a str,
    hf_hub_cache: &'a Path,
    snapshot: &'a Path,
    files: usize,
    bytes_total: u64,
    bytes_received: u64,
}

/// Why the policy `--policy`/`--policy-file` names refuses `reference` (the kernel-cache
/// controller's verdict on a ModelCache: `verify::verify` and `judge_oci`), or `None`
/// when it passes or no policy was asked for.
async fn refused_by_policy(
    args: &PullArgs,
    reference: &str,
    auth: &RegistryAuth,
    state_dir: &Path,
    term: &mut Terminal,
) -> anyhow::Result<Option<String>> {
    use kubeairunway_kernelcache_api::VerificationMode;
    use kubeairunway_kernelcache_controller::{decide, model_decide};
    if args.policy.is_none() && args.policy_file.is_none() {
        return Ok(None);
    }
    let name = args.policy.as_deref().unwrap_or("default");
    let (spec, origin) = crate::trust::policy_of(
        name,
        args.policy_file.as_deref(),
        args.kubeconfig.as_deref(),
        state_dir,
    )
    .await?;
    let Some(spec) = spec else {
        return Ok(Some(format!("{origin} does not exist")));
    };
    term.err(&format!("verifying {reference} under {origin}\n"));
    let result = kubeairunway_kernelcache_signing::verify::verify(
        &spec,
        reference,
        auth,
        args.registries.plain_http_registries.clone(),
    )
    .await;
    let verification = model_decide::judge_oci(None, spec.mode, result);
    let verdict = decide::verdict(true, true, &verification);
    if verdict.usable {
        if spec.mode != VerificationMode::Disabled {
            term.err(&format!("verified: {}\n", verdict.message));
        }
        return Ok(None);
    }
    Ok(Some(format!("refused by {origin}: {}", verdict.message)))
}

/// Runs `cache model pull` of an `oci://` artifact (`registry/repo@sha256:...`).
async fn run_pull_oci(
    args: &PullArgs,
    reference: &str,
    state_dir: &Path,
    term: &mut Terminal,
) -> anyhow::Result<i32> {
    let model_id = args
        .model_id
        .clone()
        .unwrap_or_else(|| oci_model_id(reference));
    let model_id = RepoId::parse(&model_id)?;
    args.registries
        .allowed()
        .check(reference)
        .map_err(anyhow::Error::msg)?;
    let cache_dir = cache_dir(args)?;
    // The registry credentials Docker or Podman keep (as `cache build` and `cache verify`
    // read them); anonymous without.
    let auth = crate::trust::auth_for(reference)?;
    if let Some(refused) = refused_by_policy(args, reference, &auth, state_dir, term).await? {
        term.err(&format!("{reference}: {refused}; nothing pulled\n"));
        return Ok(crate::terminal::FAILURE);
    }
    term.err(&format!(
        "pulling {reference} as {model_id}@{} into {}\n",
        args.revision,
        cache_dir.display()
    ));
    let puller = Puller::new(auth, args.registries.plain_http_registries.clone());
    let inspected = puller.inspect_model(reference).await?;
    let target = Target {
        cache_dir: &cache_dir,
        model_id: &model_id,
        revision: &args.revision,
        limits: Limits::default(),
        check_space: true,
    };
    let report: ModelReport = puller.pull_model(&inspected, &target).await?;
    let pulled = PulledArtifact {
        reference,
        digest: &inspected.digest,
        model_id: model_id.as_str(),
        revision: &args.revision,
        commit: &report.commit,
        hf_hub_cache: &cache_dir,
        snapshot: &report.snapshot,
        files: report.files,
        bytes_total: report.bytes_total,
        bytes_received: report.bytes_received,
    };
    match args.output {
        Format::Json => term.out(&output::json(&pulled)?),
        Format::Yaml => term.out(&output::yaml(&pulled)?),
        Format::Table => term.out(&format!(
            "{reference}\n= {model_id}@{} (snapshot {})\n{} files, {} bytes ({} received)\nsnapshot: {}\nuse: HF_HUB_CACHE={} HF_HUB_OFFLINE=1 with the model id {model_id}\n",
            args.revision,
            report.commit,
            report.files,
            report.bytes_total,
            report.bytes_received,
            report.snapshot.display(),
            cache_dir.display(),
        )),
    }
    Ok(0)
}

/// Runs `cache model pull`.
pub async fn run_pull(
    args: &PullArgs,
    state_dir: &Path,
    term: &mut Terminal,
) -> anyhow::Result<i32> {
    let repo = match parse_source(&args.source)? {
        Source::Hf(repo) => repo,
        Source::Oci(reference) => {
            return run_pull_oci(args, &reference, state_dir, term).await;
        }
    };
    let token = args.token_file.as_deref().map(read_token).transpose()?;
    let hub = Hub::new(&HubOptions {
        endpoint: args.hf_endpoint.trim_end_matches('/').to_string(),
        token,
        ..HubOptions::default()
    })?;
    let cache_dir = cache_dir(args)?;
    term.err(&format!(
        "pulling {repo}@{} from {} into {}\n",
        args.revision,
        args.hf_endpoint,
        cache_dir.display()
    ));
    let options = PullOptions {
        include: args.include.clone(),
        parallel: usize::from(args.parallel),
        ..PullOptions::default()
    };
    let report = pull(&hub, &cache_dir, &repo, &args.revision, &options).await?;
    let pulled = Pulled {
        repo: &report.repo,
        revision: &report.revision,
        commit: &report.commit,
        hf_hub_cache: &report.cache_dir,
        snapshot: &report.snapshot,
        bytes_total: report.bytes_total,
        bytes_received: report.bytes_received,
        files: report
            .files
            .iter()
            .map(|f| PulledFile {
                path: &f.path,
                size: f.size,
                etag: &f.etag,
                received: f.received,
                cached: f.cached,
            })
            .collect(),
    };
    match args.output {
        Format::Json => term.out(&output::json(&pulled)?),
        Format::Yaml => term.out(&output::yaml(&pulled)?),
        Format::Table => term.out(&summary(&report)),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_name_hugging_face_repositories_or_pinned_oci_artifacts() {
        let hf = |s: &str| match parse_source(s).unwrap() {
            Source::Hf(repo) => repo.as_str().to_string(),
            Source::Oci(r) => panic!("{s}: {r}"),
        };
        assert_eq!(hf("hf://Qwen/Qwen3-0.6B"), "Qwen/Qwen3-0.6B");
        assert_eq!(hf("gpt2"), "gpt2");
        let digest = "a".repeat(64);
        assert_eq!(
            parse_source(&format!("oci://r:5000/acme/m@sha256:{digest}")).unwrap(),
            Source::Oci(format!("r:5000/acme/m@sha256:{digest}"))
        );
        for bad in [
            "oci://r/x",
            "oci://r/x:latest",
            "oci://@sha256:",
            "oci://r/x@sha256:AB",
        ] {
            assert!(
                parse_source(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("pinned"),
                "{bad}"
            );
        }
        assert!(
            parse_source("s3://b/k")
                .unwrap_err()
                .to_string()
                .contains("not supported")
        );
        assert!(parse_source("hf://../etc").is_err());
    }
}
