//! What a stdio server does when something breaks: a request whose work panics outside
//! its handler, a client that stops taking output, an `initialize` under a running
//! request's id.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::sync::{Notify, oneshot};
use wharf::protocol::Implementation;
use wharf::{Caller, Context, Next, NoArgs, ParsedRequest, Server, tool};
use wharf_stdio::{StdioConfig, serve_with};

/// `_meta` of a 2026-07-28 request.
fn meta() -> Value {
    json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {} })
}

fn call(id: Value, name: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": { "_meta": meta(), "name": name, "arguments": {} } })
}

async fn send(to_server: &mut DuplexStream, m: &Value) {
    to_server
        .write_all(format!("{m}\n").as_bytes())
        .await
        .unwrap();
}

async fn next(lines: &mut Lines<BufReader<DuplexStream>>) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("an answer in time")
        .unwrap()
        .expect("a line");
    serde_json::from_str(&line).unwrap()
}

/// `server` served over in-memory pipes with `config`: what the client writes to, what it
/// reads, and the serving task.
fn serving(
    server: Server,
    config: StdioConfig,
) -> (
    DuplexStream,
    DuplexStream,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (to_server, server_in) = tokio::io::duplex(64 * 1024);
    let (server_out, from_server) = tokio::io::duplex(64 * 1024);
    let served = tokio::spawn(serve_with(server, server_in, server_out, config));
    (to_server, from_server, served)
}

/// A server with one tool, `hold` (see [`holding`]).
fn holding_server(started: &Arc<Notify>, cancelled: oneshot::Sender<()>) -> Server {
    Server::builder(Implementation::new("t", "1"))
        .tool(holding(Arc::clone(started), cancelled))
        .build()
        .unwrap()
}

/// A tool, `hold`, that says when it started (`started`), then waits until it is cut
/// short, which it reports on `cancelled`.
fn holding(started: Arc<Notify>, cancelled: oneshot::Sender<()>) -> wharf::ToolDef {
    let cancelled = std::sync::Mutex::new(Some(cancelled));
    tool("hold").handler(move |cx: Context, _: NoArgs| {
        let report = cancelled.lock().unwrap().take();
        let started = Arc::clone(&started);
        async move {
            if let Some(report) = report {
                cx.on_cancel(async move {
                    let _ = report.send(());
                });
            }
            started.notify_one();
            std::future::pending::<String>().await
        }
    })
}

/// A middleware's panic (outside the handler, whose own the core catches) answers its
/// request -32603 under its id, and leaves the id and the request's slot free: with room
/// for one request at a time, the same id is served next.
#[tokio::test]
async fn a_request_that_panics_outside_its_handler_is_answered_and_frees_its_id() {
    let armed = Arc::new(AtomicBool::new(true));
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("hello").handler(|_cx: Context, _: NoArgs| async { "hello" }))
        .middleware({
            let armed = Arc::clone(&armed);
            move |req: ParsedRequest, caller: Caller, next: Next| {
                let armed = Arc::clone(&armed);
                async move {
                    if armed.swap(false, Ordering::SeqCst) {
                        panic!("a middleware's bug");
                    }
                    next.run(req, caller).await
                }
            }
        })
        .build()
        .unwrap();
    let mut config = StdioConfig::default();
    config.max_in_flight = 1;
    let (mut to_server, from_server, served) = serving(server, config);
    let mut lines = BufReader::new(from_server).lines();

    send(&mut to_server, &call(json!(1), "hello")).await;
    let m = next(&mut lines).await;
    assert_eq!(m["id"], 1, "{m}");
    assert_eq!(m["error"]["code"], -32603, "{m}");
    assert!(!armed.load(Ordering::SeqCst));

    send(&mut to_server, &call(json!(1), "hello")).await;
    let m = next(&mut lines).await;
    assert_eq!(m["id"], 1, "{m}");
    assert_eq!(m["result"]["content"][0]["text"], "hello", "{m}");
    drop(to_server);
    served.await.unwrap().unwrap();
}

/// A client that closed its end of the output (while still writing input) ends the
/// session at the first answer that cannot go: the server stops reading, cuts short what
/// still runs, and says why.
#[tokio::test]
async fn output_that_fails_ends_the_session_and_cancels_what_runs() {
    let (started, (report, cancelled)) = (Arc::new(Notify::new()), oneshot::channel());
    let server = holding_server(&started, report);
    let (mut to_server, from_server, served) = serving(server, StdioConfig::default());
    send(&mut to_server, &call(json!(1), "hold")).await;
    started.notified().await;
    drop(from_server);
    // Its answer is the first write to fail.
    send(&mut to_server, &call(json!(2), "no-such-tool")).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the session ended while its input stayed open")
        .unwrap();
    assert_eq!(
        ended.unwrap_err().kind(),
        std::io::ErrorKind::BrokenPipe,
        "the write's error"
    );
    tokio::time::timeout(Duration::from_secs(10), cancelled)
        .await
        .expect("the running call was cut short")
        .unwrap();
    drop(to_server);
}

/// `initialize` under the id of a running request is refused (-32600): its client would
/// get two responses with one id.
#[tokio::test]
async fn initialize_under_a_running_id_is_refused() {
    let (started, (report, _cancelled)) = (Arc::new(Notify::new()), oneshot::channel());
    let server = holding_server(&started, report);
    let mut config = StdioConfig::default();
    config.drain = Duration::from_millis(100);
    let (mut to_server, from_server, served) = serving(server, config);
    let mut lines = BufReader::new(from_server).lines();
    send(&mut to_server, &call(json!(7), "hold")).await;
    started.notified().await;
    let initialize = |id: i64| {
        json!({ "jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": { "name": "t", "version": "1" } } })
    };
    send(&mut to_server, &initialize(7)).await;
    let m = next(&mut lines).await;
    assert_eq!(m["id"], 7, "{m}");
    assert_eq!(m["error"]["code"], -32600, "{m}");
    assert!(
        m["error"]["message"].as_str().unwrap().contains("in use"),
        "{m}"
    );
    send(&mut to_server, &initialize(8)).await;
    let m = next(&mut lines).await;
    assert_eq!(m["id"], 8, "{m}");
    assert_eq!(m["result"]["protocolVersion"], "2025-11-25", "{m}");
    // The held call is cut short when input ends and the drain runs out.
    drop(to_server);
    served.await.unwrap().unwrap();
}

/// A handler that leaves work behind with its `Context` (a task it spawned) sends nothing
/// for its request once the response went out, as over HTTP: the task hears the request
/// ended (`Context::cancelled`), and what it then logs or reports goes nowhere (2026-07-28
/// stdio: no further messages for a request that ended).
#[tokio::test]
async fn a_context_kept_after_the_response_sends_nothing_more() {
    let (left, mut done) = tokio::sync::mpsc::unbounded_channel();
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("leaves_work").handler(move |cx: Context, _: NoArgs| {
            let left = left.clone();
            async move {
                tokio::spawn(async move {
                    cx.cancelled().await;
                    cx.log(wharf::protocol::LoggingLevel::Error, None, json!("late"))
                        .await;
                    cx.progress(1.0, None, Some("late")).await;
                    let _ = left.send(());
                });
                "returned"
            }
        }))
        .logging(true)
        .build()
        .unwrap();
    let (mut to_server, from_server, served) = serving(server, StdioConfig::default());
    let mut lines = BufReader::new(from_server).lines();
    let mut asked = call(json!(1), "leaves_work");
    asked["params"]["_meta"]["progressToken"] = json!("p");
    asked["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!("debug");
    send(&mut to_server, &asked).await;
    let m = next(&mut lines).await;
    assert_eq!(m["result"]["content"][0]["text"], "returned", "{m}");
    tokio::time::timeout(Duration::from_secs(10), done.recv())
        .await
        .expect("the task left behind heard its request end");
    send(&mut to_server, &call(json!(2), "no-such-tool")).await;
    let m = next(&mut lines).await;
    assert_eq!(m["id"], 2, "the next line is the next request's: {m}");
    drop(to_server);
    served.await.unwrap().unwrap();
}

/// A client that stops reading stdout does not hold a handler back: what the handler logs
/// beyond the room there is dropped after a moment, as over HTTP, and it finishes (its
/// transaction, locks and turns let go), though its answer waits for the client.
#[tokio::test]
async fn a_client_that_stops_reading_does_not_hold_a_handler_back() {
    let (finished, mut done) = tokio::sync::mpsc::unbounded_channel();
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("chatty").handler(move |cx: Context, _: NoArgs| {
            let finished = finished.clone();
            async move {
                let line = "x".repeat(1024);
                for _ in 0..2_000 {
                    cx.log(wharf::protocol::LoggingLevel::Info, None, json!(line))
                        .await;
                }
                let _ = finished.send(());
                "done"
            }
        }))
        .logging(true)
        .build()
        .unwrap();
    let (mut to_server, from_server, served) = serving(server, StdioConfig::default());
    let mut asked = call(json!(1), "chatty");
    asked["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
    send(&mut to_server, &asked).await;
    // Two megabytes of logs, none of them read.
    tokio::time::timeout(Duration::from_secs(60), done.recv())
        .await
        .expect("the handler finished while nobody read its output");
    drop(from_server);
    served.abort();
}
