//! A scripted issuer endpoint for this module's tests (discovery, JWKS, introspection). It
//! listens on a real socket, so reqwest's whole path runs, and counts what it received.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::Notify;

/// What the endpoint does with each request it receives.
pub(super) enum Answer {
    /// The same whole HTTP response to every request.
    Every(String),
    /// The n-th response to the n-th request; a request past the script gets its
    /// connection closed unanswered.
    Script(Vec<String>),
    /// The same response to every request, each sent once the `Notify` hands out a permit.
    Released(String, Arc<Notify>),
    /// No answer: every connection is held open until the test ends.
    Never,
}

/// An endpoint started by [`start`].
pub(super) struct Peer {
    /// `http://127.0.0.1:PORT`.
    pub(super) origin: String,
    /// How many requests arrived (counted before any answer).
    pub(super) requests: Arc<AtomicUsize>,
}

/// Starts an endpoint on 127.0.0.1 that treats each connection as one request; `answer`
/// is given the endpoint's origin, for answers that name it.
pub(super) async fn start(answer: impl FnOnce(&str) -> Answer) -> Peer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let answer = Arc::new(answer(&origin));
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (counted, answer) = (Arc::clone(&counted), Arc::clone(&answer));
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let n = counted.fetch_add(1, Ordering::SeqCst);
                let response = match &*answer {
                    Answer::Every(response) => response,
                    Answer::Script(responses) => match responses.get(n) {
                        Some(response) => response,
                        None => return,
                    },
                    Answer::Released(response, release) => {
                        release.notified().await;
                        response
                    }
                    Answer::Never => {
                        std::future::pending::<()>().await;
                        return;
                    }
                };
                let _ = conn.write_all(response.as_bytes()).await;
            });
        }
    });
    Peer { origin, requests }
}

/// A `200 OK` response carrying `body` as JSON.
pub(super) fn json_ok(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// An empty response with `status` (code and reason, `"502 Bad Gateway"`).
pub(super) fn empty(status: &str) -> String {
    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
}

/// Waits until `n` requests reached the endpoint (failing after a generous while).
pub(super) async fn until_received(received: &AtomicUsize, n: usize) {
    let arrived = async {
        while received.load(Ordering::SeqCst) < n {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), arrived)
        .await
        .unwrap_or_else(|_| panic!("{n} requests never arrived"));
}
