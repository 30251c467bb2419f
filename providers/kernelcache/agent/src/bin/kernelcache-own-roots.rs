//! `kernelcache-own-roots`: the agent's init container. Makes the cache roots (hostPath
//! directories) owned by the agent's non-root user, so that the agent itself runs without
//! root. See `kubeairunway_kernelcache_agent::owner`.

fn main() -> anyhow::Result<()> {
    let cli = <kubeairunway_kernelcache_agent::owner::Cli as clap::Parser>::parse();
    kubeairunway_sdk::process::init_logging(kubeairunway_sdk::process::LogFormat::Text);
    kubeairunway_kernelcache_agent::owner::run(&cli)
}
