//! Shared test support: start a real `wharf serve`, and validate every message it emits
//! against the vendored 2026-07-28 schema.
#![allow(dead_code)]

pub(crate) mod authz;
pub(crate) mod chromium;
pub(crate) mod documents;
pub(crate) mod import;
pub(crate) mod peers;

use std::collections::HashMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;
use wharf_client::{HttpClient, Reply};

/// A `wharf serve` child process on a free loopback port.
pub(crate) struct ServerProcess {
    pub child: Child,
    /// The address it listens on: 127.0.0.1 unless started with [`ServerProcess::start_at`].
    pub ip: std::net::IpAddr,
    pub port: u16,
    /// What it logged (at debug level for Wharf's own crates, `WHARF_LOG=warn,wharf=debug`).
    pub log: Log,
}

/// The lines a server writes to stderr, kept so a test can wait for what the server says it
/// did, instead of sleeping and hoping it did. Each line is echoed to the test's stderr.
#[derive(Clone, Default)]
pub(crate) struct Log(std::sync::Arc<Mutex<Vec<String>>>);

impl Log {
    fn follow(stderr: std::process::ChildStderr) -> Log {
        use std::io::BufRead as _;
        let log = Log::default();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("{line}");
                lines.0.lock().unwrap().push(line);
            }
        });
        log
    }

    /// Every line so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// How many lines so far contain `needle`.
    pub(crate) fn count(&self, needle: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits until `n` lines contain `needle` (a generous deadline only turns a hang into a
    /// failure; nothing is decided by it).
    pub(crate) async fn wait_for(&self, needle: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.count(needle) < n {
            assert!(
                Instant::now() < deadline,
                "the server never logged {n} × {needle:?}; it logged:\n{}",
                self.0.lock().unwrap().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl ServerProcess {
    /// Starts `wharf serve` with `args` and waits until it answers HTTP (`/healthz`). Without a
    /// `--profile` it serves the demo tools, and without credentials it runs anonymous.
    pub(crate) fn start(args: &[&str]) -> Self {
        let mut defaults = Vec::new();
        if !args.contains(&"--profile") {
            defaults.extend(["--profile", "demo"]);
        }
        if !args.iter().any(|a| a.starts_with("--api-key")) {
            defaults.push("--anonymous");
        }
        Self::start_exact(&[defaults.as_slice(), args].concat())
    }

    /// Starts `wharf serve` with exactly `args` (plus `--listen`).
    pub(crate) fn start_exact(args: &[&str]) -> Self {
        Self::start_on(free_port(), args)
    }

    /// Starts `wharf serve` on `port` with exactly `args` (plus `--listen`).
    pub(crate) fn start_on(port: u16, args: &[&str]) -> Self {
        Self::start_with_env(port, args, &[])
    }

    /// Starts `wharf serve` on `port` with exactly `args` (plus `--listen`) and the
    /// environment variables `env` set.
    pub(crate) fn start_with_env(port: u16, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_at(std::net::Ipv4Addr::LOCALHOST.into(), port, args, env)
    }

    /// Starts `wharf serve` on `ip`:`port` with exactly `args` (plus `--listen`) and the
    /// environment variables `env` set.
    pub(crate) fn start_at(
        ip: std::net::IpAddr,
        port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let listen = std::net::SocketAddr::new(ip, port).to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
            .args(["serve", "--listen", &listen])
            .args(args)
            .env("WHARF_LOG", "warn,wharf=debug")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start wharf serve");
        let log = Log::follow(child.stderr.take().expect("piped stderr"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !answers_http(&listen) {
            assert!(Instant::now() < deadline, "wharf serve did not start");
            if let Ok(Some(status)) = child.try_wait() {
                panic!("wharf serve exited ({status}) before listening on {listen}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        ServerProcess {
            child,
            ip,
            port,
            log,
        }
    }

    /// The MCP endpoint URL.
    pub(crate) fn url(&self) -> String {
        format!("{}/mcp", self.origin())
    }

    /// Where it listens, as an http origin.
    pub(crate) fn origin(&self) -> String {
        format!("http://{}", std::net::SocketAddr::new(self.ip, self.port))
    }

    /// A client of the endpoint.
    pub(crate) fn client(&self) -> HttpClient {
        HttpClient::new(self.url())
    }

    /// Kills the process with SIGKILL, as a crash would, and reaps it.
    pub(crate) fn crash(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM.
    pub(crate) fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for exit, at most `timeout`.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "wharf serve did not exit in time"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A path under the target's directory for test files (`CARGO_TARGET_TMPDIR`), where the
/// tests keep what they write: removed by `cargo clean`, never left in the system's `/tmp`.
pub(crate) fn scratch(name: impl AsRef<std::path::Path>) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// Ports handed out in this process (to servers about to start, or bound by tests).
static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A port nobody listens on right now, and never handed out before in this process: tests
/// run in parallel, and the system may give a port just released to the next caller, so two
/// servers could be started on one port.
/// Runs `wharf serve --listen LISTEN ARGS` with `env`, which must refuse to start: what it
/// wrote to stderr. Waits for its exit; one that started anyway (and would serve until
/// killed) is killed after a minute, failing the test.
pub(crate) fn refused_start(listen: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let child = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["serve", "--listen", listen])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let (tx, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(out) = exited.recv_timeout(Duration::from_secs(60)) else {
        let _ = Command::new("kill").args(["-9", &pid]).status();
        panic!("wharf serve {args:?} started");
    };
    let out = out.unwrap();
    assert!(!out.status.success(), "wharf serve {args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `wharf ARGS` to its end, with no terminal.
pub(crate) fn wharf(args: &[&str]) -> std::process::Output {
    wharf_in(&[], args)
}

/// `wharf ARGS` with environment `env` (and no `WHARF_TOKEN`), run to its end, with no
/// terminal.
pub(crate) fn wharf_in(env: &[(String, String)], args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("WHARF_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run wharf")
}

/// Environment that names `proxy` as every scheme's proxy, and nothing as exempt: a server
/// started with it reaches through `proxy` whatever it does not reach directly.
pub(crate) fn proxy_env(proxy: &str) -> Vec<(&'static str, &str)> {
    [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
    ]
    .into_iter()
    .map(|name| (name, proxy))
    .chain([("NO_PROXY", ""), ("no_proxy", "")])
    .collect()
}

pub(crate) fn free_port() -> u16 {
    loopback_listener().local_addr().unwrap().port()
}

/// A listener on a loopback port the system chose (so nothing else holds it), which
/// [`free_port`] will never hand out: for a test's own servers (an issuer, say).
pub(crate) fn loopback_listener() -> TcpListener {
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return listener;
        }
    }
}

/// [`loopback_listener`] for tokio.
pub(crate) fn tokio_listener() -> tokio::net::TcpListener {
    let listener = loopback_listener();
    listener.set_nonblocking(true).unwrap();
    tokio::net::TcpListener::from_std(listener).unwrap()
}

/// Whether an HTTP server answers at `addr`. A bare connect is not enough: while nothing
/// listens on a port in the ephemeral range, a connect from that same port (which Linux may
/// pick) connects the socket to itself and succeeds.
pub(crate) fn answers_http(addr: &str) -> bool {
    use std::io::{Read as _, Write as _};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let probe = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(probe.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 8];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The vendored schema of revision `rev` ("2026-07-28", or a legacy one: "2025-11-25",
/// "2025-06-18", "2025-03-26").
fn schema_root(rev: &str) -> Value {
    let path = format!(
        "{}/../../spec/{rev}/schema.structural.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("vendored schema"))
        .expect("schema JSON")
}

/// Validates `message` against definition `def` of the vendored schema; panics with the
/// violations otherwise.
pub(crate) fn assert_valid(def: &str, message: &Value) {
    assert_valid_in("2026-07-28", def, message);
}

/// Validates `message` against definition `def` of revision `rev`'s vendored schema.
pub(crate) fn assert_valid_in(rev: &str, def: &str, message: &Value) {
    type Cache = Mutex<HashMap<(String, String), std::sync::Arc<jsonschema::Validator>>>;
    static VALIDATORS: OnceLock<Cache> = OnceLock::new();
    static ROOTS: OnceLock<Mutex<HashMap<String, Value>>> = OnceLock::new();
    let validator = {
        let mut cache = VALIDATORS.get_or_init(Default::default).lock().unwrap();
        cache
            .entry((rev.to_owned(), def.to_owned()))
            .or_insert_with(|| {
                let mut roots = ROOTS.get_or_init(Default::default).lock().unwrap();
                let mut schema = roots
                    .entry(rev.to_owned())
                    .or_insert_with(|| schema_root(rev))
                    .clone();
                // Revisions before 2025-11-25 are draft-07 schemas, their definitions
                // under `definitions`.
                let draft7 = schema.get("definitions").is_some();
                let defs = if draft7 { "definitions" } else { "$defs" };
                schema["$ref"] = Value::String(format!("#/{defs}/{def}"));
                // Formats (uri, byte…) are asserted too, as the conformance suite does.
                let options = if draft7 {
                    jsonschema::draft7::options()
                } else {
                    jsonschema::draft202012::options()
                };
                std::sync::Arc::new(
                    options
                        .should_validate_formats(true)
                        .build(&schema)
                        .expect("compile schema"),
                )
            })
            .clone()
    };
    let errors: Vec<String> = validator
        .iter_errors(message)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "message does not validate as {def} ({rev}): {errors:?}\n{message}"
    );
}

/// Validates one message the server sent a legacy client in answer to `method` against the
/// 2025-11-25 schema, and checks that no field only 2026-07-28 has slipped into a result.
pub(crate) fn validate_legacy(method: &str, m: &Value) {
    validate_legacy_in("2025-11-25", method, m);
}

/// [`validate_legacy`] for a session of revision `rev`.
pub(crate) fn validate_legacy_in(rev: &str, method: &str, m: &Value) {
    // Before 2025-11-25 the response definitions have other names.
    let (result_def, error_def) = if rev < "2025-11-25" {
        ("JSONRPCResponse", "JSONRPCError")
    } else {
        ("JSONRPCResultResponse", "JSONRPCErrorResponse")
    };
    match (m.get("method").and_then(Value::as_str), m.get("id")) {
        (Some(request), Some(_)) => {
            let def = match request {
                "elicitation/create" => "ElicitRequest",
                "sampling/createMessage" => "CreateMessageRequest",
                "roots/list" => "ListRootsRequest",
                other => panic!("unexpected server request {other}: {m}"),
            };
            assert_valid_in(rev, def, m);
            assert_valid_in(rev, "JSONRPCRequest", m);
        }
        (Some(n), None) => assert_valid_in(rev, notification_def(n), m),
        (None, _) if m.get("error").is_some() => assert_valid_in(rev, error_def, m),
        (None, _) => {
            assert_valid_in(rev, result_def, m);
            let def = match method {
                "initialize" => "InitializeResult",
                "tools/list" => "ListToolsResult",
                "tools/call" => "CallToolResult",
                "prompts/list" => "ListPromptsResult",
                "prompts/get" => "GetPromptResult",
                "resources/list" => "ListResourcesResult",
                "resources/templates/list" => "ListResourceTemplatesResult",
                "resources/read" => "ReadResourceResult",
                "completion/complete" => "CompleteResult",
                _ => "EmptyResult",
            };
            assert_valid_in(rev, def, &m["result"]);
            for field in ["resultType", "ttlMs", "cacheScope"] {
                assert!(
                    m["result"].get(field).is_none(),
                    "{field} sent to a legacy client: {m}"
                );
            }
        }
    }
}

/// The schema definition of the response to `method`.
pub(crate) fn response_def(method: &str) -> &'static str {
    match method {
        "server/discover" => "DiscoverResultResponse",
        "tools/list" => "ListToolsResultResponse",
        "tools/call" => "CallToolResultResponse",
        "prompts/list" => "ListPromptsResultResponse",
        "prompts/get" => "GetPromptResultResponse",
        "resources/list" => "ListResourcesResultResponse",
        "resources/templates/list" => "ListResourceTemplatesResultResponse",
        "resources/read" => "ReadResourceResultResponse",
        "completion/complete" => "CompleteResultResponse",
        "subscriptions/listen" => "SubscriptionsListenResultResponse",
        _ => "JSONRPCResultResponse",
    }
}

/// The schema definition of a notification by method.
pub(crate) fn notification_def(method: &str) -> &'static str {
    match method {
        "notifications/progress" => "ProgressNotification",
        "notifications/message" => "LoggingMessageNotification",
        "notifications/tools/list_changed" => "ToolListChangedNotification",
        "notifications/prompts/list_changed" => "PromptListChangedNotification",
        "notifications/resources/list_changed" => "ResourceListChangedNotification",
        "notifications/resources/updated" => "ResourceUpdatedNotification",
        "notifications/subscriptions/acknowledged" => "SubscriptionsAcknowledgedNotification",
        "notifications/cancelled" => "CancelledNotification",
        _ => "JSONRPCNotification",
    }
}

/// Validates one message the server emitted in answer to `method`.
pub(crate) fn validate_message(method: &str, m: &Value) {
    if let Some(n) = m.get("method").and_then(Value::as_str) {
        assert_valid(notification_def(n), m);
    } else if let Some(e) = m.get("error") {
        let def = match e["code"].as_i64() {
            Some(-32020) => "HeaderMismatchError",
            Some(-32021) => "MissingRequiredClientCapabilityError",
            Some(-32022) => "UnsupportedProtocolVersionError",
            _ => "JSONRPCErrorResponse",
        };
        assert_valid(def, m);
    } else {
        assert_valid(response_def(method), m);
        assert_valid("JSONRPCResultResponse", m);
        // These responses take either of two results, and an input-required one needs only
        // its `resultType`, so any object with one passes the response's definition: the
        // result is checked against the one its `resultType` names.
        let complete = match method {
            "tools/call" => Some("CallToolResult"),
            "prompts/get" => Some("GetPromptResult"),
            "resources/read" => Some("ReadResourceResult"),
            _ => None,
        };
        if let Some(complete) = complete {
            match m["result"]["resultType"].as_str() {
                Some("input_required") => assert_valid("InputRequiredResult", &m["result"]),
                _ => assert_valid(complete, &m["result"]),
            }
        }
    }
}

/// Validates every message of a reply to `method`.
pub(crate) fn validate_reply(method: &str, reply: &Reply) {
    for m in &reply.messages {
        validate_message(method, m);
    }
}

/// A `slow_count` call of `steps` steps `interval_ms` apart, with a progress token, opened
/// as a stream; returns once its first progress arrives, which says the handler runs. Until
/// the stream is dropped (which closes its connection and cancels the call) it holds its
/// slots: with many steps, a call that ends only when the test says so.
pub(crate) async fn running_count(
    client: &HttpClient,
    steps: u32,
    interval_ms: u64,
) -> std::pin::Pin<Box<impl futures_util::Stream<Item = Value> + use<>>> {
    use futures_util::StreamExt as _;
    let params = serde_json::json!({ "name": "slow_count",
        "arguments": { "steps": steps, "interval_ms": interval_ms },
        "_meta": { "progressToken": "running" } });
    let mut stream = Box::pin(client.open_stream("tools/call", params).await.unwrap());
    let first = stream.next().await.expect("the call runs");
    assert_eq!(first["method"], "notifications/progress", "{first}");
    validate_message("tools/call", &first);
    stream
}

/// Sends a request and validates everything that comes back.
pub(crate) async fn request(client: &HttpClient, method: &str, params: Value) -> Reply {
    let reply = client.request(method, params).await.expect("request");
    validate_reply(method, &reply);
    reply
}
