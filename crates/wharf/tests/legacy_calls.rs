//! A legacy call whose client keeps its stream open without reading it: the call's answer
//! waits for room on the stream, and neither a cancellation nor the session's end may wait
//! behind it. The call ends when either comes, and with it its slot.

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use tokio::sync::{Notify, mpsc};
use wharf::protocol::{Implementation, RequestId};
use wharf::{Answer, Context, NoArgs, Principal, Scope, Server, ServerConfig, Session, tool};

/// A server with room for one call at a time, and one tool, which says when it returns.
fn server(returned: &Arc<Notify>) -> Server {
    let mut config = ServerConfig::default();
    config.limits.max_in_flight = Some(1);
    let returned = Arc::clone(returned);
    Server::builder(Implementation::new("t", "1"))
        .config(config)
        .tool(tool("done").handler(move |_cx: Context, _: NoArgs| {
            let returned = Arc::clone(&returned);
            async move {
                returned.notify_one();
                "done"
            }
        }))
        .build()
        .unwrap()
}

fn raw(json: &str) -> Box<RawValue> {
    RawValue::from_string(json.to_owned()).unwrap()
}

async fn open(server: &Server, who: &Principal) -> Session {
    let init = raw(
        r#"{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}"#,
    );
    let (session, _) = server
        .sessions()
        .initialize(RequestId::Int(0), Some(&init), who, Scope::Shared)
        .await
        .unwrap();
    session
}

/// Starts call 1 of `session` as a stream that is full already and never read, and returns
/// once its handler returned: the call then waits to send its answer.
async fn stuck_call(
    server: &Server,
    returned: &Notify,
    session: &mut Session,
    who: &Principal,
) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<Vec<u8>>) {
    let params = raw(r#"{"name":"done","arguments":{}}"#);
    let answer = server
        .sessions()
        .request(
            session,
            RequestId::Int(1),
            "tools/call",
            Some(&params),
            who.clone(),
            Default::default(),
        )
        .await
        .unwrap();
    let Answer::Call(call) = answer else {
        panic!("a tool call is run as a call");
    };
    let (outbox, unread) = mpsc::channel(1);
    outbox.send(b"filler".to_vec()).await.unwrap();
    let call = tokio::spawn(call.stream(outbox));
    returned.notified().await;
    // What follows the handler in the call's task runs up to the send.
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    (call, unread)
}

/// Whether `task` ends: the guard only bounds a failure (the call used to wait for room for
/// ever).
async fn ends(task: tokio::task::JoinHandle<()>) -> bool {
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .is_ok()
}

#[tokio::test]
async fn a_cancellation_ends_a_call_whose_stream_is_not_read() {
    let returned = Arc::new(Notify::new());
    let server = server(&returned);
    let alice = Principal::new("alice").unwrap();
    let mut session = open(&server, &alice).await;
    let (call, _unread) = stuck_call(&server, &returned, &mut session, &alice).await;
    let cancel = raw(r#"{"requestId":1}"#);
    server
        .sessions()
        .notify(&session, "notifications/cancelled", Some(&cancel))
        .await
        .unwrap();
    assert!(ends(call).await, "the cancelled call still waits");
    // Its slot is free: the next call is admitted.
    let (next, _unread) = stuck_call(&server, &returned, &mut session, &alice).await;
    next.abort();
}

#[tokio::test]
async fn a_sessions_end_ends_its_call_whose_stream_is_not_read() {
    let returned = Arc::new(Notify::new());
    let server = server(&returned);
    let alice = Principal::new("alice").unwrap();
    let mut session = open(&server, &alice).await;
    let (call, _unread) = stuck_call(&server, &returned, &mut session, &alice).await;
    server.sessions().end(&session).await.unwrap();
    assert!(ends(call).await, "the ended session's call still waits");
}
