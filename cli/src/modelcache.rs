//! `kubeairunway cache model pull`: the node agent's Hugging Face download code
//! (`kubeairunway-modelcache-hub`) run locally: the same cache layout, verification and
//! resume. The result is an `HF_HUB_CACHE` directory that vLLM, SGLang and TensorRT-LLM
//! read with `HF_HUB_OFFLINE=1`.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use kubeairunway_modelcache_hub::client::DEFAULT_ENDPOINT;
use kubeairunway_modelcache_hub::{Hub, HubOptions, PullOptions, PullReport, RepoId, pull};
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
    /// Download a Hugging Face model into a cache directory (the standard HF cache
    /// layout), verifying every file and resuming what an earlier run left unfinished.
    Pull(PullArgs),
}

/// `cache model pull`.
#[derive(Debug, clap::Args)]
pub struct PullArgs {
    /// The model: `hf://org/name` or `org/name`.
    pub source: String,
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

/// The repository a SOURCE names: `hf://org/name` or `org/name`.
pub fn parse_source(source: &str) -> anyhow::Result<RepoId> {
    let id = match source.split_once("://") {
        Some(("hf", rest)) => rest,
        Some((scheme, _)) => {
            anyhow::bail!("{scheme}:// sources are not supported yet (only hf://org/name)")
        }
        None => source,
    };
    Ok(RepoId::parse(id)?)
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

/// Runs `cache model pull`.
pub async fn run_pull(args: &PullArgs, term: &mut Terminal) -> anyhow::Result<i32> {
    let repo = parse_source(&args.source)?;
    let token = args.token_file.as_deref().map(read_token).transpose()?;
    let hub = Hub::new(&HubOptions {
        endpoint: args.hf_endpoint.trim_end_matches('/').to_string(),
        token,
        ..HubOptions::default()
    })?;
    std::fs::create_dir_all(&args.cache_dir)
        .with_context(|| format!("creating {}", args.cache_dir.display()))?;
    let cache_dir = std::fs::canonicalize(&args.cache_dir)
        .with_context(|| format!("resolving {}", args.cache_dir.display()))?;
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
    fn sources_name_hugging_face_repositories() {
        assert_eq!(
            parse_source("hf://Qwen/Qwen3-0.6B").unwrap().as_str(),
            "Qwen/Qwen3-0.6B"
        );
        assert_eq!(parse_source("gpt2").unwrap().as_str(), "gpt2");
        assert!(
            parse_source("oci://r/x")
                .unwrap_err()
                .to_string()
                .contains("not supported")
        );
        assert!(parse_source("hf://../etc").is_err());
    }
}
