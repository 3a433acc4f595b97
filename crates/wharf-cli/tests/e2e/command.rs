//! The `wharf` command as a client: `check` against Wharf, the Python SDK's server and a
//! broken server; `tools` and `call` (typed arguments, answers from flags, progress and
//! Ctrl-C, a form filled in at a terminal); `listen` hearing another client's change and
//! coming back after its server restarts. Interactive runs happen in tmux, whose pane is
//! read back as a person would see it.

use crate::common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::peers::{PythonServer, venv_python};
use common::{ServerProcess, wharf, wharf_in};
use serde_json::{Value, json};

/// Only turns a hang into a failure; nothing is decided by it.
const WAIT: Duration = Duration::from_secs(60);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `wharf check URL --json`: the exit code and the report.
fn check(url: &str, extra: &[&str]) -> (i32, Value) {
    let out = wharf(&[&["check", url, "--json"], extra].concat());
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)));
    (out.status.code().unwrap_or(-1), report)
}

/// The verdict and detail of check `name`.
fn verdict<'a>(report: &'a Value, name: &str) -> (&'a str, &'a str) {
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {report:#}"));
    (
        check["verdict"].as_str().unwrap(),
        check["detail"].as_str().unwrap(),
    )
}

/// A conforming 2026-07-28 server passes every check that applies.
fn assert_conforming(report: &Value, legacy: bool) {
    for name in [
        "discover",
        "get-405",
        "header-mismatch",
        "header-missing",
        "unknown-version",
        "missing-meta",
        "meta-capabilities",
        "name-mismatch",
        "unknown-method",
        "sse-buffering",
    ] {
        assert_eq!(verdict(report, name).0, "pass", "{name}: {report:#}");
    }
    assert_eq!(verdict(report, "auth").0, "skip", "{report:#}");
    assert_eq!(verdict(report, "latency").0, "info");
    let (v, detail) = verdict(report, "legacy-era");
    assert_eq!(v, "info");
    assert_eq!(
        detail.starts_with("legacy clients served too"),
        legacy,
        "{detail}"
    );
    assert_eq!(report["ok"], true);
    assert_eq!(report["summary"]["fail"], 0);
}

#[test]
fn check_passes_wharf_serve_in_either_mode() {
    let server = ServerProcess::start(&[]);
    let (code, report) = check(&server.url(), &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_conforming(&report, true);
    let (_, discover) = verdict(&report, "discover");
    assert!(discover.contains("versions 2026-07-28"), "{discover}");

    let modern = ServerProcess::start(&["--modern-only"]);
    let (code, report) = check(&modern.url(), &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_conforming(&report, false);
}

#[test]
fn check_of_a_protected_server_reads_its_challenge() {
    let key = "alice=0123456789abcdef-key";
    let server = ServerProcess::start(&["--api-key", key]);
    // Without the token most checks cannot run; the challenge has no OAuth metadata, which
    // is a warning (API keys need none), not a failure.
    let (code, report) = check(&server.url(), &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(verdict(&report, "discover").0, "skip");
    let (v, detail) = verdict(&report, "auth");
    assert_eq!(v, "warn", "{detail}");
    assert!(detail.contains("resource_metadata"), "{detail}");
    // With it, the server is checked in full.
    let (code, report) = check(&server.url(), &["--token", "0123456789abcdef-key"]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(verdict(&report, "header-mismatch").0, "pass");
    // A token the server refuses fails the check: a monitor does not stay green with it.
    let (code, report) = check(&server.url(), &["--token", "not-the-key-at-all"]);
    assert_eq!(code, 1, "{report:#}");
    let (v, detail) = verdict(&report, "discover");
    assert_eq!(v, "fail", "{detail}");
    assert!(detail.contains("although a token was sent"), "{detail}");
    // A token the header cannot carry (here, with a space) is refused as malformed (400),
    // and said so: not taken for a legacy server that does not know `server/discover`.
    let (code, report) = check(&server.url(), &["--token", "0123456789abcdef-key x"]);
    assert_eq!(code, 1, "{report:#}");
    let (v, detail) = verdict(&report, "discover");
    assert_eq!(v, "fail", "{detail}");
    assert!(detail.contains("malformed"), "{detail}");
    let out = wharf(&[
        "call",
        &server.url(),
        "echo",
        "text=hi",
        "--token",
        "0123456789abcdef-key x",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let refused = text(&out.stderr);
    assert!(
        refused.contains("malformed") && !refused.contains("initialize"),
        "{refused}"
    );
}

#[test]
fn check_passes_the_python_sdk_server() {
    let sdk = PythonServer::start(&venv_python("pyvenv"), "sdk_server.py");
    let (code, report) = check(&sdk.url, &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_conforming(&report, true);
    assert!(
        verdict(&report, "discover")
            .1
            .starts_with("sdk-check 0.1.0")
    );
}

#[test]
fn check_fails_a_broken_server_and_says_what_is_wrong() {
    let broken = PythonServer::start(&venv_python("pyvenv"), "broken_server.py");
    let (code, report) = check(&broken.url, &[]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["ok"], false);
    let expectations = [
        (
            "get-405",
            "GET answered 200 OK (text/plain); a 2026-07-28 endpoint answers GET with 405",
        ),
        (
            "header-mismatch",
            "with Mcp-Method: prompts/list was answered HTTP 200 with a result; expected HTTP 400 with error -32020",
        ),
        ("header-missing", "expected HTTP 400 with error -32020"),
        ("unknown-version", "expected HTTP 400 with error -32022"),
        ("missing-meta", "expected HTTP 400 with error -32602"),
        ("meta-capabilities", "expected HTTP 400 with error -32602"),
        (
            "name-mismatch",
            "was answered HTTP 200 with error -32602; expected HTTP 400 with error -32020",
        ),
    ];
    for (name, says) in expectations {
        let (v, detail) = verdict(&report, name);
        assert_eq!(v, "fail", "{name}: {detail}");
        assert!(detail.contains(says), "{name}: {detail}");
    }
    // What it does right still passes.
    assert_eq!(verdict(&report, "discover").0, "pass");
    assert_eq!(verdict(&report, "unknown-method").0, "pass");
    assert_eq!(report["summary"]["fail"], expectations.len());

    // The human report says the same, and so does its exit code.
    let out = wharf(&["check", &broken.url]);
    assert_eq!(out.status.code(), Some(1));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("FAIL  get-405") && shown.contains("7 failed"),
        "{shown}"
    );
    // Its reader gone before the report (`wharf check URL | head -n 0`), the failure is
    // still the exit code (it panicked, 101; then it answered 0).
    let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["check", &broken.url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let ended = child.wait_with_output().unwrap();
    let said = text(&ended.stderr);
    assert_eq!(ended.status.code(), Some(1), "{said}");
    assert!(!said.contains("panicked"), "{said}");
}

#[test]
fn check_of_nothing_fails_at_once() {
    let port = common::free_port();
    let (code, report) = check(&format!("http://127.0.0.1:{port}/mcp"), &[]);
    assert_eq!(code, 1);
    let (v, detail) = verdict(&report, "discover");
    assert_eq!(v, "fail");
    assert!(detail.contains("Connection refused"), "{detail}");
    assert_eq!(report["checks"].as_array().unwrap().len(), 1);
}

#[test]
fn tools_and_call_type_their_arguments_from_the_schema() {
    let server = ServerProcess::start(&[]);
    let url = server.url();
    let out = wharf(&["tools", &url]);
    assert!(out.status.success());
    let listed = text(&out.stdout);
    assert!(
        listed.contains("slow_count steps:integer [interval_ms:integer]"),
        "{listed}"
    );
    let out = wharf(&["call", &url, "add", "a=2", "b=40"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        json!({ "sum": 42 })
    );
    // A key for a tool that takes none would not make a retry safe: nothing is sent.
    let out = wharf(&["call", &url, "add", "a=2", "b=40", "--idempotency-key", "k"]);
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(said.contains("not sent"), "{said}");
    let out = wharf(&[
        "call",
        &url,
        "add",
        "--json",
        r#"{"a":1,"b":1}"#,
        "--output",
        "json",
    ]);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["structuredContent"]["sum"], 2);
    common::assert_valid("CallToolResult", &result);
    // The JSON from a file, or from standard input: out of `ps` and shell history.
    let file = common::scratch(common::import::unique("args.json"));
    std::fs::write(&file, r#"{"a":3,"b":4}"#).unwrap();
    let at_file = format!("@{}", file.display());
    let out = wharf(&["call", &url, "add", "--json", &at_file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["sum"],
        7
    );
    let _ = std::fs::remove_file(&file);
    let mut piped = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["call", &url, "add", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut piped.stdin.take().unwrap(), br#"{"a":5,"b":6}"#).unwrap();
    let out = piped.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["sum"],
        11
    );

    // Wrong input is refused before anything is sent, and says why.
    let out = wharf(&["call", &url, "add", "a=2", "b=forty"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("b=forty: expected an integer"));
    let out = wharf(&["call", &url, "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no tool \"nope\"; it has: "));
    // A tool's own error is shown as such, with a failing exit code.
    let out = wharf(&["call", &url, "add", "a=9223372036854775807", "b=1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("overflows a 64-bit integer"));
}

#[test]
fn call_answers_input_requests_from_flags() {
    let server = ServerProcess::start(&["--profile", "conformance"]);
    let url = server.url();
    let out = wharf(&[
        "call",
        &url,
        "test_input_required_result_elicitation",
        "--answer",
        r#"user_name={"action":"accept","content":{"name":"Ada"}}"#,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "Hello, Ada!");
    // Roots and sampling have flags of their own.
    let out = wharf(&[
        "call",
        &url,
        "test_input_required_result_list_roots",
        "--root",
        "file:///srv/a",
        "--root",
        "file:///srv/b",
    ]);
    assert_eq!(
        text(&out.stdout).trim(),
        "The client has 2 roots: file:///srv/a, file:///srv/b"
    );
    let out = wharf(&[
        "call",
        &url,
        "test_input_required_result_sampling",
        "--sampling-reply",
        "Paris",
    ]);
    assert_eq!(text(&out.stdout).trim(), "The model answered: Paris");
    // Without an answer nor a terminal, the error names the flag that would answer.
    let out = wharf(&[
        "call",
        &url,
        "test_input_required_result_multi_round",
        "--answer",
        r#"unrelated={}"#,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(said.contains("pass --answer name=JSON"), "{said}");
    // With no answer at all, the client declared no capability and the server refused up
    // front (-32021): the error still names the flags.
    let out = wharf(&["call", &url, "test_input_required_result_multi_round"]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(said.contains("--answer KEY=JSON"), "{said}");
}

/// Arguments a tool marks `x-mcp-header` travel in `Mcp-Param-*` headers too; Wharf
/// refuses the call without them (-32020).
#[test]
fn call_mirrors_header_arguments() {
    let server = ServerProcess::start(&["--profile", "conformance"]);
    let out = wharf(&[
        "call",
        &server.url(),
        "test_header_param",
        "region=eu-west-1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "region: eu-west-1");
}

/// A write that requires an idempotency key gets one, printed; the retry that reuses it
/// returns the first result instead of writing again.
#[test]
fn call_generates_an_idempotency_key_a_retry_can_reuse() {
    let store = common::import::sqlite_url(&common::import::unique("command-key"));
    let _server = common::import::server(&store);
    let url = _server.url();
    let token = ["--token", common::import::TOKEN_42];
    let begin = |extra: &[&str]| {
        let columns = r#"columns=[{"name":"n","type":"integer"}]"#;
        let base = [
            "call",
            url.as_str(),
            "import_begin",
            "dataset=keyed",
            columns,
            "--output",
            "json",
        ];
        wharf(&[&base[..], &token[..], extra].concat())
    };
    let first = begin(&[]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let said = text(&first.stderr);
    let key = said
        .split_once("idempotency key: ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no key printed: {said}"));
    assert!(said.contains(&format!("--idempotency-key {key}")), "{said}");
    let first: Value = serde_json::from_slice(&first.stdout).unwrap();
    let again = begin(&["--idempotency-key", key]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        !text(&again.stderr).contains("idempotency key:"),
        "a second key was made"
    );
    let again: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        again["structuredContent"], first["structuredContent"],
        "the retry wrote again"
    );
    // Without the key, it is another write: another import.
    let other: Value = serde_json::from_slice(&begin(&[]).stdout).unwrap();
    assert_ne!(
        other["structuredContent"]["import"],
        first["structuredContent"]["import"]
    );
}

/// Against a legacy-only server (the Python SDK's last 1.x), `wharf tools` and `wharf call`
/// fall back to `initialize`; also when the server lets streams be resumed, and opens each
/// with an event of empty data (which the client took for a message that was not JSON, and
/// failed).
#[test]
fn call_against_a_legacy_only_server_falls_back() {
    call_against_a_legacy_server(&[]);
    call_against_a_legacy_server(&["resumable"]);
}

fn call_against_a_legacy_server(mode: &[&str]) {
    let legacy = PythonServer::start_with(&venv_python("pyvenv-legacy"), "legacy_server.py", mode);
    let out = wharf(&["tools", &legacy.url]);
    assert!(
        text(&out.stdout).contains("echo text:string"),
        "{}",
        text(&out.stderr)
    );
    let out = wharf(&["call", &legacy.url, "echo", "text=from the past"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("from the past"));
    // This era asks on the call's stream; the answer goes back as a response to it.
    let out = wharf(&[
        "call",
        &legacy.url,
        "greet",
        "--answer",
        r#"elicitation/create={"action":"accept","content":{"name":"Ada"}}"#,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let greeted: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(greeted, json!({ "result": "Hello, Ada!" }));
    // Unanswered, the server is told so (it does not wait), and the error names the flag.
    let out = wharf(&["call", &legacy.url, "greet", "--answer", "other={}"]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(
        said.contains("pass --answer elicitation/create=JSON"),
        "{said}"
    );
}

/// A terminal: a tmux server of its own running one command in a pane.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Runs `command` in a 120×30 pane; the pane stays after it exits, showing `EXIT=code`.
    fn run(command: &str) -> Self {
        let socket = format!("wharf-test-{}-{}", std::process::id(), common::free_port());
        let shell = format!("{command}; echo EXIT=$?; sleep 600");
        let status = Command::new("tmux")
            .args([
                "-L",
                &socket,
                "new-session",
                "-d",
                "-x",
                "120",
                "-y",
                "30",
                &shell,
            ])
            .env("TERM", "xterm-256color")
            .status()
            .expect("tmux is required (scripts/test.sh installs it)");
        assert!(status.success());
        Tmux { socket }
    }

    /// What the pane shows now.
    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p"])
            .output()
            .unwrap();
        text(&out.stdout)
    }

    /// Waits until the pane shows `needle`; returns the screen.
    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let screen = self.screen();
            if screen.contains(needle) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "the terminal never showed {needle:?}; it shows:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Types `keys` (tmux key names, e.g. `Enter`, `C-c`, or literal text).
    fn keys(&self, keys: &[&str]) {
        let status = Command::new("tmux")
            .args(["-L", &self.socket, "send-keys"])
            .args(keys)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

/// At a terminal, `wharf user add` asks for the password twice and never shows it.
#[test]
fn user_add_at_a_terminal_does_not_show_the_password() {
    let store = common::import::sqlite_url(&common::import::unique("user-tty"));
    let term = Tmux::run(&format!(
        "{} user add bob --store {store}",
        env!("CARGO_BIN_EXE_wharf")
    ));
    let typed = "a-secret-typed-here";
    term.wait_for("Password");
    term.keys(&["-l", typed]);
    term.keys(&["Enter"]);
    term.wait_for("Again");
    term.keys(&["-l", typed]);
    term.keys(&["Enter"]);
    let screen = term.wait_for("EXIT=");
    assert!(screen.contains("EXIT=0"), "{screen}");
    assert!(!screen.contains(typed), "{screen}");
    let said = common::authz::user_command(&store, "passwd", "bob", "another-password");
    assert!(!said.contains("no user"), "{said}");
}

fn shell_command(url: &str, args: &str) -> String {
    format!("{} call {url} {args}", env!("CARGO_BIN_EXE_wharf"))
}

#[test]
fn call_shows_progress_and_ctrl_c_cancels_it() {
    let server = ServerProcess::start(&[]);
    let url = server.url();
    let term = Tmux::run(&shell_command(&url, "slow_count steps=1000 interval_ms=50"));
    // The bar counts steps out of the total the server reports.
    term.wait_for("/1000");
    term.wait_for("step 3");
    term.keys(&["C-c"]);
    let screen = term.wait_for("EXIT=130");
    assert!(
        screen.contains("cancelled (Ctrl-C): the call's stream is closed"),
        "{screen}"
    );
    // The server saw the stream close and ran the call's cancellation cleanup.
    let deadline = Instant::now() + WAIT;
    loop {
        let out = wharf(&["call", &url, "demo_stats"]);
        let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
        if stats["slowCountsCancelled"] == 1 {
            assert_eq!(stats["slowCountsStarted"], 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the call was never cancelled: {stats}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn call_fills_in_a_form_at_the_terminal() {
    let server = ServerProcess::start(&["--profile", "conformance"]);
    let term = Tmux::run(&shell_command(
        &server.url(),
        "test_input_required_result_multi_round",
    ));
    term.wait_for("Step 1: what is your name?");
    term.wait_for("Decline");
    term.keys(&["Enter"]);
    term.wait_for("(Your name)");
    term.keys(&["-l", "Grace"]);
    term.keys(&["Enter"]);
    // The second round carries the first's state; the answer is typed the same way.
    term.wait_for("Step 2: what is your favourite colour?");
    term.keys(&["Enter"]);
    term.wait_for("(A colour)");
    term.keys(&["-l", "green"]);
    term.keys(&["Enter"]);
    let screen = term.wait_for("EXIT=");
    assert!(screen.contains("Grace likes green"), "{screen}");
    assert!(screen.contains("EXIT=0"), "{screen}");
}

/// `wharf listen` as a child process whose output lines arrive on a channel.
struct Listener {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Listener {
    fn start(url: &str, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
            .args([&["listen", url], args].concat())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Listener { child, lines }
    }

    /// The first line from now on that contains `needle`.
    fn line_with(&self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => panic!("wharf listen never printed {needle:?} ({e})"),
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn listen_prints_another_clients_change_and_comes_back_after_a_restart() {
    let port = common::free_port();
    let args = ["--profile", "conformance", "--anonymous"];
    let server = ServerProcess::start_on(port, &args);
    let url = server.url();
    let listener = Listener::start(&url, &["--tools"]);
    listener.line_with("listening for");
    let count = listener.line_with("tools: ");
    let out = wharf(&["call", &url, "test_trigger_tool_change"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    listener.line_with("notifications/tools/list_changed");
    // The list is read again, and compared with what it was.
    let relisted = listener.line_with("tools: ");
    assert!(
        relisted.ends_with(&format!(
            "{} (no change)",
            count.split_once("tools: ").unwrap().1
        )),
        "{count} / {relisted}"
    );

    // The server goes away and comes back: the listener reconnects and reads the list again,
    // since it may have missed a change meanwhile.
    drop(server);
    listener.line_with("reconnecting");
    let server = ServerProcess::start_on(port, &args);
    listener.line_with("listening for");
    listener.line_with("tools: ");
    let out = wharf(&["call", &server.url(), "test_trigger_tool_change"]);
    assert!(out.status.success());
    listener.line_with("notifications/tools/list_changed");
}

/// `wharf listen URL --tools`, once it has listed the tools (so it listens): the process
/// and its stdout, read up to there.
fn listening_to_tools(url: &str) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["listen", url, "--tools"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("tools: ") {
        line.clear();
        let read = stdout.read_line(&mut line).unwrap();
        assert!(read > 0, "wharf listen ended before it listed the tools");
    }
    (child, stdout)
}

/// `wharf listen | head -n 1`: once its reader has gone, the next line it would print
/// ends it quietly and successfully, as a pipeline expects (it panicked, exit 101).
#[test]
fn listen_ends_quietly_once_its_reader_goes() {
    let server = ServerProcess::start_exact(&["--profile", "conformance", "--anonymous"]);
    let url = server.url();
    let (child, stdout) = listening_to_tools(&url);
    drop(stdout);
    let out = wharf(&["call", &url, "test_trigger_tool_change"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ended = child.wait_with_output().unwrap();
    let said = text(&ended.stderr);
    assert_eq!(ended.status.code(), Some(0), "{said}");
    assert!(!said.contains("panicked"), "{said}");
}

/// `wharf listen` stopped by SIGTERM (`timeout`, a service manager) says so and exits
/// 143, as Ctrl-C makes it exit 130: it was killed outright before, ending no session.
#[test]
fn listen_stops_on_sigterm_and_says_so() {
    let server = ServerProcess::start_exact(&["--profile", "conformance", "--anonymous"]);
    let url = server.url();
    let (child, mut stdout) = listening_to_tools(&url);
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // Its status lines go to stdout, with the notifications (to stderr with --json).
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut said = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut said).unwrap();
        let _ = done.send((said, child.wait_with_output().unwrap()));
    });
    // The deadline only turns a hang (SIGTERM taken and ignored) into a failure.
    let (said, ended) = ended.recv_timeout(WAIT).expect("wharf listen ended");
    assert_eq!(ended.status.code(), Some(143), "{said}");
    assert!(said.contains("stopped (SIGTERM)"), "{said}");
}

/// Runs `wharf login URL --no-browser` in `env` while Chromium plays the person at the
/// sign-in URL it prints; returns what it printed on standard output.
async fn log_in(url: &str, env: &[(String, String)]) -> String {
    use common::authz::PASSWORD;
    use common::chromium::{browser, sign_in_and_allow};

    let mut login = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["login", url, "--no-browser"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(login.stderr.take().unwrap());
    let sign_in_url = stderr
        .lines()
        .map(Result::unwrap)
        .find(|l| l.trim_start().starts_with("http://"))
        .expect("wharf login printed no sign-in URL")
        .trim()
        .to_owned();
    assert!(
        sign_in_url.contains("code_challenge_method=S256"),
        "{sign_in_url}"
    );
    let (_driver, chromium) = browser().await;
    chromium.goto(&sign_in_url).await.unwrap();
    sign_in_and_allow(&chromium, "alice", PASSWORD).await;
    let out = tokio::task::spawn_blocking(move || login.wait_with_output().unwrap())
        .await
        .unwrap();
    chromium.close().await.unwrap();
    assert!(out.status.success(), "{}", text(&out.stdout));
    let said = text(&out.stdout);
    eprintln!("{said}");
    assert!(said.starts_with(&format!("Logged in to {url}")), "{said}");
    said
}

/// `wharf login` against the embedded authorization server, Chromium playing the person:
/// the tokens land in a file only the user can read, the next commands use them, and an
/// expired one is refreshed on the way (and the rotated refresh token kept).
#[tokio::test]
async fn login_signs_in_through_a_browser_and_later_commands_use_the_token() {
    use common::authz::own_server;
    use std::os::unix::fs::PermissionsExt as _;

    // No retry window: two commands presenting one refresh token would be taken for theft,
    // which is what shows that the commands below refresh once between them.
    let server = own_server("login", "demo", &["--authz-refresh-retry-secs", "0"]);
    let url = server.url();
    let config = common::scratch(common::import::unique("wharf-config"));
    let env = [(
        "WHARF_CONFIG_DIR".to_owned(),
        config.to_str().unwrap().to_owned(),
    )];
    let out = wharf_in(&env, &["call", &url, "echo", "text=hi"]);
    assert_eq!(out.status.code(), Some(1));
    let refused = text(&out.stderr);
    assert!(
        refused.contains(&format!("run `wharf login {url}`")),
        "{refused}"
    );
    // The probe follows the challenge to the authorization server.
    let out = wharf_in(&env, &["check", &url, "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (v, detail) = verdict(&report, "auth");
    assert_eq!(v, "pass", "{detail}");
    assert!(detail.contains("PKCE S256"), "{detail}");
    // Reached by another name (as through a proxy the server does not know of), its
    // metadata describes another resource: a failure, as `wharf login` would refuse it.
    let renamed = url.replace("127.0.0.1", "localhost");
    let out = wharf_in(&env, &["check", &renamed, "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (v, detail) = verdict(&report, "auth");
    assert_eq!(v, "fail", "{detail}");
    assert!(detail.contains("RFC 9728"), "{detail}");

    // A URL that is not the endpoint is not taken for a server that asks no token.
    let origin = url.trim_end_matches("/mcp");
    let out = wharf_in(&env, &["login", origin, "--no-browser"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let said = text(&out.stderr);
    assert!(said.contains("HTTP 404") && said.contains("/mcp"), "{said}");

    let said = log_in(&url, &env).await;
    let file = config.join("tokens.json");
    assert!(
        said.contains(&format!("Kept in {}", file.display())),
        "{said}"
    );
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is readable by others");
    let stored = |file: &std::path::Path| -> Value {
        serde_json::from_slice::<Value>(&std::fs::read(file).unwrap()).unwrap()[&url].clone()
    };
    let first = stored(&file);
    assert!(first["refresh_token"].is_string(), "{first}");

    let out = wharf_in(&env, &["call", &url, "echo", "text=signed in"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "signed in");

    // The access token is about to lapse: the next command refreshes it first.
    let mut all: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    all[&url]["expires_at"] = json!(1);
    std::fs::write(&file, all.to_string()).unwrap();
    let out = wharf_in(&env, &["call", &url, "echo", "text=refreshed"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "refreshed");
    let second = stored(&file);
    assert_ne!(second["access_token"], first["access_token"]);
    assert_ne!(
        second["refresh_token"], first["refresh_token"],
        "not rotated"
    );
    assert!(second["expires_at"].as_u64().unwrap() > 1);

    // A token the server refuses before its stated expiry is refreshed, and the command
    // goes on.
    let mut all: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    all[&url]["access_token"] = json!("revoked-before-its-time");
    std::fs::write(&file, all.to_string()).unwrap();
    let out = wharf_in(&env, &["call", &url, "echo", "text=again"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "again");
    let third = stored(&file);
    assert_ne!(third["access_token"], "revoked-before-its-time");
    assert_ne!(third["refresh_token"], second["refresh_token"]);

    // Commands started together on a lapsed token refresh it once between them: a refresh
    // token presented twice would be taken for theft and the login revoked.
    let mut all: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    all[&url]["expires_at"] = json!(1);
    std::fs::write(&file, all.to_string()).unwrap();
    let together: Vec<_> = (0..4)
        .map(|n| {
            Command::new(env!("CARGO_BIN_EXE_wharf"))
                .args(["call", &url, "echo", &format!("text=together {n}")])
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env_remove("WHARF_TOKEN")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run wharf")
        })
        .collect();
    for child in together {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let out = wharf_in(&env, &["call", &url, "echo", "text=still signed in"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A desktop session: a D-Bus session bus with GNOME Keyring's Secret Service on it, its
/// files under a directory of its own.
struct Desktop {
    root: std::path::PathBuf,
    bus: std::process::Child,
    keyring: std::process::Child,
    env: Vec<(String, String)>,
}

impl Desktop {
    fn start() -> Self {
        // In the system's temporary directory, not the target's: the keyring's socket lives
        // under it, and a socket path may not exceed 108 bytes. Removed when dropped.
        let root = std::env::temp_dir().join(common::import::unique("wharf-desktop"));
        let dir = |name: &str| {
            let d = root.join(name);
            std::fs::create_dir_all(&d).unwrap();
            d.to_str().unwrap().to_owned()
        };
        let runtime = dir("run");
        std::fs::set_permissions(
            &runtime,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let mut env = vec![
            ("HOME".to_owned(), dir("home")),
            ("XDG_DATA_HOME".to_owned(), dir("data")),
            ("XDG_CONFIG_HOME".to_owned(), dir("config")),
            ("XDG_RUNTIME_DIR".to_owned(), runtime.clone()),
        ];
        let mut bus = Command::new("dbus-daemon")
            // Its socket in the session's runtime directory, not in /tmp, so that it goes
            // with the rest of the session's files.
            .args(["--session", "--nofork", "--print-address=1"])
            .arg(format!("--address=unix:dir={runtime}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("dbus-daemon is required (scripts/test.sh installs it)");
        let mut address = String::new();
        BufReader::new(bus.stdout.take().unwrap())
            .read_line(&mut address)
            .unwrap();
        env.push((
            "DBUS_SESSION_BUS_ADDRESS".to_owned(),
            address.trim().to_owned(),
        ));
        let mut keyring = Command::new("gnome-keyring-daemon")
            .args(["--foreground", "--unlock", "--components=secrets"])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("gnome-keyring-daemon is required (scripts/test.sh installs gnome-keyring)");
        // The keyring's password, then end of input.
        drop(
            keyring
                .stdin
                .take()
                .map(|mut s| std::io::Write::write_all(&mut s, b"desktop")),
        );
        let desktop = Desktop {
            root,
            bus,
            keyring,
            env,
        };
        let deadline = Instant::now() + WAIT;
        while !desktop.has_secret_service() {
            assert!(
                Instant::now() < deadline,
                "the Secret Service never came up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        desktop
    }

    fn has_secret_service(&self) -> bool {
        let out = Command::new("dbus-send")
            .args([
                "--session",
                "--print-reply",
                "--dest=org.freedesktop.DBus",
                "/org/freedesktop/DBus",
                "org.freedesktop.DBus.NameHasOwner",
                "string:org.freedesktop.secrets",
            ])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        text(&out.stdout).contains("boolean true")
    }
}

impl Drop for Desktop {
    fn drop(&mut self) {
        for child in [&mut self.keyring, &mut self.bus] {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// On a desktop with a keyring, `wharf login` keeps the tokens there and writes no file.
#[tokio::test]
async fn login_keeps_tokens_in_the_keyring_when_there_is_one() {
    let server = common::authz::own_server("login-keyring", "demo", &[]);
    let url = server.url();
    let desktop = Desktop::start();
    let said = log_in(&url, &desktop.env).await;
    assert!(said.ends_with("Kept in the OS keyring.\n"), "{said}");
    let home = &desktop.env[0].1;
    let config = &desktop.env[2].1;
    for dir in [format!("{home}/.config/wharf"), format!("{config}/wharf")] {
        assert!(
            !std::path::Path::new(&dir).join("tokens.json").exists(),
            "a token file was written beside the keyring"
        );
    }
    let out = wharf_in(
        &desktop.env,
        &["call", &url, "echo", "text=from the keyring"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "from the keyring");
    // Another desktop's keyring does not have it.
    let other = Desktop::start();
    let out = wharf_in(&other.env, &["call", &url, "echo", "text=x"]);
    assert_eq!(out.status.code(), Some(1));
}

/// A login kept in the keyring leaves no copy in the token file (one written where the
/// keyring did not answer, an SSH session say): a copy read there would send a refresh token
/// already used, and the authorization server would revoke the whole login.
#[tokio::test]
async fn a_login_kept_in_the_keyring_leaves_no_copy_in_the_file() {
    let server = common::authz::own_server("login-one-copy", "demo", &[]);
    let url = server.url();
    let desktop = Desktop::start();
    let mut without_keyring: Vec<(String, String)> = desktop
        .env
        .iter()
        .filter(|(k, _)| k != "DBUS_SESSION_BUS_ADDRESS")
        .cloned()
        .collect();
    without_keyring.push((
        "DBUS_SESSION_BUS_ADDRESS".to_owned(),
        "unix:path=/nonexistent/bus".to_owned(),
    ));
    let said = log_in(&url, &without_keyring).await;
    assert!(!said.contains("OS keyring"), "{said}");
    let file = [&desktop.env[2].1, &format!("{}/.config", desktop.env[0].1)]
        .iter()
        .map(|dir| std::path::Path::new(dir.as_str()).join("wharf/tokens.json"))
        .find(|f| f.exists())
        .expect("the login without a keyring wrote the token file");
    let kept = |file: &std::path::Path| std::fs::read_to_string(file).unwrap_or_default();
    assert!(
        kept(&file).contains(url.trim_end_matches('/')),
        "{}",
        kept(&file)
    );

    let said = log_in(&url, &desktop.env).await;
    assert!(said.ends_with("Kept in the OS keyring.\n"), "{said}");
    assert!(
        !kept(&file).contains(url.trim_end_matches('/')),
        "the file kept a second copy: {}",
        kept(&file)
    );
}

/// `wharf serve` refuses, naming both flags, to keep a write's record for less time than a
/// call may run: a retry could find the first attempt's claim expired while it still ran.
#[test]
fn serve_refuses_a_retention_shorter_than_a_call() {
    let dir = std::env::temp_dir().join(format!("wharf-retention-{}", std::process::id()));
    let store = format!("sqlite://{}/w.db", dir.display());
    let out = wharf(&[
        "serve",
        "--anonymous",
        "--listen",
        "127.0.0.1:0",
        "--store",
        &store,
        "--idempotency-retention-hours",
        "1",
        "--max-call-secs",
        "3600",
    ]);
    assert!(!out.status.success(), "it started");
    let said = text(&out.stderr);
    assert!(
        said.contains("--idempotency-retention-hours 1")
            && said.contains("--max-call-secs 3600")
            && said.contains("outlive"),
        "{said}"
    );

    // A profile that keeps nothing, without a store, keeps no records: nothing to refuse,
    // and it serves (started, and healthy, or this panics).
    let _serving = ServerProcess::start_exact(&[
        "--profile",
        "demo",
        "--anonymous",
        "--max-call-secs",
        "86400",
    ]);
}

/// `wharf user` says which store it changed, a relative SQLite path as the file it opened
/// from where it ran (an account added from the wrong directory went to a database the
/// server never reads), and refuses `memory://`, which keeps nothing after the command.
#[test]
fn user_names_the_store_it_changed_and_refuses_a_throwaway_one() {
    let dir = common::scratch(common::import::unique("user-cwd"));
    std::fs::create_dir_all(&dir).unwrap();
    let add = |store: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
            .args(["user", "add", "dora", "--store", store])
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"a-long-enough-password\n").unwrap();
        drop(stdin);
        child.wait_with_output().unwrap()
    };
    let added = add("sqlite://./users.db");
    let said = text(&added.stderr);
    assert!(added.status.success(), "{said}");
    let file = std::fs::canonicalize(dir.join("users.db")).unwrap();
    assert!(
        said.contains(&format!("user dora added to sqlite://{}", file.display())),
        "{said}"
    );
    let refused = add("memory://");
    let said = text(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("keep nothing after this command ends"),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
