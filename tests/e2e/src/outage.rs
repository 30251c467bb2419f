//! A loopback TCP proxy in front of the API server that can be taken down: while it is
//! down it cuts every open connection and closes each new one at once, which is what a
//! client sees of an API server that is not running, and counts those connection
//! attempts, so a test can tell a controller that backs off from one that spins. It also
//! keeps the most connections that were open through it at once: how many requests a
//! client had in flight together (HTTP/1.1 carries one at a time per connection).
//!
//! TLS passes through untouched: the test API server's certificate names 127.0.0.1, which
//! the proxy also listens on.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy. Dropping it stops it.
#[derive(Debug)]
pub struct Outage {
    addr: SocketAddr,
    down: Arc<AtomicBool>,
    attempts_while_down: Arc<AtomicUsize>,
    /// Connections open now, and the most open at once.
    open: Arc<(AtomicUsize, AtomicUsize)>,
    /// Bumped when the proxy goes down: every forwarding task ends.
    epoch: watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Outage {
    fn drop(&mut self) {
        self.accept.abort();
        self.epoch.send_modify(|e| *e += 1);
    }
}

impl Outage {
    /// Start forwarding to `upstream` (an `https://127.0.0.1:PORT` API server URL).
    pub async fn start(upstream: &str) -> anyhow::Result<Self> {
        let upstream: SocketAddr = upstream
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .parse()?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let down = Arc::new(AtomicBool::new(false));
        let attempts_while_down = Arc::new(AtomicUsize::new(0));
        let open = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let (epoch, _) = watch::channel(0u64);
        let accept = tokio::spawn({
            let (down, attempts, epoch, open) = (
                down.clone(),
                attempts_while_down.clone(),
                epoch.clone(),
                open.clone(),
            );
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    if down.load(Ordering::SeqCst) {
                        attempts.fetch_add(1, Ordering::SeqCst);
                        drop(client);
                        continue;
                    }
                    let mut cut = epoch.subscribe();
                    let open = open.clone();
                    tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let _counted = Counted::new(open);
                        let mut client = client;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = cut.changed() => {}
                        }
                    });
                }
            }
        });
        Ok(Self {
            addr,
            down,
            attempts_while_down,
            open,
            epoch,
            accept,
        })
    }

    /// The proxy's `https://` URL.
    pub fn server(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Write a copy of `kubeconfig` (pointing at `server`) that points at the proxy.
    pub fn kubeconfig(&self, kubeconfig: &Path, server: &str, out: &Path) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(kubeconfig)?;
        anyhow::ensure!(text.contains(server), "{server} is not in the kubeconfig");
        std::fs::write(out, text.replace(server, &self.server()))?;
        Ok(())
    }

    /// Take the API server away (cutting every open connection) or bring it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            self.epoch.send_modify(|e| *e += 1);
        }
    }

    /// Connections attempted while the proxy was down.
    pub fn attempts_while_down(&self) -> usize {
        self.attempts_while_down.load(Ordering::SeqCst)
    }

    /// The most connections that were open through the proxy at once.
    pub fn most_open(&self) -> usize {
        self.open.1.load(Ordering::SeqCst)
    }
}

/// One forwarded connection, counted while it is open.
struct Counted(Arc<(AtomicUsize, AtomicUsize)>);

impl Counted {
    fn new(open: Arc<(AtomicUsize, AtomicUsize)>) -> Self {
        let now = open.0.fetch_add(1, Ordering::SeqCst) + 1;
        open.1.fetch_max(now, Ordering::SeqCst);
        Self(open)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}
