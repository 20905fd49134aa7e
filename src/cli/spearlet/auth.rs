//! `spearlet auth login`: a person consents, once, to an McpServer whose authorization server
//! offers only the authorization-code flow, and the grant is stored where the agent reads it.
//! The flow is `mcp::login`; this module reads the McpServer, prints or opens the URL, and
//! stores the grant (`mcp::grant_store`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::api::{AUTH_CLIENT_SECRET, keys};
use crate::cli::{block_on, emit, tell, usage};
use crate::mcp::grant_store;
use crate::mcp::login::{self, LoginClient, LoginRequest};
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
/// stores the grant (refresh token, client, issuer) for the agent: in local mode a 0600 file,
/// `<grant dir>/<server>.json`, which `spearlet serve` and `run` read with the same
/// SPEAR_GRANT_DIR. Log in again to replace a grant (a revoked or expired one, other scopes).
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
}

impl LoginArgs {
    fn run(self) -> anyhow::Result<ExitCode> {
        let Some(registry_dir) = &self.registry_dir else {
            return Err(usage(
                "auth login needs --registry-dir (local mode): storing a grant for injected pods is not \
                 available in this version",
            ));
        };
        let snapshot = DirSource::load(registry_dir).map_err(usage)?;
        let name = &self.server;
        let Some(entry) = snapshot.server(name) else {
            let problems = snapshot.problems().iter().map(|p| format!("\n  {p}")).collect::<String>();
            return Err(usage(format!("{} has no valid McpServer named '{name}'{problems}", registry_dir.display())));
        };
        let http = entry.object.spec.http.as_ref();
        let auth = http.and_then(|h| h.auth.as_ref());
        let (Some(http), Some(auth), Some(code)) = (http, auth, auth.and_then(|a| a.authorization_code.as_ref()))
        else {
            return Err(usage(format!(
                "McpServer '{name}' does not use spec.http.auth.authorizationCode: only such servers take a login"
            )));
        };
        let Some(issuer) = auth.issuer.clone() else {
            return Err(usage(format!("McpServer '{name}': spec.http.auth.issuer is required with authorizationCode")));
        };
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
        // Logging in again asks for what the stored grant has and what the server demanded of
        // it since (a step-up), so no call that worked stops working.
        let mut extra_scopes = self.scopes.clone();
        if let Ok(stored) = grant_store::read(&path)
            && stored.mismatch(&http.url, &issuer).is_none()
        {
            extra_scopes.extend(stored.scope.split_whitespace().map(str::to_string));
            extra_scopes.extend(stored.step_up_scopes.iter().cloned());
        }
        let request = LoginRequest {
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
        };
        let no_browser = self.no_browser;
        let grant =
            block_on(async { login::login(&request, |url| show(url, no_browser)).await.map_err(anyhow::Error::new) })?;
        grant_store::write(&path, &grant)?;
        tell(format_args!(
            "logged in to {name}: grant stored in {} (scopes: {}; refresh token: {})",
            path.display(),
            if grant.scope.is_empty() { "the authorization server's default" } else { &grant.scope },
            if grant.refresh_token.is_some() {
                "yes, the agent renews access tokens with it"
            } else {
                "none issued, log in again when the access token expires"
            }
        ));
        Ok(ExitCode::SUCCESS)
    }
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
