//! The metadata-document fetcher against real HTTPS servers on this machine, each answering
//! the way a hostile or broken client's host might. Documents are served under a certificate
//! made for the test and trusted by the fetcher; names resolve through a lookup the test
//! controls, so a name can point at any special-use address or change its answer.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use wharf_authz::cimd::{ClientIdUrl, FetchError, Fetcher, Lookup};
use wharf_authz::redirect;

/// A name-to-addresses table; every name the test uses is in it.
struct Names(HashMap<&'static str, Vec<IpAddr>>);

impl Lookup for Names {
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
        let answer = self.0.get(host).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{host}: no such name"))
        });
        Box::pin(async move { answer })
    }
}

/// A name whose first answer is this machine and every later one the cloud metadata address.
#[derive(Default)]
struct Rebinding(AtomicUsize);

impl Lookup for Rebinding {
    fn lookup(&self, _host: &str) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
        let first = self.0.fetch_add(1, Ordering::SeqCst) == 0;
        let ip: IpAddr = if first {
            [127, 0, 0, 1].into()
        } else {
            [169, 254, 169, 254].into()
        };
        Box::pin(async move { Ok(vec![ip]) })
    }
}

struct Server {
    origin: String,
    port: u16,
    ca_pem: String,
    hits: Arc<AtomicUsize>,
    /// TCP connections accepted.
    connections: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct Site {
    origin: String,
    hits: Arc<AtomicUsize>,
}

fn document(origin: &str, path: &str) -> serde_json::Value {
    json!({
        "client_id": format!("{origin}{path}"),
        "client_name": "Test Client",
        "redirect_uris": ["http://127.0.0.1:33418/callback"],
    })
}

fn json_response(body: String, cache: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, cache),
        ],
        body,
    )
        .into_response()
}

/// A document of exactly `size` bytes, padded with an extra member.
fn padded(origin: &str, path: &str, size: usize) -> String {
    let mut doc = document(origin, path);
    doc["padding"] = json!("");
    let bare = doc.to_string().len();
    doc["padding"] = json!("x".repeat(size - bare));
    let body = doc.to_string();
    assert_eq!(body.len(), size);
    body
}

async fn serve() -> Server {
    let key =
        rcgen::generate_simple_self_signed(vec!["client.test".into(), "localhost".into()]).unwrap();
    let ca_pem = key.cert.pem();
    let cert = CertificateDer::from(key.cert.der().to_vec());
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.key_pair.serialize_der()));
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let tls = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], private)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let origin = format!("https://client.test:{port}");
    let hits = Arc::new(AtomicUsize::new(0));
    let site = Site {
        origin: origin.clone(),
        hits: hits.clone(),
    };
    let app = Router::new()
        .route(
            "/good.json",
            get(|State(s): State<Site>| async move {
                json_response(
                    document(&s.origin, "/good.json").to_string(),
                    "public, max-age=60",
                )
            }),
        )
        .route(
            "/nocache.json",
            get(|State(s): State<Site>| async move {
                json_response(document(&s.origin, "/nocache.json").to_string(), "no-store")
            }),
        )
        .route(
            "/redirect.json",
            get(|| async {
                (StatusCode::FOUND, [(header::LOCATION, "/good.json")]).into_response()
            }),
        )
        .route(
            "/html.json",
            get(|State(s): State<Site>| async move {
                (
                    [(header::CONTENT_TYPE, "text/html")],
                    document(&s.origin, "/html.json").to_string(),
                )
                    .into_response()
            }),
        )
        .route(
            "/mismatch.json",
            get(|State(s): State<Site>| async move {
                json_response(document(&s.origin, "/good.json").to_string(), "max-age=60")
            }),
        )
        .route(
            "/exact.json",
            get(|State(s): State<Site>| async move {
                json_response(padded(&s.origin, "/exact.json", 5 * 1024), "max-age=60")
            }),
        )
        .route(
            "/big.json",
            get(|State(s): State<Site>| async move {
                json_response(padded(&s.origin, "/big.json", 5 * 1024 + 1), "max-age=60")
            }),
        )
        .route(
            "/big-chunked.json",
            get(|State(s): State<Site>| async move {
                // Streamed without a Content-Length, so only counting the bytes catches it.
                let body = padded(&s.origin, "/big-chunked.json", 64 * 1024);
                let chunks: Vec<Result<String, io::Error>> = body
                    .as_bytes()
                    .chunks(1024)
                    .map(|c| Ok(String::from_utf8(c.to_vec()).unwrap()))
                    .collect();
                let stream = tokio_stream::iter(chunks);
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    Body::from_stream(stream),
                )
                    .into_response()
            }),
        )
        .route(
            "/slow.json",
            // A server that accepts the request and never answers.
            get(std::future::pending::<Response>),
        )
        .fallback(|| async { StatusCode::NOT_FOUND })
        .layer(axum::middleware::from_fn_with_state(site.clone(), count))
        .with_state(site);
    let connections = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::clone(&connections);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Server {
        origin,
        port,
        ca_pem,
        hits,
        connections,
    }
}

async fn count(
    State(site): State<Site>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    site.hits.fetch_add(1, Ordering::SeqCst);
    next.run(request).await
}

fn names(extra: &[(&'static str, &str)]) -> Arc<Names> {
    let mut table: HashMap<&'static str, Vec<IpAddr>> = HashMap::new();
    table.insert("client.test", vec![[127, 0, 0, 1].into()]);
    for (name, ip) in extra {
        table.entry(name).or_default().push(ip.parse().unwrap());
    }
    Arc::new(Names(table))
}

fn fetcher(server: &Server, lookup: Arc<dyn Lookup>, allow_loopback: bool) -> Fetcher {
    let mut builder = Fetcher::builder()
        .timeouts(Duration::from_secs(2), Duration::from_millis(700))
        .add_root_certificate(server.ca_pem.as_bytes())
        .unwrap()
        .lookup(lookup);
    if allow_loopback {
        builder = builder.allow_loopback_for_tests();
    }
    builder.build().unwrap()
}

fn url(s: &str) -> ClientIdUrl {
    ClientIdUrl::parse(s).unwrap()
}

#[tokio::test]
async fn a_good_document_is_fetched_with_its_freshness() {
    let server = serve().await;
    let fetcher = fetcher(&server, names(&[]), true);
    let fetched = fetcher
        .fetch(&url(&format!("{}/good.json", server.origin)))
        .await
        .unwrap();
    assert_eq!(fetched.metadata.client_name, "Test Client");
    assert_eq!(fetched.metadata.client_id.host(), "client.test");
    assert_eq!(fetched.fresh_for, Some(Duration::from_secs(60)));
    // Redirect URIs are matched exactly against the document's.
    let uris = &fetched.metadata.redirect_uris;
    assert!(redirect::is_registered(
        uris,
        "http://127.0.0.1:33418/callback"
    ));
    assert!(!redirect::is_registered(
        uris,
        "http://127.0.0.1:33418/other"
    ));
    assert!(!redirect::is_registered(
        uris,
        "https://evil.example/callback"
    ));

    let fetched = fetcher
        .fetch(&url(&format!("{}/nocache.json", server.origin)))
        .await
        .unwrap();
    assert_eq!(fetched.fresh_for, None, "no-store is never reused");
    let exact = fetcher
        .fetch(&url(&format!("{}/exact.json", server.origin)))
        .await;
    assert!(
        exact.is_ok(),
        "a document of exactly 5 KiB is accepted: {exact:?}"
    );
}

/// No connection is kept between fetches: documents are fetched rarely, from hosts that
/// clients name, and one idle connection per name would hold a file descriptor each.
#[tokio::test]
async fn no_connection_is_kept_between_fetches() {
    let server = serve().await;
    let fetcher = fetcher(&server, names(&[]), true);
    for _ in 0..2 {
        fetcher
            .fetch(&url(&format!("{}/nocache.json", server.origin)))
            .await
            .unwrap();
    }
    assert_eq!(server.hits.load(Ordering::SeqCst), 2);
    assert_eq!(server.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn hostile_answers_are_refused_by_name() {
    let server = serve().await;
    let fetcher = fetcher(&server, names(&[]), true);
    let fetch = |path: &str| {
        let url = url(&format!("{}{path}", server.origin));
        let fetcher = fetcher.clone();
        async move { fetcher.fetch(&url).await.unwrap_err() }
    };

    let err = fetch("/redirect.json").await;
    assert!(
        matches!(err, FetchError::Redirect { status: 302, ref location, .. } if location.as_deref() == Some("/good.json")),
        "{err}"
    );
    assert!(
        err.to_string().contains("redirects are not followed"),
        "{err}"
    );

    let err = fetch("/missing.json").await;
    assert!(
        matches!(err, FetchError::Status { status: 404, .. }),
        "{err}"
    );

    let err = fetch("/html.json").await;
    assert!(
        matches!(err, FetchError::NotJson { ref content_type, .. } if content_type == "text/html"),
        "{err}"
    );

    let err = fetch("/big.json").await;
    assert!(
        matches!(err, FetchError::TooLarge { limit: 5120, .. }),
        "{err}"
    );
    let err = fetch("/big-chunked.json").await;
    assert!(
        matches!(err, FetchError::TooLarge { limit: 5120, .. }),
        "{err}"
    );

    let err = fetch("/mismatch.json").await;
    assert!(
        err.to_string()
            .contains("is not the URL it was fetched from"),
        "{err}"
    );

    let hits = server.hits.load(Ordering::SeqCst);
    // It never answers: only the fetcher's own time limit ends the wait.
    let err = fetch("/slow.json").await;
    assert!(matches!(err, FetchError::Timeout { .. }), "{err}");
    assert_eq!(server.hits.load(Ordering::SeqCst), hits + 1);
}

#[tokio::test]
async fn special_use_addresses_are_never_connected_to() {
    let server = serve().await;
    let ranges = [
        ("private.test", "10.0.0.7"),
        ("private172.test", "172.16.5.4"),
        ("private192.test", "192.168.0.10"),
        ("cgnat.test", "100.64.0.1"),
        ("metadata.test", "169.254.169.254"),
        ("zero.test", "0.0.0.0"),
        ("doc.test", "192.0.2.1"),
        ("bench.test", "198.18.0.1"),
        ("multicast.test", "224.0.0.1"),
        ("reserved.test", "240.0.0.1"),
        ("ula.test", "fd00:ec2::254"),
        ("linklocal6.test", "fe80::1"),
        ("mapped.test", "::ffff:10.0.0.1"),
        ("nat64.test", "64:ff9b::a9fe:a9fe"),
        // One bad address among good ones refuses the name.
        ("mixed.test", "127.0.0.1"),
        ("mixed.test", "192.168.1.1"),
    ];
    let fetcher = fetcher(&server, names(&ranges), true);
    for (name, _) in ranges {
        let err = fetcher
            .fetch(&url(&format!("https://{name}:{}/good.json", server.port)))
            .await
            .unwrap_err();
        assert!(
            matches!(err, FetchError::SpecialUseAddress { .. }),
            "{name}: {err}"
        );
        assert!(err.to_string().contains("special-use"), "{err}");
    }
    for literal in [
        "10.0.0.1",
        "169.254.169.254",
        "[fd00::1]",
        "[::ffff:a9fe:a9fe]",
    ] {
        let err = fetcher
            .fetch(&url(&format!("https://{literal}/c.json")))
            .await
            .unwrap_err();
        assert!(
            matches!(err, FetchError::SpecialUseAddress { .. }),
            "{literal}: {err}"
        );
    }
    assert_eq!(
        server.hits.load(Ordering::SeqCst),
        0,
        "no request reached a server"
    );

    // Without the test switch, loopback is refused too, through the system's own resolver.
    let strict = Fetcher::builder()
        .add_root_certificate(server.ca_pem.as_bytes())
        .unwrap()
        .build()
        .unwrap();
    for target in [
        format!("https://localhost:{}/good.json", server.port),
        format!("https://127.0.0.1:{}/good.json", server.port),
    ] {
        let err = strict.fetch(&url(&target)).await.unwrap_err();
        assert!(
            matches!(err, FetchError::SpecialUseAddress { .. }),
            "{target}: {err}"
        );
    }
    // A name that does not exist, and a resolver that fails for now: only the second asks
    // the client to retry rather than telling it it is unknown.
    let unresolved = [
        (&fetcher, "https://nowhere.test/c.json", false),
        (
            &crate::fetcher(&server, Arc::new(Unanswered), true),
            "https://client.test/c.json",
            true,
        ),
    ];
    for (fetcher, target, temporary) in unresolved {
        let err = fetcher.fetch(&url(target)).await.unwrap_err();
        assert!(
            matches!(err, FetchError::Resolve { temporary: t, .. } if t == temporary),
            "{target}: {err}"
        );
    }
    assert_eq!(server.hits.load(Ordering::SeqCst), 0);
}

/// A resolver that fails for now, as glibc's says for `EAI_AGAIN`.
struct Unanswered;

impl Lookup for Unanswered {
    fn lookup(&self, _: &str) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
        Box::pin(async {
            Err(io::Error::other(
                "failed to lookup address information: Temporary failure in name resolution",
            ))
        })
    }
}

#[tokio::test]
async fn a_name_that_changes_its_answer_is_vetted_on_the_answer_connected_to() {
    let server = serve().await;
    let rebinding = Arc::new(Rebinding::default());
    let target = url(&format!("{}/good.json", server.origin));
    // The first connection resolves once, and connects to what that answer said.
    let first = fetcher(&server, rebinding.clone(), true);
    first.fetch(&target).await.unwrap();
    assert_eq!(
        rebinding.0.load(Ordering::SeqCst),
        1,
        "one resolution per connection, no separate check"
    );
    // A new connection resolves again, and the changed answer is refused, not connected to.
    let second = fetcher(&server, rebinding.clone(), true);
    let err = second.fetch(&target).await.unwrap_err();
    assert!(
        matches!(err, FetchError::SpecialUseAddress { ip, .. } if ip == IpAddr::from([169, 254, 169, 254])),
        "{err}"
    );
    assert_eq!(rebinding.0.load(Ordering::SeqCst), 2);
    assert_eq!(server.hits.load(Ordering::SeqCst), 1);
}
