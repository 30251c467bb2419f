//! `kubeairunway-config`: generate `config/`, check it, or apply it to a cluster.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::ApiResource;
use kube::{Client, Config};
use kubeairunway_config::{
    REGENERATE, core_crds, generate, orphaned_files, repo_root, samples, stale_files,
};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_testcluster::{
    Lifetime, TestCluster, cache_dir, install_crds, install_crypto_provider,
};

#[derive(Parser)]
#[command(about = "Generate, check and apply kubeairunway's generated manifests")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write every generated file under the repository root.
    Gen,
    /// Fail when a generated file is stale.
    Check,
    /// Apply the CRDs and the valid samples to a cluster: the local test API server
    /// (started if needed) unless --kubeconfig is given.
    Apply {
        /// Kubeconfig of the target cluster.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = repo_root();
    match cli.command {
        Cmd::Gen => {
            for file in generate()? {
                let path = root.join(&file.path);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                if std::fs::read_to_string(&path).ok().as_deref() != Some(file.content.as_str()) {
                    std::fs::write(&path, &file.content)?;
                    println!("wrote {}", file.path);
                }
            }
            for path in orphaned_files(&root)? {
                std::fs::remove_file(root.join(&path))?;
                println!("removed {path}");
            }
        }
        Cmd::Check => {
            let mut stale = stale_files(&root)?;
            stale.extend(orphaned_files(&root)?);
            if !stale.is_empty() {
                anyhow::bail!("stale generated files: {stale:?}; run `{REGENERATE}`");
            }
            println!("generated files are up to date");
        }
        Cmd::Apply { kubeconfig } => apply(kubeconfig).await?,
    }
    Ok(())
}

async fn apply(kubeconfig: Option<PathBuf>) -> anyhow::Result<()> {
    install_crypto_provider();
    let kubeconfig = if let Some(path) = kubeconfig {
        path
    } else {
        local_cluster().await?
    };
    let client = client(&kubeconfig).await?;
    install_crds(&client, &core_crds()).await?;
    println!(
        "CRDs established: {}",
        core_crds()
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let ar = ApiResource::erase::<ModelDeployment>(&());
    let pp = PatchParams::apply("kubeairunway-config");
    for sample in samples::all().into_iter().filter(|s| s.rejection.is_none()) {
        let obj: DynamicObject = serde_json::from_value(sample.manifest.clone())?;
        let ns = obj
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = obj.metadata.name.clone().context("sample without a name")?;
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
        api.patch(&name, &pp, &Patch::Apply(&obj))
            .await
            .with_context(|| format!("applying sample {}", sample.name))?;
        println!(
            "modeldeployment.kubeairunway.ai/{name} applied in {ns} ({})",
            sample.path()
        );
    }
    Ok(())
}

/// The kubeconfig of the local test API server, started (detached) unless it runs.
async fn local_cluster() -> anyhow::Result<PathBuf> {
    let dir = cache_dir().join("dev");
    let kubeconfig = dir.join("kubeconfig");
    if !(kubeconfig.exists() && reachable(&kubeconfig).await) {
        let cluster = TestCluster::start(&dir, Lifetime::Detached)?;
        eprintln!("started the local API server at {}", cluster.server());
    }
    eprintln!(
        "local cluster: export KUBECONFIG={}  (stop it: cargo run -q -p kubeairunway-testcluster -- down)",
        kubeconfig.display()
    );
    Ok(kubeconfig)
}

async fn reachable(kubeconfig: &std::path::Path) -> bool {
    let Ok(client) = client(kubeconfig).await else {
        return false;
    };
    tokio::time::timeout(Duration::from_secs(3), client.apiserver_version())
        .await
        .is_ok_and(|r| r.is_ok())
}

async fn client(kubeconfig: &std::path::Path) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}
