//! The test control plane: a real `kube-apiserver` + `etcd` (the controller-runtime "envtest"
//! practice: schemas, CEL, watches and RBAC are the real ones), started once per test binary on
//! loopback, with our CRDs installed. Tests reach it through a normal `kube::Client`, one
//! namespace each.
//!
//! ```text
//! ControlPlane::shared() ─first call─▶ rcgen PKI ─▶ etcd ─▶ kube-apiserver ─▶ /readyz ─▶ CRDs
//!        │                                 (readiness + CRDs: own thread, own runtime)
//!        └─▶ &'static ControlPlane ─client() / namespace()─▶ kube::Client for the caller's runtime
//! ```
//!
//! Decisions (the reasons are in this module's `README.md`): no process is left behind, without
//! `unsafe` (the binaries exit when the stdin pipe the launcher holds closes); a synchronous
//! start and a fresh [`ControlPlane::client`] per caller (a client is bound to its runtime); CRDs
//! from the Rust types; the API server presents [`WEBHOOK_CLIENT_NAME`]'s certificate to every
//! webhook; a failure panics with what to run, and a failed start is remembered.

use std::fs;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Resource, ResourceExt};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use crate::api::crd;
use crate::testing::mcp_servers::free_port;

/// Kubernetes version of the test control plane. Must change together with `K8S_VERSION` in
/// `hack/control-plane.sh`, which builds the binaries into a directory named after these values.
pub const K8S_VERSION: &str = "v1.36.3";
/// etcd version of the test control plane; must change together with `ETCD_VERSION` in
/// `hack/control-plane.sh`.
pub const ETCD_VERSION: &str = "v3.6.16";
/// Revision of the Go wrappers around both mains; must change together with `WRAPPER_REVISION`
/// in `hack/control-plane.sh`.
pub const WRAPPER_REVISION: &str = "w2";
/// Env var naming a directory that holds `kube-apiserver` and `etcd`, overriding the cache.
pub const ENV_BIN: &str = "SPEAR_CONTROL_PLANE_BIN";
/// Field manager of everything the launcher applies (CRDs).
pub const FIELD_MANAGER: &str = "spear-test";
/// Service CIDR of the control plane; its first address is the `kubernetes` service IP.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// Common name of the client certificate the API server presents to webhooks.
pub const WEBHOOK_CLIENT_NAME: &str = "kube-apiserver-webhook-client";

/// Whole-start attempts: a port picked free can be taken before a process binds it.
const START_ATTEMPTS: usize = 3;
/// etcd opens its client port in well under a second; 20 s tolerates a loaded 2-core CI box.
const ETCD_PORT_TIMEOUT: Duration = Duration::from_secs(20);
/// kube-apiserver 1.36 is ready about 3 s after start (warm cache); 60 s covers a cold, busy CI box.
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// One `/readyz` probe; a hung connection must not eat the whole readiness budget.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Establishing a CRD takes milliseconds once the API server is ready.
const CRD_ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Log lines quoted in a failure message: enough for a Go stack trace's first frames.
const LOG_TAIL_LINES: usize = 40;

/// The control plane of this test binary: see the module docs.
pub struct ControlPlane {
    config: kube::Config,
    kubeconfig: PathBuf,
    pki_dir: PathBuf,
    etcd: Process,
    apiserver: Process,
    startup: Duration,
}

/// A namespace created for one test, with a client for the test's runtime.
pub struct TestNamespace {
    /// The generated namespace name (`<prefix>-xxxxx`).
    pub name: String,
    /// An admin client bound to the runtime of the test that created the namespace.
    pub client: Client,
}

impl TestNamespace {
    /// An `Api` for a namespaced resource in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// A token of ServiceAccount `account` (which must exist) for `audience`, valid for an hour,
    /// from the TokenRequest API: what the kubelet puts in a projected token volume.
    pub async fn service_account_token(&self, account: &str, audience: &str) -> String {
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec![audience.to_string()]),
                expiration_seconds: Some(3600),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.api::<ServiceAccount>()
            .create_token_request(account, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("the TokenRequest API must issue a token for {account}: {e}"))
            .status
            .and_then(|s| s.token)
            .unwrap_or_else(|| panic!("an issued token for {account} has a token"))
    }
}

// === impl ControlPlane ===

impl ControlPlane {
    /// The control plane of this test binary, started (and its CRDs established) on first use.
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        match SHARED.get_or_init(ControlPlane::start) {
            Ok(control_plane) => control_plane,
            Err(message) => panic!("{message}"),
        }
    }

    /// Admin (`system:masters`) client configuration.
    pub fn config(&self) -> kube::Config {
        self.config.clone()
    }

    /// A fresh admin client bound to the calling runtime.
    pub async fn client(&self) -> Client {
        crate::kube_client::client(self.config())
            .expect("the test control plane's admin config must build a client (its cert files exist)")
    }

    /// A kubeconfig file for the admin, for `kubectl` while debugging.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Creates a namespace named `<prefix>-<random>` and returns it with a client.
    pub async fn namespace(&self, prefix: &str) -> TestNamespace {
        let client = self.client().await;
        let namespace = Namespace {
            metadata: ObjectMeta { generate_name: Some(format!("{prefix}-")), ..ObjectMeta::default() },
            ..Namespace::default()
        };
        let created =
            Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.unwrap_or_else(
                |e| panic!("creating a test namespace `{prefix}-*` failed (the prefix must be a DNS-1123 label): {e}"),
            );
        let name = created.metadata.name.expect("the API server must name a namespace created with generateName");
        TestNamespace { name, client }
    }

    /// How long the first `shared()` call took to return (start, readiness and CRDs).
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// The etcd log file; its directory is removed when the test binary ends.
    pub fn etcd_log(&self) -> &Path {
        &self.etcd.log
    }

    /// The kube-apiserver log file; its directory is removed when the test binary ends.
    pub fn apiserver_log(&self) -> &Path {
        &self.apiserver.log
    }

    /// Process id of etcd.
    pub fn etcd_pid(&self) -> u32 {
        self.etcd.child.id()
    }

    /// Process id of kube-apiserver.
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver.child.id()
    }

    /// The PEM file of the CA that issued the API server's webhook client certificate (what
    /// `--webhook-client-ca-file` names).
    pub fn webhook_client_ca_path(&self) -> PathBuf {
        self.pki_dir.join("webhook-client-ca.crt")
    }

    /// The CA of [`Self::webhook_client_ca_path`], PEM.
    pub fn webhook_client_ca_pem(&self) -> String {
        read_pki(&self.webhook_client_ca_path())
    }

    /// The API server's webhook client certificate and key, PEM (to stand in for the API server).
    pub fn webhook_client_identity(&self) -> (String, String) {
        (read_pki(&self.pki_dir.join("webhook-client.crt")), read_pki(&self.pki_dir.join("webhook-client.key")))
    }

    /// A client certificate and key (PEM) for `common_name`, issued by the webhook client CA:
    /// trusted by the CA, so only a name check can refuse it.
    pub fn issue_webhook_client_cert(&self, common_name: &str) -> (String, String) {
        let ca_key = KeyPair::from_pem(&read_pki(&self.pki_dir.join("webhook-client-ca.key")))
            .expect("the webhook client CA key parses");
        let issuer = rcgen::Issuer::from_ca_cert_pem(&self.webhook_client_ca_pem(), ca_key)
            .expect("the webhook client CA certificate parses");
        client_cert(common_name, &issuer)
    }

    fn start() -> Result<ControlPlane, String> {
        let begun = Instant::now();
        let bin = bin_dir()?;
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            match launch(&bin) {
                Ok(mut control_plane) => {
                    control_plane.startup = begun.elapsed();
                    return Ok(control_plane);
                }
                Err(StartError::Retry(message)) => {
                    failures.push(format!("attempt {attempt}/{START_ATTEMPTS}: {message}"));
                }
                Err(StartError::Fatal(message)) => {
                    failures.push(message);
                    break;
                }
            }
        }
        Err(format!("the test control plane did not start:\n\n{}", failures.join("\n\n")))
    }
}

/// Why an attempt failed: worth another attempt (a process died or never got ready), or not.
enum StartError {
    Retry(String),
    Fatal(String),
}

/// The directory holding the binaries: `$SPEAR_CONTROL_PLANE_BIN`, else the cache that
/// `hack/control-plane.sh` fills (honouring its `SPEAR_CACHE_DIR`).
fn bin_dir() -> Result<PathBuf, String> {
    let dir = match std::env::var_os(ENV_BIN) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let cache = match std::env::var_os("SPEAR_CACHE_DIR") {
                Some(dir) => PathBuf::from(dir),
                None => {
                    let home = std::env::var_os("HOME").ok_or_else(|| {
                        format!("HOME is not set: set {ENV_BIN} to the directory hack/control-plane.sh prints")
                    })?;
                    PathBuf::from(home).join(".cache/spear-mcp")
                }
            };
            cache
                .join("control-plane")
                .join(format!("k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}-{WRAPPER_REVISION}"))
                .join("bin")
        }
    };
    for binary in ["etcd", "kube-apiserver"] {
        if !dir.join(binary).is_file() {
            return Err(format!(
                "test control plane not built: run hack/control-plane.sh (no {} found)",
                dir.join(binary).display()
            ));
        }
    }
    Ok(dir)
}

/// One attempt: fresh directories, PKI and ports, then both processes, readiness and CRDs.
fn launch(bin: &Path) -> Result<ControlPlane, StartError> {
    let apiserver_dir = kept_temp_dir("spear-kube-apiserver-");
    let etcd_dir = kept_temp_dir("spear-etcd-");
    let result = launch_in(bin, &apiserver_dir, &etcd_dir);
    if result.is_err() {
        // The processes are killed by now (`Process::drop`), so they cannot clean up: remove the
        // data and keys, keep the logs that the failure message points at.
        let _ = fs::remove_dir_all(apiserver_dir.join("pki"));
        let _ = fs::remove_file(apiserver_dir.join("kubeconfig"));
        let _ = fs::remove_dir_all(etcd_dir.join("data"));
    }
    result
}

fn launch_in(bin: &Path, apiserver_dir: &Path, etcd_dir: &Path) -> Result<ControlPlane, StartError> {
    let pki = Pki::write(&apiserver_dir.join("pki"));
    let [etcd_client_port, etcd_peer_port, apiserver_port] = free_ports();

    let etcd_client_url = format!("http://127.0.0.1:{etcd_client_port}");
    let etcd_peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
    let mut etcd = Process::spawn(
        "etcd",
        &bin.join("etcd"),
        &[
            "--name=spear-test".into(),
            format!("--data-dir={}", etcd_dir.join("data").display()),
            format!("--listen-client-urls={etcd_client_url}"),
            format!("--advertise-client-urls={etcd_client_url}"),
            format!("--listen-peer-urls={etcd_peer_url}"),
            format!("--initial-advertise-peer-urls={etcd_peer_url}"),
            format!("--initial-cluster=spear-test={etcd_peer_url}"),
            // Test data is thrown away: skipping fsync makes every write several times faster.
            "--unsafe-no-fsync".into(),
        ],
        etcd_dir,
    )?;
    etcd.wait_for_port(etcd_client_port, ETCD_PORT_TIMEOUT)?;

    let pem = |name: &str| pki.dir.join(name).display().to_string();
    let mut apiserver = Process::spawn(
        "kube-apiserver",
        &bin.join("kube-apiserver"),
        &[
            format!("--etcd-servers={etcd_client_url}"),
            format!("--secure-port={apiserver_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", pki.dir.display()),
            format!("--tls-cert-file={}", pem("apiserver.crt")),
            format!("--tls-private-key-file={}", pem("apiserver.key")),
            format!("--client-ca-file={}", pem("ca.crt")),
            format!("--service-account-key-file={}", pem("service-account.pub")),
            format!("--service-account-signing-key-file={}", pem("service-account.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--authorization-mode=RBAC".into(),
            // No controller-manager runs, so no token controller: the ServiceAccount plugin would
            // reject every Pod waiting for a `default` ServiceAccount that never appears.
            "--disable-admission-plugins=ServiceAccount".into(),
            // Pods are only admitted, never run; allow what a real cluster's policy may allow.
            "--allow-privileged=true".into(),
            // The `kubernetes` Endpoints would point at the loopback advertise address, which
            // validation rejects (an error logged every 10 s); nothing runs in-cluster to use them.
            "--endpoint-reconciler-type=none".into(),
            // The client certificate it presents to webhooks (module docs).
            format!("--admission-control-config-file={}", pem("admission.yaml")),
        ],
        apiserver_dir,
    )?;

    let config = admin_config(apiserver_port, &pki);
    let kubeconfig = write_kubeconfig(apiserver_dir, apiserver_port, &pki);

    let startup_config = config.clone();
    let (etcd_ref, apiserver_ref) = (&mut etcd, &mut apiserver);
    block_on(move || async move {
        let client = Client::try_from(startup_config).map_err(|e| {
            StartError::Fatal(format!("the test control plane's admin config does not build a client: {e}"))
        })?;
        wait_until_ready(&client, etcd_ref, apiserver_ref).await?;
        install_crds(&client)
            .await
            .map_err(|message| StartError::Fatal(format!("{message}\n{}", apiserver_ref.log_tail())))
    })?;

    Ok(ControlPlane { config, kubeconfig, pki_dir: pki.dir.clone(), etcd, apiserver, startup: Duration::ZERO })
}

/// Polls `/readyz` with the admin client until it answers `ok`, failing fast if a process died.
async fn wait_until_ready(client: &Client, etcd: &mut Process, apiserver: &mut Process) -> Result<(), StartError> {
    // `kube::core::Request` builds the plain `GET /readyz` (name "readyz" under an empty path)
    // without a direct dependency on the `http` crate.
    let readyz = || {
        kube::core::Request::new("").get("readyz", &GetParams::default()).expect("GET /readyz must build as a request")
    };
    let deadline = Instant::now() + APISERVER_READY_TIMEOUT;
    loop {
        for process in [&mut *etcd, &mut *apiserver] {
            if let Some(failure) = process.exited() {
                return Err(StartError::Retry(failure));
            }
        }
        let last = match tokio::time::timeout(PROBE_TIMEOUT, client.request_text(readyz())).await {
            Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
            Ok(Ok(body)) => format!("/readyz answered {body:?}"),
            Ok(Err(e)) => format!("/readyz failed: {e}"),
            Err(_) => format!("/readyz did not answer within {PROBE_TIMEOUT:?}"),
        };
        if Instant::now() >= deadline {
            return Err(StartError::Retry(format!(
                "kube-apiserver was not ready within {APISERVER_READY_TIMEOUT:?} (last: {last})\n{}\n{}",
                apiserver.log_tail(),
                etcd.log_tail()
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Applies every CRD from the Rust types and waits until each is Established.
async fn install_crds(client: &Client) -> Result<(), String> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for definition in crd::definitions() {
        let name = definition.name_any();
        api.patch(&name, &params, &Patch::Apply(&definition))
            .await
            .map_err(|e| format!("the API server rejected CRD {name} (generated from src/api): {e}"))?;
        names.push(name);
    }
    for name in names {
        match tokio::time::timeout(
            CRD_ESTABLISHED_TIMEOUT,
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("watching CRD {name} until Established failed: {e}")),
            Err(_) => {
                let status =
                    api.get(&name).await.map(|crd| format!("{:?}", crd.status)).unwrap_or_else(|e| e.to_string());
                return Err(format!(
                    "CRD {name} was not Established within {CRD_ESTABLISHED_TIMEOUT:?}; its status: {status}"
                ));
            }
        }
    }
    Ok(())
}

/// Runs async work to completion on a scoped thread with its own current-thread runtime, so a
/// synchronous caller inside any runtime (a `#[tokio::test]`) can wait for it without nesting.
fn block_on<T, F>(work: impl FnOnce() -> F + Send) -> T
where
    F: Future<Output = T>,
    T: Send,
{
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current-thread tokio runtime must build")
                .block_on(work())
        });
        worker.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// A temp directory that outlives its `TempDir`: the process given it removes it at exit.
fn kept_temp_dir(prefix: &str) -> PathBuf {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("creating a temp dir for the test control plane must succeed (is TMPDIR writable?)")
        .keep()
}

/// Three distinct loopback ports that were free a moment ago (see [`free_port`]).
fn free_ports() -> [u16; 3] {
    [(); 3].map(|()| free_port())
}

// === impl Process ===

/// A control-plane process whose stdin pipe is its lifeline.
struct Process {
    name: &'static str,
    child: Child,
    /// Never written: its close (when the test binary ends) tells the process to exit.
    _lifeline: ChildStdin,
    log: PathBuf,
}

impl Process {
    /// Starts `binary` with stdout and stderr to `<dir>/<name>.log`; the process removes `dir`
    /// when its stdin closes.
    fn spawn(name: &'static str, binary: &Path, args: &[String], dir: &Path) -> Result<Process, StartError> {
        let log = dir.join(format!("{name}.log"));
        let out = fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating {} must succeed in a fresh temp dir: {e}", log.display()));
        let err = out.try_clone().expect("a log file handle must be clonable");
        let mut child = Command::new(binary)
            .args(args)
            .current_dir(dir)
            .env("SPEAR_EXIT_ON_STDIN_EOF", "1")
            .env("SPEAR_REMOVE_ON_EXIT", dir)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                StartError::Fatal(format!(
                    "starting {} failed: {e}; rebuild it with hack/control-plane.sh",
                    binary.display()
                ))
            })?;
        let lifeline = child.stdin.take().expect("stdin was configured as a pipe, so the handle must exist");
        Ok(Process { name, child, _lifeline: lifeline, log })
    }

    /// Waits until `port` accepts connections, failing early if the process exits.
    fn wait_for_port(&mut self, port: u16, timeout: Duration) -> Result<(), StartError> {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(failure) = self.exited() {
                return Err(StartError::Retry(failure));
            }
            if TcpStream::connect_timeout(&address, POLL_INTERVAL).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StartError::Retry(format!(
                    "{} did not listen on {address} within {timeout:?}\n{}",
                    self.name,
                    self.log_tail()
                )));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// A failure message if the process has exited.
    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!("{} exited early ({status})\n{}", self.name, self.log_tail())),
            Ok(None) => None,
            Err(e) => Some(format!("checking whether {} runs failed: {e}", self.name)),
        }
    }

    /// The log's path and its last lines, for failure messages.
    fn log_tail(&self) -> String {
        let text = fs::read(&self.log).map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!("--- last {LOG_TAIL_LINES} lines of {} ---\n{tail}", self.log.display())
    }
}

impl Drop for Process {
    /// Only a failed start drops a `Process` (the shared one lives in a static): stop it now.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// === PKI ===

/// Certificates and keys on disk, plus the CA in DER for the client config.
struct Pki {
    dir: PathBuf,
    ca_der: Vec<u8>,
}

impl Pki {
    /// Generates a CA, the serving cert, the admin client cert and the service-account key pair
    /// into `dir`.
    fn write(dir: &Path) -> Pki {
        const INVARIANT: &str = "rcgen must build certificates from fixed, valid parameters";
        fs::create_dir(dir).unwrap_or_else(|e| panic!("creating {} must succeed: {e}", dir.display()));
        let put = |name: &str, contents: &str| {
            let path = dir.join(name);
            fs::write(&path, contents).unwrap_or_else(|e| panic!("writing {} must succeed: {e}", path.display()));
        };

        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect(INVARIANT);
        ca_params.distinguished_name.push(DnType::CommonName, "spear-test-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect(INVARIANT)).expect(INVARIANT);
        put("ca.crt", &ca.pem());

        // The service IP (first of SERVICE_CIDR) is what in-cluster clients would dial.
        let mut serving = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into(), "10.0.0.1".into()])
            .expect(INVARIANT);
        serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate().expect(INVARIANT);
        put("apiserver.crt", &serving.signed_by(&serving_key, &ca).expect(INVARIANT).pem());
        put("apiserver.key", &serving_key.serialize_pem());

        // Client-certificate authentication maps CN to the user and O to its groups.
        let mut admin = CertificateParams::new(Vec::<String>::new()).expect(INVARIANT);
        admin.distinguished_name.push(DnType::CommonName, "spear-test-admin");
        admin.distinguished_name.push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_key = KeyPair::generate().expect(INVARIANT);
        put("admin.crt", &admin.signed_by(&admin_key, &ca).expect(INVARIANT).pem());
        put("admin.key", &admin_key.serialize_pem());

        let service_account = KeyPair::generate().expect(INVARIANT);
        put("service-account.pub", &service_account.public_key_pem());
        put("service-account.key", &service_account.serialize_pem());

        // The API server's identity towards webhooks, from a CA of its own (as a cluster would
        // use for it), and the admission configuration that hands it to every webhook call.
        let mut client_ca_params = CertificateParams::new(Vec::<String>::new()).expect(INVARIANT);
        client_ca_params.distinguished_name.push(DnType::CommonName, "spear-test-webhook-client-ca");
        client_ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        client_ca_params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let client_ca_key = KeyPair::generate().expect(INVARIANT);
        put("webhook-client-ca.key", &client_ca_key.serialize_pem());
        let client_ca = CertifiedIssuer::self_signed(client_ca_params, client_ca_key).expect(INVARIANT);
        put("webhook-client-ca.crt", &client_ca.pem());
        let (client_cert_pem, client_key_pem) = client_cert(WEBHOOK_CLIENT_NAME, &client_ca);
        put("webhook-client.crt", &client_cert_pem);
        put("webhook-client.key", &client_key_pem);
        let webhook_kubeconfig = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "users": [{
                "name": "*",
                "user": {
                    "client-certificate": dir.join("webhook-client.crt"),
                    "client-key": dir.join("webhook-client.key"),
                },
            }],
        });
        put("webhook-kubeconfig.yaml", &serde_yaml::to_string(&webhook_kubeconfig).expect(INVARIANT));
        let admission = serde_json::json!({
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": [{
                "name": "MutatingAdmissionWebhook",
                "configuration": {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "WebhookAdmissionConfiguration",
                    "kubeConfigFile": dir.join("webhook-kubeconfig.yaml"),
                },
            }],
        });
        put("admission.yaml", &serde_yaml::to_string(&admission).expect(INVARIANT));

        Pki { dir: dir.to_path_buf(), ca_der: ca.der().to_vec() }
    }

    /// A path in the PKI directory as the string kubeconfig fields want.
    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().expect("temp dir paths must be UTF-8").to_string()
    }
}

/// A client certificate (clientAuth) for `common_name` signed by `issuer`, and its key, as PEM.
fn client_cert(common_name: &str, issuer: &rcgen::Issuer<'_, KeyPair>) -> (String, String) {
    const INVARIANT: &str = "rcgen must build certificates from fixed, valid parameters";
    let mut params = CertificateParams::new(Vec::<String>::new()).expect(INVARIANT);
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().expect(INVARIANT);
    (params.signed_by(&key, issuer).expect(INVARIANT).pem(), key.serialize_pem())
}

fn read_pki(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {} must succeed while the control plane runs: {e}", path.display()))
}

/// The admin's client configuration: our CA as the only root, the admin cert as identity.
fn admin_config(port: u16, pki: &Pki) -> kube::Config {
    let url = format!("https://127.0.0.1:{port}").parse().expect("a loopback URL must parse as a URI");
    let mut config = kube::Config::new(url);
    config.root_cert = Some(vec![pki.ca_der.clone()]);
    config.auth_info.client_certificate = Some(pki.path("admin.crt"));
    config.auth_info.client_key = Some(pki.path("admin.key"));
    config
}

/// Writes `<dir>/kubeconfig` for the admin; the paths it names live as long as the control plane.
fn write_kubeconfig(dir: &Path, port: u16, pki: &Pki) -> PathBuf {
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "spear-test",
            "cluster": { "server": format!("https://127.0.0.1:{port}"), "certificate-authority": pki.path("ca.crt") },
        }],
        "users": [{
            "name": "spear-test-admin",
            "user": { "client-certificate": pki.path("admin.crt"), "client-key": pki.path("admin.key") },
        }],
        "contexts": [{ "name": "spear-test", "context": { "cluster": "spear-test", "user": "spear-test-admin" } }],
        "current-context": "spear-test",
    });
    let text = serde_yaml::to_string(&kubeconfig).expect("a JSON value must serialize as YAML");
    let path = dir.join("kubeconfig");
    fs::write(&path, text).unwrap_or_else(|e| panic!("writing {} must succeed: {e}", path.display()));
    path
}
