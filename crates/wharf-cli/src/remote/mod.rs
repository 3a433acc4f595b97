//! The commands that talk to a running server (`check`, `tools`, `call`, `listen`, `login`),
//! and what they share: the endpoint, the token, and how results are shown.

/// `println!` for what the commands show on stdout: see [`print_line`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::remote::print_line(format_args!($($arg)*))
    };
}

mod arguments;
pub(crate) mod call;
pub(crate) mod check;
pub(crate) mod listen;
pub(crate) mod login;
mod oauth;
mod prompt;
mod tokens;
pub(crate) mod tools;

use std::process::ExitCode;

/// The rule every URL credentials travel to is held to, `wharf serve`'s flags included.
pub(crate) use oauth::secure_url;

use clap::Args;
use wharf_client::HttpClient;

/// Set once stdout's reader has gone.
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Prints `line` on stdout. Once its reader has gone (`wharf listen | head -n 1`) nothing
/// more is printed, and the command goes on to its own end and exit code (`println!`
/// panicked, exit 101); [`stdout_gone`] tells a command that only prints to stop. Any other
/// failure to write ends the command with an error.
pub(crate) fn print_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    use std::sync::atomic::Ordering;
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            STDOUT_GONE.store(true, Ordering::Relaxed);
        }
        Err(e) => {
            eprintln!("error: could not write to stdout: {e}");
            std::process::exit(1);
        }
    }
}

/// Whether stdout's reader has gone (see [`print_line`]).
pub(crate) fn stdout_gone() -> bool {
    STDOUT_GONE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Where the server is and how to authenticate to it.
#[derive(Clone, Args)]
pub(crate) struct Endpoint {
    /// The server's MCP endpoint, e.g. http://127.0.0.1:8080/mcp.
    pub(crate) url: String,
    /// A bearer token or API key sent as `Authorization: Bearer …`.
    #[arg(long, env = "WHARF_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
}

impl std::fmt::Debug for Endpoint {
    // The token is a credential: its presence shows, never its value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Endpoint {
    /// A client of the endpoint with its token: `--token`/`WHARF_TOKEN`, else the one
    /// `wharf login` kept (refreshed when about to expire), else none.
    pub(crate) async fn client(&self) -> Result<HttpClient, Unreachable> {
        self.client_with(false).await
    }

    /// [`Endpoint::client`]; with `refused`, a stored token is refreshed first.
    async fn client_with(&self, refused: bool) -> Result<HttpClient, Unreachable> {
        // A server that never accepts is given up on: requests themselves are not timed, since
        // a listen stream or a long call may rightly stay quiet for long.
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| Unreachable::fatal(format!("cannot build the HTTP client: {e}")))?;
        let mut client = HttpClient::new(self.url.clone()).with_http(http);
        client.meta.client_info = serde_json::json!({
            "name": "wharf",
            "version": env!("CARGO_PKG_VERSION"),
        });
        let token = match &self.token {
            Some(token) => Some(token.clone()),
            None => tokens::token_for(&self.url, refused).await?,
        };
        Ok(match token {
            Some(token) => client.with_bearer(token),
            None => client,
        })
    }

    /// Connects as a client of either era declaring `capabilities` (see
    /// [`wharf_client::Client::connect`]).
    pub(crate) async fn connect(
        &self,
        capabilities: serde_json::Value,
    ) -> Result<wharf_client::Client, Unreachable> {
        use wharf_client::ClientError;
        let mut http = self.client().await?;
        http.meta.capabilities = capabilities.clone();
        let mut connected = wharf_client::Client::connect(http).await;
        if let (Err(ClientError::Status { status: 401, .. }), None) = (&connected, &self.token) {
            // A stored token refused before its time (revoked, say): refresh it and try once
            // more.
            let mut http = self.client_with(true).await?;
            if http.authorization().is_some() {
                http.meta.capabilities = capabilities;
                connected = wharf_client::Client::connect(http).await;
            }
        }
        connected.map_err(|e| {
            let message = match &e {
                ClientError::Status { status: 401, .. } => format!(
                    "{} wants a token ({e}): run `wharf login {}`, or pass --token",
                    self.url, self.url
                ),
                ClientError::Status { status: 400, .. } => format!(
                    "{} refused the Authorization header as malformed ({e}): check --token",
                    self.url
                ),
                _ => format!("could not connect to {}: {e}", self.url),
            };
            Unreachable {
                message,
                retry: e.is_retryable(),
            }
        })
    }
}

/// Why a command could not connect, and whether trying again may help.
#[derive(Debug)]
pub(crate) struct Unreachable {
    message: String,
    retry: bool,
}

impl Unreachable {
    /// Trying again will not help.
    pub(crate) fn fatal(message: String) -> Self {
        Unreachable {
            message,
            retry: false,
        }
    }

    /// Trying again later may help.
    pub(crate) fn transient(message: String) -> Self {
        Unreachable {
            message,
            retry: true,
        }
    }
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Runs a command's `future` on a runtime of its own (the client commands are short-lived).
pub(crate) fn block_on(future: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => {
            let code = runtime.block_on(future);
            // A prompt still waiting on the terminal (a blocking task) when the command was
            // stopped must not keep the process: the runtime is not waited for.
            runtime.shutdown_background();
            code
        }
        Err(e) => failed(format!("could not start the runtime: {e}")),
    }
}

/// How the process was asked to stop (`Some` once it was): Ctrl-C or SIGTERM, with the
/// conventional exit code (128 + the signal's number). See [`watch_stops`].
pub(crate) type Stopped = tokio::sync::watch::Receiver<Option<(&'static str, ExitCode)>>;

/// Starts listening for Ctrl-C (SIGINT) and SIGTERM (`timeout`, a service manager,
/// `kill`), from now on: once either comes, the receiver says which, and a command ends
/// what it holds on the server before it exits. (Listening takes the signals' default,
/// killing the process, away; so every wait a command makes afterwards must end on it.)
pub(crate) fn watch_stops() -> Stopped {
    let (stop, stopped) = tokio::sync::watch::channel(None);
    let mut signals = crate::signals::StopSignals::listen();
    tokio::spawn(async move {
        let _ = stop.send(Some(signals.next().await));
    });
    stopped
}

/// Resolves once the process was asked to stop (never, if nothing can say so any more).
pub(crate) async fn until_stopped(mut stopped: Stopped) {
    if stopped.wait_for(Option::is_some).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// How the process was asked to stop, once it was.
pub(crate) fn stop_reason(stopped: &Stopped) -> (&'static str, ExitCode) {
    (*stopped.borrow()).unwrap_or(("Ctrl-C", ExitCode::from(130)))
}

/// Prints `message` as the command's error; exit code 1.
pub(crate) fn failed(message: impl std::fmt::Display) -> ExitCode {
    eprintln!(
        "{} {message}",
        console::style("error:").for_stderr().red().bold()
    );
    ExitCode::FAILURE
}

/// Ends what `client` holds on the server (a legacy session), waiting a few seconds at
/// most: a server that does not answer does not hold the command.
pub(crate) async fn close(client: &wharf_client::Client) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(3), client.close()).await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_token_never_shows_in_debug_output() {
        let endpoint = super::Endpoint {
            url: "http://127.0.0.1:1/mcp".to_owned(),
            token: Some("s3cret-token-value".to_owned()),
        };
        let shown = format!("{endpoint:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("<set>"),
            "{shown}"
        );
    }
}
