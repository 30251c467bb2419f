//! A real Kubernetes API server on loopback for integration tests.
//!
//! [`TestCluster::start`] runs etcd and `kubeairunway-apiserver` (`go/`, built once by
//! `build.sh` from PyPI and Debian packages and cached in the user cache directory) on
//! free loopback ports, with certificates of its own. One process serves, from etcd,
//! with the upstream code kube-apiserver is built from:
//!
//! - CRDs and custom resources (`k8s.io/apiextensions-apiserver`: schemas, CEL
//!   validation, defaulting, status subresources, conversion webhooks);
//! - the built-in kinds the platform uses, through `k8s.io/apiserver`'s generic
//!   registry: core/v1 namespaces, pods, secrets, configmaps, services, nodes, events,
//!   serviceaccounts, persistentvolumeclaims, persistentvolumes; apps/v1 deployments,
//!   daemonsets, statefulsets, replicasets; batch/v1 jobs; coordination.k8s.io/v1 leases;
//!   events.k8s.io/v1 events; admissionregistration.k8s.io/v1 validating and mutating
//!   webhook configurations, validating admission policies and their bindings;
//!   discovery.k8s.io/v1 endpointslices;
//!   rbac.authorization.k8s.io/v1 roles, rolebindings, clusterroles, clusterrolebindings;
//!   autoscaling/v2 horizontalpodautoscalers; policy/v1 poddisruptionbudgets; with status
//!   subresources, strategic-merge
//!   patch, server-side apply merging lists by their real keys, watches, and kube's field
//!   selectors (`spec.nodeName`, `metadata.name`, ...);
//! - kube-apiserver's admission chain on all of them: NamespaceLifecycle (objects go into
//!   namespaces that exist and are not terminating: [`TestCluster::namespace`] creates
//!   one), MutatingAdmissionWebhook, ValidatingAdmissionPolicy and
//!   ValidatingAdmissionWebhook reading the served webhook configurations, policies and
//!   bindings. A service reference resolves through the Service and its
//!   EndpointSlices, as kube-apiserver does with `--enable-aggregator-routing`: a test
//!   serving a webhook on `127.0.0.1:<port>` registers it with
//!   [`TestCluster::route_service`]. The caBundle is verified against the server name
//!   `<service>.<namespace>.svc`;
//! - an audit log of every request with its user ([`TestCluster::audit_events`]); give
//!   each component its own identity with [`TestCluster::client_as`] or
//!   [`TestCluster::kubeconfig_as`] (client certificates), or as a pod's service account
//!   bound to its pod and node with [`TestCluster::client_for_pod`] (a stand-in for bound
//!   service-account tokens, `go/tokens.go`);
//! - RBAC authorization as kube-apiserver's `--authorization-mode=RBAC` ([`Authorization`]:
//!   `system:masters`, the admin kubeconfig's group, is always allowed), with the escalation
//!   checks on writes of Roles and bindings, and SubjectAccessReviews answered by it.
//!
//! What it does not do, compared with kube-apiserver: no validation or defaulting of
//! built-in kinds (they live in k8s.io/kubernetes, which Debian does not package; object
//! metadata is validated), and no controllers, kubelet or scheduler: tests write Pod, Job,
//! Deployment, DaemonSet and Node status themselves, as envtest users do, nothing
//! garbage-collects owned objects, and a deleted namespace stays Terminating. core/v1 and
//! events.k8s.io/v1 Events are stored apart.
//!
//! The servers are tied to the process that started them: each runs under a small shell
//! watchdog that stops it when the test process's end of a pipe closes, however the
//! process ends. [`shared`] gives every test of one test binary the same cluster; tests
//! keep apart by namespace ([`TestCluster::namespace`]).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use std::{fs, thread};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

pub mod audit;
pub mod pki;
pub mod registry;
pub mod routing;

pub use audit::AuditEvent;

/// Name of the API server binary that `build.sh` produces.
pub const APISERVER_BIN: &str = "kubeairunway-apiserver";

/// How a started cluster ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Stopped when the starting process exits (tests).
    TiedToProcess,
    /// Runs until [`stop_detached`] (a developer's local cluster).
    Detached,
}

/// How the API server authorizes requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Authorization {
    /// As kube-apiserver's `--authorization-mode=RBAC`: a request is allowed when a Role or
    /// ClusterRole bound to its user or one of its groups allows it; `system:masters` (the
    /// admin kubeconfig) is always allowed. The default.
    #[default]
    Rbac,
    /// Every request is allowed.
    AlwaysAllow,
}

impl Authorization {
    /// The `--authorization-mode` value of the API server.
    pub fn mode(self) -> &'static str {
        match self {
            Self::Rbac => "RBAC",
            Self::AlwaysAllow => "AlwaysAllow",
        }
    }

    /// [`Authorization::Rbac`] unless `KUBEAIRUNWAY_TESTCLUSTER_AUTHORIZATION` is
    /// `AlwaysAllow` (to tell whether a failing test fails on a permission, say).
    pub fn from_env() -> Self {
        match std::env::var("KUBEAIRUNWAY_TESTCLUSTER_AUTHORIZATION").as_deref() {
            Ok("AlwaysAllow") => Self::AlwaysAllow,
            _ => Self::Rbac,
        }
    }
}

/// A running etcd + API server pair.
#[derive(Debug)]
pub struct TestCluster {
    dir: PathBuf,
    server: String,
    kubeconfig: PathBuf,
    etcd_port: u16,
    processes: Vec<Child>,
    lifetime: Lifetime,
}

static NAMESPACE_SEQ: AtomicU32 = AtomicU32::new(0);
static TOKEN_SEQ: AtomicU32 = AtomicU32::new(0);

/// The server's bound service-account tokens file, in the cluster directory (`go/tokens.go`).
const BOUND_TOKENS: &str = "bound-tokens.csv";

impl TestCluster {
    /// Start a cluster in `dir` (created; its previous content is removed), authorizing
    /// requests as [`Authorization::from_env`] says.
    pub fn start(dir: &Path, lifetime: Lifetime) -> anyhow::Result<Self> {
        Self::start_with(dir, lifetime, Authorization::from_env())
    }

    /// Start a cluster in `dir` that authorizes requests as `authorization` says.
    pub fn start_with(
        dir: &Path,
        lifetime: Lifetime,
        authorization: Authorization,
    ) -> anyhow::Result<Self> {
        Self::start_with_args(dir, lifetime, authorization, &[])
    }

    /// [`TestCluster::start_with`], the API server given `extra` flags too (e.g.
    /// `--admission-control-config-file=...`).
    pub fn start_with_args(
        dir: &Path,
        lifetime: Lifetime,
        authorization: Authorization,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let bin = binaries()?;
        let mut last_err = None;
        for _ in 0..3 {
            match Self::start_once(&bin, dir, lifetime, authorization, extra) {
                Ok(c) => return Ok(c),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("cluster did not start")))
    }

    fn start_once(
        bin: &Path,
        dir: &Path,
        lifetime: Lifetime,
        authorization: Authorization,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| format!("cleaning {}", dir.display()))?;
        }
        let pki_dir = dir.join("pki");
        pki::generate(&pki_dir)?;
        let [etcd_client, etcd_peer, api_port] = free_ports()?;
        let mut cluster = TestCluster {
            dir: dir.to_path_buf(),
            server: format!("https://127.0.0.1:{api_port}"),
            kubeconfig: dir.join("kubeconfig"),
            etcd_port: etcd_client,
            processes: Vec::new(),
            lifetime,
        };

        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        cluster.spawn(
            "etcd",
            &bin.join("etcd"),
            &[
                "--name=testcluster".into(),
                format!("--data-dir={}", dir.join("etcd-data").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=testcluster={peer_url}"),
                "--initial-cluster-state=new".into(),
                "--unsafe-no-fsync".into(),
                // One member elects itself at once; etcd's defaults (100 ms heartbeats, a 1 s
                // election timeout) made it take 0.1-0.8 s of every start.
                "--heartbeat-interval=10".into(),
                "--election-timeout=100".into(),
                "--log-level=warn".into(),
            ],
        )?;
        cluster.wait_until("etcd", Duration::from_secs(60), || {
            etcd_healthy(etcd_client)
        })?;

        fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY)?;
        fs::write(dir.join(BOUND_TOKENS), "")?;
        let mut args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--tls-cert-file={}", pki_dir.join("server.crt").display()),
            format!(
                "--tls-private-key-file={}",
                pki_dir.join("server.key").display()
            ),
            format!("--client-ca-file={}", pki_dir.join("ca.crt").display()),
            format!("--cert-dir={}", pki_dir.display()),
            format!("--audit-log-path={}", dir.join("audit.log").display()),
            format!(
                "--audit-policy-file={}",
                dir.join("audit-policy.yaml").display()
            ),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
            format!("--authorization-mode={}", authorization.mode()),
            format!(
                "--bound-service-account-tokens-file={}",
                dir.join(BOUND_TOKENS).display()
            ),
        ];
        args.extend(extra.iter().cloned());
        cluster.spawn("apiserver", &bin.join(APISERVER_BIN), &args)?;
        fs::write(
            &cluster.kubeconfig,
            cluster.kubeconfig_yaml(&pki_dir.join("admin.crt"), &pki_dir.join("admin.key")),
        )?;
        let kubeconfig = cluster.kubeconfig.clone();
        cluster.wait_until("apiserver", Duration::from_secs(90), || {
            let kubeconfig = kubeconfig.clone();
            block_on(async move {
                let client = client_from(&kubeconfig).await.ok()?;
                let req = http::Request::get("/readyz").body(Vec::new()).ok()?;
                client.request_text(req).await.ok()
            })
            .is_some_and(|body| body.trim() == "ok")
        })?;
        fs::write(dir.join("env"), cluster.env_lines())?;
        Ok(cluster)
    }

    fn spawn(&mut self, name: &str, program: &Path, args: &[String]) -> anyhow::Result<()> {
        let log = fs::File::create(self.dir.join(format!("{name}.log")))?;
        let child = match self.lifetime {
            // The watchdog stops the server when our end of its stdin closes (SIGTERM, then
            // SIGKILL after 3 s: open watches of a blocked test runtime must not hold a
            // graceful shutdown), and exits when the server exits, so a crash is visible
            // through `try_wait`.
            Lifetime::TiedToProcess => Command::new("sh")
                .arg("-c")
                .arg(r#"exec 3<&0; "$@" </dev/null & pid=$!; (cat <&3 >/dev/null; kill -TERM $pid 2>/dev/null; sleep 3; kill -KILL $pid 2>/dev/null) & exec 3<&-; wait $pid"#)
                .arg("watchdog")
                .arg(program)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn(),
            Lifetime::Detached => {
                use std::os::unix::process::CommandExt;
                Command::new(program)
                    .args(args)
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .process_group(0)
                    .spawn()
            }
        }
        .with_context(|| format!("starting {}", program.display()))?;
        fs::write(self.dir.join(format!("{name}.pid")), child.id().to_string())?;
        self.processes.push(child);
        Ok(())
    }

    fn wait_until(
        &mut self,
        name: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return Ok(());
            }
            if let Some(p) = self.processes.last_mut()
                && let Some(status) = p.try_wait()?
            {
                bail!("{name} exited ({status}): {}", self.log_tail(name));
            }
            if Instant::now() > deadline {
                bail!(
                    "{name} not ready after {timeout:?}: {}",
                    self.log_tail(name)
                );
            }
            // Short: every test process waits here for its server (each poll is cheap).
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_tail(&self, name: &str) -> String {
        let log = fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    }

    fn kubeconfig_yaml(&self, cert: &Path, key: &Path) -> String {
        self.kubeconfig_with_user(&format!(
            "    client-certificate: {}\n    client-key: {}\n",
            cert.display(),
            key.display()
        ))
    }

    /// A kubeconfig for the server whose user is `user` (the indented fields of `user:`).
    fn kubeconfig_with_user(&self, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testcluster\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: user\n  user:\n{user}contexts:\n- name: testcluster\n  context:\n    cluster: testcluster\n    user: user\n    namespace: default\ncurrent-context: testcluster\n",
            server = self.server,
            ca = self.dir.join("pki").join("ca.crt").display(),
        )
    }

    /// A client bearing the token the kubelet would mount into `pod` (as the server
    /// returned it: its namespace, UID, `spec.serviceAccountName` or `default`, and
    /// `spec.nodeName`): the API server authenticates it as the pod's service account with
    /// the pod and its node in the user's extra (`authentication.kubernetes.io/pod-name`,
    /// `pod-uid`, `node-name`, `node-uid` when the Node exists), as kube-apiserver does a
    /// bound service-account token. A stand-in (`go/tokens.go`): the token is an opaque
    /// line of the server's tokens file, not a signed JWT, and not secret.
    pub async fn client_for_pod(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
    ) -> anyhow::Result<Client> {
        let token = self.token_for_pod(pod).await?;
        let path = self.dir.join(format!("{token}.kubeconfig"));
        fs::write(
            &path,
            self.kubeconfig_with_user(&format!("    token: {token}\n")),
        )?;
        client_from(&path).await
    }

    /// The bearer token of [`Self::client_for_pod`] itself (as a user would paste one).
    pub async fn token_for_pod(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
    ) -> anyhow::Result<String> {
        let meta = &pod.metadata;
        let spec = pod.spec.clone().unwrap_or_default();
        let namespace = meta.namespace.clone().context("the pod has a namespace")?;
        let account = spec
            .service_account_name
            .unwrap_or_else(|| "default".into());
        let node = spec.node_name.unwrap_or_default();
        let node_uid = if node.is_empty() {
            String::new()
        } else {
            Api::<k8s_openapi::api::core::v1::Node>::all(self.client().await?)
                .get_opt(&node)
                .await?
                .and_then(|n| n.metadata.uid)
                .unwrap_or_default()
        };
        let seq = TOKEN_SEQ.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let token = format!("bound-{}-{seq}-{nanos}", std::process::id());
        let line = [
            token.as_str(),
            &namespace,
            &account,
            meta.name.as_deref().unwrap_or_default(),
            meta.uid.as_deref().unwrap_or_default(),
            &node,
            &node_uid,
        ]
        .join(",");
        let mut tokens = fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join(BOUND_TOKENS))?;
        writeln!(tokens, "{line}")?;
        Ok(token)
    }

    /// The CA bundle the API server's certificate is signed by.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("pki").join("ca.crt")
    }

    fn env_lines(&self) -> String {
        format!(
            "export KUBECONFIG={}\nexport TESTCLUSTER_SERVER={}\nexport TESTCLUSTER_DIR={}\n",
            self.kubeconfig.display(),
            self.server,
            self.dir.display()
        )
    }

    /// Drop the store's history up to now and give its space back (etcd's compaction,
    /// then defragmentation): what a long-running cluster's periodic compaction keeps it
    /// at. Benchmarks call it between phases so that each starts from the same store, not
    /// one holding the previous phase's deleted objects.
    pub fn compact_store(&self) -> anyhow::Result<()> {
        let head = etcd_post(
            self.etcd_port,
            "/v3/kv/range",
            r#"{"key":"AA==","limit":1}"#,
        )?;
        let revision = head["header"]["revision"]
            .as_str()
            .context("etcd's answer has no revision")?
            .to_string();
        let compaction = serde_json::json!({"revision": revision, "physical": true});
        etcd_post(self.etcd_port, "/v3/kv/compaction", &compaction.to_string())?;
        etcd_post(self.etcd_port, "/v3/maintenance/defragment", "{}")?;
        Ok(())
    }

    /// etcd's client URL (plain HTTP on loopback; its JSON gateway answers under `/v3/`),
    /// for tests that look at the store beneath the API server.
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_port)
    }

    /// The API server URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Path of a kubeconfig for this cluster (admin, `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory holding certificates, logs and etcd data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `export` lines for a shell (`KUBECONFIG`, `TESTCLUSTER_SERVER`, `TESTCLUSTER_DIR`).
    pub fn env(&self) -> String {
        self.env_lines()
    }

    /// A new client for this cluster. Create one per test: a client is bound to the
    /// async runtime it first connects from.
    pub async fn client(&self) -> anyhow::Result<Client> {
        client_from(&self.kubeconfig).await
    }

    /// A new namespace, created in the cluster, with a name unique to this process and
    /// call that starts with `prefix`. (NamespaceLifecycle admission refuses objects in a
    /// namespace that does not exist.)
    pub fn namespace(&self, prefix: &str) -> String {
        let n = NAMESPACE_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        self.ensure_namespace(&name);
        name
    }

    /// Create the namespace `name` unless it exists (a test that uses a fixed namespace
    /// name does what a user would do first: `kubectl create namespace`).
    pub fn ensure_namespace(&self, name: &str) {
        let kubeconfig = self.kubeconfig.clone();
        let ns = name.to_string();
        block_on(async move { ensure_namespace(&client_from(&kubeconfig).await?, &ns).await })
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// A kubeconfig (written under the cluster directory) that authenticates as `user`,
    /// in `group` when given, with a client certificate of its own: for a component
    /// started as a process. The audit log shows its requests under that user.
    pub fn kubeconfig_as(&self, user: &str, group: Option<&str>) -> anyhow::Result<PathBuf> {
        let stem: String = user
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let (cert, key) = pki::issue_client(&self.dir.join("pki"), &stem, user, group)?;
        let path = self.dir.join(format!("{stem}.kubeconfig"));
        fs::write(&path, self.kubeconfig_yaml(&cert, &key))?;
        Ok(path)
    }

    /// A client that authenticates as `user` (see [`TestCluster::kubeconfig_as`]).
    pub async fn client_as(&self, user: &str, group: Option<&str>) -> anyhow::Result<Client> {
        client_from(&self.kubeconfig_as(user, group)?).await
    }

    /// A client that authenticates as the service account `namespace/name`, as a pod
    /// running under it would (user `system:serviceaccount:<namespace>:<name>`).
    pub async fn client_as_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<Client> {
        self.client_as(
            &service_account_user(namespace, name),
            Some("system:serviceaccounts"),
        )
        .await
    }

    /// Route port `port` of the Service `namespace/name` to `127.0.0.1:<target>`, the
    /// way the EndpointSlice controller routes a Service to a ready pod: the API server
    /// then calls a webhook registered with that service reference on the loopback
    /// address. Creates the Service when it does not exist (a chart's Service can be
    /// applied first) and replaces the slice.
    pub async fn route_service(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
        port: u16,
        target: u16,
    ) -> anyhow::Result<()> {
        routing::route_service(client, namespace, name, port, target).await
    }

    /// Every request the API server has recorded so far (its audit log).
    pub fn audit_events(&self) -> anyhow::Result<Vec<AuditEvent>> {
        audit::read(&self.dir.join("audit.log"))
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if self.lifetime == Lifetime::Detached {
            return;
        }
        // Closing stdin makes each watchdog stop its server; then reap it. The API
        // server goes first, etcd after it.
        for child in self.processes.iter_mut().rev() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

async fn client_from(kubeconfig: &Path) -> anyhow::Result<Client> {
    install_crypto_provider();
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Run a future to completion on a fresh single-threaded runtime in its own thread, so
/// that it works from sync code and from inside another runtime alike.
fn block_on<T: Send + 'static>(fut: impl std::future::Future<Output = T> + Send + 'static) -> T {
    thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|rt| rt.block_on(fut))
    })
    .join()
    .map_err(|_| ())
    .and_then(|r| r.map_err(|_| ()))
    .unwrap_or_else(|()| panic!("cluster readiness probe thread failed"))
}

/// Install rustls's ring provider as the process default (idempotent). kube and the
/// test servers all use it.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn free_ports() -> anyhow::Result<[u16; 3]> {
    let listeners = [
        TcpListener::bind("127.0.0.1:0")?,
        TcpListener::bind("127.0.0.1:0")?,
        TcpListener::bind("127.0.0.1:0")?,
    ];
    Ok([
        listeners[0].local_addr()?.port(),
        listeners[1].local_addr()?.port(),
        listeners[2].local_addr()?.port(),
    ])
}

fn etcd_healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

/// POST `body` to etcd's JSON gateway (plain HTTP on loopback; one request, so a
/// hand-written HTTP/1.0 exchange like [`etcd_healthy`]'s rather than a client library).
fn etcd_post(port: u16, path: &str, body: &str) -> anyhow::Result<serde_json::Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).context("connecting to etcd")?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(
        s,
        "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let (head, json) = answer
        .split_once("\r\n\r\n")
        .context("etcd's answer has no body")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!("etcd refused {path}: {head} {json}");
    }
    serde_json::from_str(json).with_context(|| format!("etcd's answer to {path}: {json}"))
}

/// The cache directory for binaries and run directories.
pub fn cache_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("KUBEAIRUNWAY_TESTCLUSTER_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("kubeairunway").join("testcluster")
}

/// The directory holding `etcd` and the API server of [`cache_dir`], building them with
/// `build.sh` first when they are missing or older than the server's sources (5-9
/// minutes cold, seconds when only a check is needed).
pub fn binaries() -> anyhow::Result<PathBuf> {
    let bin = cache_dir().join("bin");
    if bin.join("etcd").is_file() && !server_outdated(&bin.join(APISERVER_BIN)) {
        return Ok(bin);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("build.sh");
    let status = Command::new("bash")
        .arg(&script)
        .env("KUBEAIRUNWAY_TESTCLUSTER_CACHE", cache_dir())
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() {
        bail!("{} failed ({status})", script.display());
    }
    Ok(bin)
}

/// Whether the API server binary is missing or older than one of its sources (`go/`,
/// `packages.txt`, `build.sh`). build.sh touches an up-to-date binary, so a fresh
/// checkout costs one quick run of it.
fn server_outdated(server: &Path) -> bool {
    let Ok(built) = fs::metadata(server).and_then(|m| m.modified()) else {
        return true;
    };
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = vec![here.join("packages.txt"), here.join("build.sh")];
    if let Ok(entries) = fs::read_dir(here.join("go")) {
        sources.extend(entries.flatten().map(|e| e.path()));
    }
    sources.iter().any(|source| {
        fs::metadata(source)
            .and_then(|m| m.modified())
            .is_ok_and(|changed| changed > built)
    })
}

/// The user name of the service account `namespace/name`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The audit policy: every request at the Metadata level (user, verb, resource,
/// namespace, name, subresource, response code), once it completes.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n";

/// The cluster shared by every test of this process, started on first use in a run
/// directory of the cache (stale ones of dead processes are removed first).
pub fn shared() -> &'static TestCluster {
    static SHARED: OnceLock<TestCluster> = OnceLock::new();
    SHARED.get_or_init(|| {
        let runs = cache_dir().join("runs");
        remove_stale_runs(&runs);
        TestCluster::start(
            &runs.join(std::process::id().to_string()),
            Lifetime::TiedToProcess,
        )
        .unwrap_or_else(|e| panic!("starting the test API server: {e:#}"))
    })
}

fn remove_stale_runs(runs: &Path) {
    let Ok(entries) = fs::read_dir(runs) else {
        return;
    };
    for entry in entries.flatten() {
        let alive = entry
            .file_name()
            .to_str()
            // `<pid>` or `<pid>-<what>` (a test's own registry directory, say).
            .and_then(|name| name.split('-').next()?.parse::<u32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Stop a cluster started with [`Lifetime::Detached`] in `dir`.
pub fn stop_detached(dir: &Path) -> anyhow::Result<()> {
    for name in ["apiserver", "etcd"] {
        let pid_file = dir.join(format!("{name}.pid"));
        let Ok(pid) = fs::read_to_string(&pid_file) else {
            continue;
        };
        let pid = pid.trim().to_string();
        if Path::new(&format!("/proc/{pid}")).exists() {
            Command::new("kill").arg("-TERM").arg(&pid).status()?;
            let deadline = Instant::now() + Duration::from_secs(15);
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(100));
            }
        }
        fs::remove_file(pid_file)?;
    }
    Ok(())
}

/// Create the namespace `name` unless it exists.
pub async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let body = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match api.create(&PostParams::default(), &body).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("creating namespace {name}"))),
    }
}

/// Server-side apply CRDs and wait until each is Established.
pub async fn install_crds(
    client: &Client,
    crds: &[CustomResourceDefinition],
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("kubeairunway-tests").force();
    for crd in crds {
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        api.patch(&name, &pp, &Patch::Apply(crd))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
    }
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let cond = kube::runtime::conditions::is_crd_established();
        tokio::time::timeout(
            Duration::from_secs(30),
            kube::runtime::wait::await_condition(api.clone(), &name, cond),
        )
        .await
        .with_context(|| format!("CRD {name} not established in 30s"))??;
    }
    Ok(())
}
