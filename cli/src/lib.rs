//! # kubeairunway-cli
//!
//! The `kubeairunway` command (also the kubectl plugin `kubectl airunway`):
//!
//! - [`up`]: the whole platform on a cluster in one command: the local test API server
//!   (or `--kubeconfig`), the CRDs, core, every built-in provider and the kernel-cache
//!   controller in this process, the samples, and the live `kubectl get md` table;
//!   [`down`] stops what `up` started;
//! - [`render`]: offline, the exact objects a provider would apply for a ModelDeployment,
//!   through the code the runtime runs (selection, `Provider::render`,
//!   `render::finalize` against the upstream CRD schema);
//! - [`explain`]: why a ModelDeployment has its provider, and its state, in one screen;
//! - [`providers`]: the registered providers and how to install the missing ones;
//! - [`cache`]: `cache build` makes a kernel-cache image from a Triton or vLLM cache
//!   directory (packaged, pushed, signed), `cache verify` gives the kernel-cache
//!   controller's verdict on an image under the cluster's policy.
//!
//! Each subcommand is one module with an `Args` struct and a `run` function; a new
//! subcommand is one more module and one more [`Command`] variant.

pub mod builtin;
pub mod cache;
pub mod cluster;
pub mod controllers;
pub mod convert;
pub mod crds;
pub mod dashboard;
pub mod down;
pub mod explain;
pub mod logging;
pub mod manifest;
pub mod modelcache;
pub mod output;
pub mod providers;
pub mod render;
pub mod terminal;
pub mod trust;
pub mod up;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};

pub use terminal::{FAILURE, Terminal};

/// `kubeairunway`: run, preview and explain kubeairunway deployments.
#[derive(Debug, Parser)]
#[command(
    name = "kubeairunway",
    version,
    about = "Run, preview and explain kubeairunway ModelDeployments",
    long_about = "Run the whole platform locally (`up`), preview the exact upstream objects a provider applies (`render`), explain a ModelDeployment (`explain`), and build and verify kernel-cache images (`cache`).\n\nAlso a kubectl plugin: install the `kubectl-airunway` binary on your PATH and run `kubectl airunway ...`."
)]
pub struct Cli {
    /// Where `up` keeps its state: the local API server, the log file, the pid of a
    /// running `up`.
    #[arg(
        long,
        global = true,
        env = "KUBEAIRUNWAY_STATE_DIR",
        value_name = "DIR",
        default_value_os_t = cluster::default_state_dir()
    )]
    pub state_dir: PathBuf,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the platform: API server (local unless --kubeconfig), CRDs, core, every
    /// provider, the kernel-cache controller and the samples, with a live table.
    Up(up::Args),
    /// Stop what `up` started: a running `up` and the local API server.
    Down(down::Args),
    /// Print the upstream objects a provider would apply for a ModelDeployment (offline).
    Render(render::Args),
    /// Convert AI Runway's airunway.ai/v1alpha1 ModelDeployments and
    /// InferenceProviderConfigs to ours, naming what does not carry over.
    Convert(convert::Args),
    /// Explain a ModelDeployment: why its provider, its status, events and upstream object.
    Explain(explain::Args),
    /// Serve the web dashboard on a loopback address, acting with your kubeconfig (or, with
    /// --in-cluster, as each user signed in with their own token).
    Dashboard(dashboard::Args),
    /// List the registered providers, their health, and how to install missing ones.
    Providers(providers::Args),
    /// Kernel-cache images (build, verify) and model caches (`cache model pull`).
    Cache(cache::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// The program's name as invoked: `kubectl airunway` for the plugin binary.
fn bin_name(argv0: Option<&OsString>) -> &'static str {
    let plugin = argv0
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("kubectl-"));
    if plugin {
        "kubectl airunway"
    } else {
        "kubeairunway"
    }
}

/// Parse `args` (the first is the program name) and run the command; returns the exit
/// code. Output goes to `term`, so that tests and other programs can capture it.
pub async fn run(args: Vec<OsString>, term: &mut Terminal) -> i32 {
    kubeairunway_testcluster::install_crypto_provider();
    let name = bin_name(args.first());
    let command = Cli::command().bin_name(name);
    let cli = match command
        .try_get_matches_from(&args)
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => {
            let code = e.exit_code();
            let text = e.render().to_string();
            if e.use_stderr() {
                term.err(&text);
            } else {
                term.out(&text);
            }
            return code;
        }
    };
    let result = match cli.command {
        Command::Up(a) => up::run(a, &cli.state_dir, term).await,
        Command::Down(a) => down::run(&a, &cli.state_dir, term),
        Command::Render(a) => render::run(&a, term),
        Command::Convert(a) => convert::run(&a, term),
        Command::Explain(a) => explain::run(a, &cli.state_dir, term).await,
        Command::Dashboard(a) => dashboard::run(a, &cli.state_dir, term).await,
        Command::Providers(a) => providers::run(a, &cli.state_dir, term).await,
        Command::Cache(cache::Args {
            command: cache::Command::Build(a),
        }) => cache::run_build(&a, term).await,
        Command::Cache(cache::Args {
            command: cache::Command::Verify(a),
        }) => cache::run_verify(&a, &cli.state_dir, term).await,
        Command::Cache(cache::Args {
            command:
                cache::Command::Model(modelcache::Args {
                    command: modelcache::Command::Pull(a),
                }),
        }) => modelcache::run_pull(&a, &cli.state_dir, term).await,
        Command::Completion { shell } => {
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), name, &mut buf);
            term.out(&String::from_utf8_lossy(&buf));
            Ok(0)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            term.err(&format!("error: {e:#}\n"));
            FAILURE
        }
    }
}

/// The whole `main` of both binaries.
pub async fn main() -> std::process::ExitCode {
    let mut term = Terminal::stdio();
    let code = run(std::env::args_os().collect(), &mut term).await;
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_plugin_binary_names_itself_as_kubectl_does() {
        assert_eq!(
            bin_name(Some(&OsString::from("/usr/local/bin/kubectl-airunway"))),
            "kubectl airunway"
        );
        assert_eq!(
            bin_name(Some(&OsString::from("target/debug/kubeairunway"))),
            "kubeairunway"
        );
    }

    #[tokio::test]
    async fn cache_model_pull_fills_a_cache_and_says_where_it_is() {
        // `modelcache::run_pull` through the command line, against the hub's stand-in.
        use kubeairunway_modelcache_hub::testing::{StandIn, StandInFile, commit_id};
        let stand_in = StandIn::start().await;
        let commit = commit_id("cli");
        let files = vec![
            StandInFile::regular("config.json", b"{}\n"),
            StandInFile::lfs("model.safetensors", &[7u8; 4096]),
        ];
        stand_in.commit("acme/m", "main", &commit, files.clone());
        stand_in.gate("acme/m", "hf_ok");
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("hub");
        let token = dir.path().join("token");
        let argv = |extra: &[&str]| -> Vec<std::ffi::OsString> {
            let mut a: Vec<std::ffi::OsString> = [
                "kubeairunway",
                "cache",
                "model",
                "pull",
                "hf://acme/m",
                "--cache-dir",
            ]
            .into_iter()
            .map(Into::into)
            .collect();
            a.push(cache.clone().into());
            a.extend(["--hf-endpoint", stand_in.url.as_str()].map(Into::into));
            a.extend(extra.iter().map(Into::into));
            a
        };

        let (mut term, captured) = Terminal::capture();
        assert_eq!(run(argv(&[]), &mut term).await, 1);
        assert!(captured.err().contains("gated"), "{}", captured.err());

        std::fs::write(&token, "hf_ok\n").unwrap();
        let token = token.to_str().unwrap().to_string();
        let (mut term, captured) = Terminal::capture();
        assert_eq!(
            run(argv(&["--token-file", &token]), &mut term).await,
            0,
            "{}",
            captured.err()
        );
        let out = captured.out();
        assert!(out.contains(&format!("commit {commit}")), "{out}");
        assert!(out.contains("2 files, 4099 bytes (4099 received)"), "{out}");
        assert!(
            out.contains(&format!(
                "HF_HUB_CACHE={}",
                cache.canonicalize().unwrap().display()
            )),
            "{out}"
        );
        let snapshot = cache.join(format!("models--acme--m/snapshots/{commit}"));
        assert_eq!(
            std::fs::read(snapshot.join("config.json")).unwrap(),
            b"{}\n"
        );
        assert_eq!(
            std::fs::read(snapshot.join("model.safetensors")).unwrap(),
            vec![7u8; 4096]
        );

        let (mut term, captured) = Terminal::capture();
        assert_eq!(
            run(argv(&["--token-file", &token, "-o", "json"]), &mut term).await,
            0
        );
        let json: serde_json::Value = serde_json::from_str(&captured.out()).unwrap();
        assert_eq!(json["commit"], commit.as_str());
        assert_eq!(json["bytesReceived"], 0);
    }
}
