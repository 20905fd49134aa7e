//! `spearlet auth login`: a person consents, once, to an McpServer whose authorization server
//! offers only the authorization-code flow, and the grant is stored where the agent reads it.
//! The flow is `mcp::login`; this module reads the McpServer (from a registry directory or the
//! cluster), prints or opens the URL, and stores the grant: a file (`mcp::grant_store`) or the
//! Secret `tokenSecretRef` names (`oauth::grant_secret`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, SecretKeySelector};
use kube::api::{Api, PostParams};

use super::explain::cluster::{self, KubeArgs};
use crate::api::{AUTH_CLIENT_SECRET, AuthorizationCodeAuth, McpServer, keys};
use crate::cli::{block_on, emit, tell, usage};
use crate::mcp::grant_store;
use crate::mcp::login::{self, LoginClient, LoginRequest};
use crate::mcp::oauth::grant::{self, StoredGrant};
use crate::mcp::oauth::grant_secret;
use crate::registry::dir::DirSource;

/// Log in to remote MCP servers that need a person's consent (OAuth authorization code).
#[derive(clap::Args, Debug)]
pub(crate) struct AuthArgs {
    #[command(subcommand)]
    command: AuthCommand,
}

#[derive(clap::Subcommand, Debug)]
enum AuthCommand {
    Login(LoginArgs),
}

impl AuthArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        match self.command {
            AuthCommand::Login(args) => args.run(),
        }
    }
}

/// Consent to an McpServer's `spec.http.auth.authorizationCode` in a browser and store the grant.
///
/// Discovers the server's authorization server (which must be its `spec.http.auth.issuer`),
/// registers a client when none is configured, opens the authorization URL in a browser (or
/// prints it: --no-browser) and waits on a loopback redirect listener for the answer, then
/// stores the grant (refresh token, client, issuer) for the agent: with --registry-dir (local
/// mode) in a 0600 file, `<grant dir>/<server>.json`, which `spearlet serve` reads with the same
/// SPEAR_GRANT_DIR; in a cluster (-n, the kubeconfig) in the Secret the McpServer's
/// `authorizationCode.tokenSecretRef` names, which the pods' agents read and renew. Log in again
/// to replace a grant (a revoked or expired one, other scopes).
/// Exit status: 0 when the grant is stored, 1 when the login failed, 2 on a usage error.
#[derive(clap::Args, Debug)]
pub(crate) struct LoginArgs {
    /// The McpServer (its metadata.name).
    #[arg(long, value_name = "NAME")]
    server: String,
    /// Directory of McpServer/McpProfile manifests (local mode).
    #[arg(long, env = keys::ENV_REGISTRY_DIR, value_name = "DIR")]
    registry_dir: Option<PathBuf>,
    /// Where grants are stored (local mode); default $XDG_STATE_HOME/spear-mcp/grants.
    #[arg(long, env = keys::ENV_GRANT_DIR, value_name = "DIR")]
    grant_dir: Option<PathBuf>,
    /// Print the authorization URL on one line of stdout instead of opening a browser.
    #[arg(long)]
    no_browser: bool,
    /// The loopback port of the redirect URI (default: any free port; a pre-registered client
    /// may need a fixed one).
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    redirect_port: u16,
    /// Seconds to wait for the person to consent.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    timeout: u64,
    /// A scope to ask for on top of what the server asks for (repeatable; still narrowed to
    /// spec.http.auth.scopes when that is set).
    #[arg(long = "scope", value_name = "SCOPE")]
    scopes: Vec<String>,
    #[command(flatten)]
    kube: KubeArgs,
}

impl LoginArgs {
    fn run(self) -> anyhow::Result<ExitCode> {
        match &self.registry_dir {
            Some(_) if !self.kube.given().is_empty() => Err(usage(format!(
                "--registry-dir is local mode and {} cluster mode: pass one of them",
                self.kube.given().join(", ")
            ))),
            Some(dir) => self.run_local(dir),
            None => block_on(self.run_in_cluster()),
        }
    }

    fn run_local(&self, registry_dir: &Path) -> anyhow::Result<ExitCode> {
        let snapshot = DirSource::load(registry_dir).map_err(usage)?;
        let name = &self.server;
        let Some(entry) = snapshot.server(name) else {
            let problems = snapshot.problems().iter().map(|p| format!("\n  {p}")).collect::<String>();
            return Err(usage(format!("{} has no valid McpServer named '{name}'{problems}", registry_dir.display())));
        };
        let server = &entry.object;
        let code = authorization_code(server, name)?;
        let client_secret = match &code.client_secret {
            None => None,
            Some(_) => {
                let var = crate::api::names::secret_env_var(name, AUTH_CLIENT_SECRET);
                Some(std::env::var(&var).map_err(|_| {
                    usage(format!(
                        "McpServer '{name}' has a pre-registered client secret: set {var} to its value (local mode \
                         reads Secret values from the environment)"
                    ))
                })?)
            }
        };
        let grant_dir = match &self.grant_dir {
            Some(dir) => dir.clone(),
            None => grant_store::grant_dir(|v| std::env::var(v).ok()).map_err(usage)?,
        };
        let path = grant_store::grant_path(&grant_dir, name).map_err(usage)?;
        let request = self.request(server, client_secret, grant_store::read(&path).ok().as_ref())?;
        let no_browser = self.no_browser;
        let grant =
            block_on(async { login::login(&request, |url| show(url, no_browser)).await.map_err(anyhow::Error::new) })?;
        grant_store::write(&path, &grant)?;
        tell(format_args!("logged in to {name}: grant stored in {} ({})", path.display(), summary(&grant)));
        Ok(ExitCode::SUCCESS)
    }

    async fn run_in_cluster(&self) -> anyhow::Result<ExitCode> {
        let name = &self.server;
        let (client, namespace, snapshot) =
            cluster::read_server(name, &self.kube).await.map_err(|e| if e.is_usage() { usage(e) } else { e.into() })?;
        let Some(entry) = snapshot.server(name) else {
            let problems = snapshot.problems().iter().map(|p| format!("\n  {p}")).collect::<String>();
            return Err(usage(format!("namespace {namespace} has no valid McpServer named '{name}'{problems}")));
        };
        let server = &entry.object;
        let code = authorization_code(server, name)?;
        let Some(secret_name) = code.token_secret_ref.as_ref().map(|r| r.name.clone()) else {
            return Err(usage(format!(
                "McpServer '{name}' has no spec.http.auth.authorizationCode.tokenSecretRef: in a cluster the grant is \
                 stored in that Secret, where the pods' agents read it; set it (e.g. {{name: {name}-grant}})"
            )));
        };
        let secrets: Api<Secret> = Api::namespaced(client, &namespace);
        let client_secret = match &code.client_secret {
            None => None,
            Some(source) => Some(secret_value(&secrets, &source.secret_key_ref).await?),
        };
        // A Secret that is not this server's grant is refused before anyone consents.
        let existing = secrets.get_opt(&secret_name).await?;
        let stored = match &existing {
            Some(secret) => {
                grant_secret::may_take(secret, name).map_err(usage)?;
                grant_secret::grant_of(secret, name).ok()
            }
            None => None,
        };
        let request = self.request(server, client_secret, stored.as_ref())?;
        let no_browser = self.no_browser;
        let mut grant = login::login(&request, |url| show(url, no_browser)).await?;
        // The pre-registered client's secret stays in its own Secret (the pods get it from
        // there); the grant Secret holds only what the login obtained.
        if code.client_secret.is_some() {
            grant.client.client_secret = None;
        }
        store_in_secret(&secrets, &secret_name, &namespace, name, &grant).await?;
        tell(format_args!(
            "logged in to {name}: grant stored in Secret {namespace}/{secret_name} ({}); the service account of the \
             pods that use it needs get and update on that Secret (docs/auth.md)",
            summary(&grant)
        ));
        Ok(ExitCode::SUCCESS)
    }

    /// The login for `server`, asking again for what `stored` (the grant being replaced) has and
    /// what the server demanded of it since (a step-up), so no call that worked stops working.
    fn request(
        &self,
        server: &McpServer,
        client_secret: Option<String>,
        stored: Option<&StoredGrant>,
    ) -> anyhow::Result<LoginRequest> {
        let name = &self.server;
        let (Some(http), Some(auth)) =
            (server.spec.http.as_ref(), server.spec.http.as_ref().and_then(|h| h.auth.as_ref()))
        else {
            return Err(usage(format!("McpServer '{name}' has no spec.http.auth")));
        };
        let code = authorization_code(server, name)?;
        let Some(issuer) = auth.issuer.clone() else {
            return Err(usage(format!("McpServer '{name}': spec.http.auth.issuer is required with authorizationCode")));
        };
        let mut extra_scopes = self.scopes.clone();
        if let Some(stored) = stored.filter(|g| g.mismatch(&http.url, &issuer).is_none()) {
            extra_scopes.extend(stored.scope.split_whitespace().map(str::to_string));
            extra_scopes.extend(stored.step_up_scopes.iter().cloned());
        }
        Ok(LoginRequest {
            server: name.clone(),
            url: http.url.clone(),
            issuer,
            client: LoginClient {
                client_id: code.client_id.clone(),
                client_secret,
                metadata_url: code.client_id_metadata_url.clone(),
            },
            allowed_scopes: auth.scopes.clone(),
            extra_scopes,
            redirect_port: self.redirect_port,
            timeout: Duration::from_secs(self.timeout.max(1)),
        })
    }
}

/// `server`'s `spec.http.auth.authorizationCode`, or the usage error saying it has none.
fn authorization_code<'a>(server: &'a McpServer, name: &str) -> anyhow::Result<&'a AuthorizationCodeAuth> {
    server.spec.http.as_ref().and_then(|h| h.auth.as_ref()).and_then(|a| a.authorization_code.as_ref()).ok_or_else(
        || {
            usage(format!(
                "McpServer '{name}' does not use spec.http.auth.authorizationCode: only such servers take a login"
            ))
        },
    )
}

/// The value of the Secret key `selector` (the pre-registered client's secret), read as the
/// person logging in.
async fn secret_value(secrets: &Api<Secret>, selector: &SecretKeySelector) -> anyhow::Result<String> {
    let secret = secrets.get(&selector.name).await.map_err(|e| {
        anyhow::anyhow!(
            "reading the client secret from Secret {:?} (spec.http.auth.authorizationCode.clientSecret): {e}",
            selector.name
        )
    })?;
    let bytes = secret.data.as_ref().and_then(|d| d.get(&selector.key)).ok_or_else(|| {
        usage(format!("Secret {:?} has no key {:?} (authorizationCode.clientSecret)", selector.name, selector.key))
    })?;
    String::from_utf8(bytes.0.clone())
        .map_err(|_| usage(format!("Secret {:?} key {:?} is not UTF-8", selector.name, selector.key)))
}

/// Creates or updates the grant Secret, reading it again on a conflict (an agent renewing the
/// old grant meanwhile).
async fn store_in_secret(
    secrets: &Api<Secret>,
    secret_name: &str,
    namespace: &str,
    server: &str,
    grant: &StoredGrant,
) -> anyhow::Result<()> {
    const ATTEMPTS: usize = 5;
    for _ in 0..ATTEMPTS {
        let existing = secrets.get_opt(secret_name).await?;
        let update = existing.is_some();
        let secret = grant_secret::login_secret(existing, secret_name, namespace, server, grant, grant::unix_now())
            .map_err(usage)?;
        let written = if update {
            secrets.replace(secret_name, &PostParams::default(), &secret).await
        } else {
            secrets.create(&PostParams::default(), &secret).await
        };
        match written {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => return Err(anyhow::anyhow!("writing the grant Secret {namespace}/{secret_name}: {e}")),
        }
    }
    Err(anyhow::anyhow!(
        "the grant Secret {namespace}/{secret_name} kept changing while storing the grant; log in again"
    ))
}

/// What a stored grant gives, for the closing line.
fn summary(grant: &StoredGrant) -> String {
    format!(
        "scopes: {}; refresh token: {}",
        if grant.scope.is_empty() { "the authorization server's default" } else { &grant.scope },
        if grant.refresh_token.is_some() {
            "yes, the agent renews access tokens with it"
        } else {
            "none issued, log in again when the access token expires"
        }
    )
}

/// Shows the authorization URL: one line of stdout (--no-browser, for scripts and remote
/// shells), or a browser opened on it with the URL on stderr in case none opens.
fn show(url: &url::Url, no_browser: bool) {
    if no_browser {
        emit(&format!("{url}\n"));
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        return;
    }
    let opener = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
    let opened = std::process::Command::new(opener)
        .arg(url.as_str())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .is_ok();
    tell(format_args!(
        "{} the authorization URL; if no browser opens, open it on this machine:\n  {url}",
        if opened { "opening" } else { "could not open a browser for" }
    ));
}
