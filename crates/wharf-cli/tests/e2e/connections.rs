//! The HTTP server's own limits, over raw TCP (an HTTP client library would not misbehave
//! the way these tests need to): a client trickling its headers or its body is dropped while
//! everyone else is served, a client still sending an oversized body reads the 413, and the
//! header-count cap answers 431.

use crate::common;

use std::time::Duration;

use common::{ServerProcess, request};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

/// The head of a POST to the endpoint announcing `content_length` bytes of JSON.
fn post_head(port: u16, content_length: usize) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {content_length}\r\n\r\n"
    )
}

/// Everything the server sends until it closes the connection (a reset counts as closing),
/// or `None` if it is still open after `limit`.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

async fn connect(server: &ServerProcess) -> TcpStream {
    TcpStream::connect(("127.0.0.1", server.port))
        .await
        .expect("connect")
}

/// One whole response (head and `Content-Length` body), however the bytes arrive.
async fn read_one_response(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("a response in time")
            .expect("readable");
        assert!(n > 0, "closed before a whole response");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return got;
            }
        }
    }
}

fn status_of(response: &[u8]) -> &str {
    std::str::from_utf8(response)
        .ok()
        .and_then(|r| r.split(' ').nth(1))
        .unwrap_or("(none)")
}

async fn echo_works(server: &ServerProcess) {
    let r = request(
        &server.client(),
        "tools/call",
        json!({ "name": "echo", "arguments": { "text": "still here" } }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Hundreds of connections trickle a header byte a second, none ever finishing its head. The
/// server keeps answering others at once, and with the default limits drops every trickler
/// (hyper's header-read timeout, 30 s, needs the timer `axum::serve` never set).
#[tokio::test]
async fn trickled_headers_are_dropped_while_others_are_served() {
    let server = ServerProcess::start(&[]);
    let port = server.port;
    let started = Instant::now();
    let mut tricklers = Vec::new();
    for _ in 0..300 {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        tricklers.push(tokio::spawn(async move {
            stream
                .write_all(b"POST /mcp HTTP/1.1\r\nX-A: ")
                .await
                .unwrap();
            // One byte a second for up to 60 s, or until the server closes the connection.
            for _ in 0..60 {
                if stream.write_all(b"a").await.is_err() {
                    break;
                }
                let read = timeout(Duration::from_secs(1), stream.read(&mut [0u8; 512])).await;
                if let Ok(Ok(0) | Err(_)) = read {
                    break;
                }
            }
            started.elapsed()
        }));
    }
    // Every trickler is connected and holding its connection; ordinary requests go through.
    echo_works(&server).await;
    for trickler in tricklers {
        let held = trickler.await.unwrap();
        assert!(
            held < Duration::from_secs(45),
            "a trickling connection was held {held:?}"
        );
    }
    echo_works(&server).await;
}

/// A body announced as 100,000 bytes and sent a byte a second is answered 408 when the body
/// read timeout passes, and the connection closes.
#[tokio::test]
async fn a_trickled_body_is_dropped() {
    let server = ServerProcess::start(&["--body-read-secs", "2"]);
    let mut stream = connect(&server).await;
    stream
        .write_all(post_head(server.port, 100_000).as_bytes())
        .await
        .unwrap();
    let (mut read, mut write) = stream.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..100_000 {
            if write.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let mut response = Vec::new();
    let read_all = timeout(Duration::from_secs(20), read.read_to_end(&mut response)).await;
    assert!(read_all.is_ok(), "the connection was still open after 20 s");
    assert_eq!(
        status_of(&response),
        "408",
        "{}",
        String::from_utf8_lossy(&response)
    );
    let text = String::from_utf8_lossy(&response);
    assert!(text.contains("did not arrive within 2 s"), "{text}");
    assert!(text.contains("\"code\":-32600"), "{text}");
    trickle.abort();
    echo_works(&server).await;
}

/// A client that keeps sending an oversized body (most HTTP clients write the whole body
/// before they read) receives the 413 instead of a connection reset: whether the size is
/// announced (refused before reading) or only found while reading a chunked body.
#[tokio::test]
async fn a_client_still_sending_an_oversized_body_reads_the_413() {
    let server = ServerProcess::start(&["--max-body-bytes", "65536"]);
    let size = 8 * 1024 * 1024;
    let chunk = vec![b' '; 64 * 1024];
    let announced = post_head(server.port, size);
    let chunked = announced.replace(
        &format!("Content-Length: {size}"),
        "Transfer-Encoding: chunked",
    );
    let mut framed_chunk = format!("{:x}\r\n", chunk.len()).into_bytes();
    framed_chunk.extend_from_slice(&chunk);
    framed_chunk.extend_from_slice(b"\r\n");
    let cases = [
        (announced, chunk, &b""[..]),
        (chunked, framed_chunk, &b"0\r\n\r\n"[..]),
    ];
    for (head, piece, end) in cases {
        let stream = connect(&server).await;
        let (mut read, mut write) = stream.into_split();
        // The whole body goes out before anything is read, as a simple client does it.
        write.write_all(head.as_bytes()).await.unwrap();
        for _ in 0..size / (64 * 1024) {
            write
                .write_all(&piece)
                .await
                .expect("the server read the whole body without resetting");
        }
        write.write_all(end).await.unwrap();
        let mut response = Vec::new();
        timeout(Duration::from_secs(20), read.read_to_end(&mut response))
            .await
            .expect("the connection closed")
            .expect("the response was read, not reset");
        let text = String::from_utf8_lossy(&response);
        assert_eq!(status_of(&response), "413", "{text}");
        assert!(text.contains("limit") && text.contains("65536"), "{text}");
        assert!(text.contains("\"code\":-32600"), "{text}");
    }
    echo_works(&server).await;
}

/// More header fields than `--max-headers` are refused with 431 before anything runs.
#[tokio::test]
async fn too_many_header_fields_are_refused() {
    let server = ServerProcess::start(&["--max-headers", "20"]);
    let mut stream = connect(&server).await;
    let mut head = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n",
        server.port
    );
    for i in 0..30 {
        head.push_str(&format!("X-Field-{i}: {i}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let response = read_until_closed(&mut stream, Duration::from_secs(10))
        .await
        .expect("the connection closed");
    assert_eq!(status_of(&response), "431");
    echo_works(&server).await;
}

/// A kept-alive connection left idle is closed after the header-read time (so a proxy's
/// upstream keep-alive must be shorter, as deploy/nginx/wharf.conf sets it).
#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed() {
    let server = ServerProcess::start(&["--header-read-secs", "2"]);
    let mut stream = connect(&server).await;
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        server.port
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let response = read_one_response(&mut stream).await;
    assert_eq!(status_of(&response), "200");
    let rest = read_until_closed(&mut stream, Duration::from_secs(15)).await;
    assert_eq!(
        rest.as_deref(),
        Some(&[][..]),
        "closed with nothing more sent"
    );
}

/// Beyond `--max-connections`, a new connection is closed at once while the open ones keep
/// being served; and a shutdown with every slot taken still hands over and ends (the accept
/// loop never waits for a slot, so the listener's close is never stuck behind it).
#[tokio::test]
async fn beyond_the_connection_cap_new_connections_are_closed_and_shutdown_still_ends() {
    let mut server = ServerProcess::start(&[
        "--max-connections",
        "2",
        "--drain-grace-secs",
        "0",
        "--drain-secs",
        "5",
    ]);
    let mut held = [connect(&server).await, connect(&server).await];
    let mut beyond = connect(&server).await;
    let closed = read_until_closed(&mut beyond, Duration::from_secs(10)).await;
    assert_eq!(closed.as_deref(), Some(&[][..]), "closed with nothing sent");
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        server.port
    );
    held[0].write_all(head.as_bytes()).await.unwrap();
    assert_eq!(status_of(&read_one_response(&mut held[0]).await), "200");
    server.terminate();
    let status = server.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}");
}

/// A request refused before its body (here for its content type) from a client waiting for
/// `100 Continue` is answered at once, without the go-ahead, and the connection closes: the
/// body it held back is never sent.
#[tokio::test]
async fn a_refusal_does_not_tell_a_waiting_client_to_send_its_body() {
    let server = ServerProcess::start(&[]);
    let mut stream = connect(&server).await;
    let head = post_head(server.port, 100_000)
        .replace("application/json\r\nAccept", "text/plain\r\nAccept")
        .replace("\r\n\r\n", "\r\nExpect: 100-continue\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let response = read_until_closed(&mut stream, Duration::from_secs(10))
        .await
        .expect("the connection closed");
    let text = String::from_utf8_lossy(&response);
    assert_eq!(status_of(&response), "415", "{text}");
    assert!(!text.contains("100 Continue"), "{text}");
}
