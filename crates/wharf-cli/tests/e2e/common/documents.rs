//! A document server for Client ID Metadata Document tests: HTTPS on `localhost` under a
//! certificate made for the test (written to a PEM file the server under test is told to
//! trust), answering each path as the test says and counting fetches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde_json::{Value, json};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::import::unique;

/// The redirect URI the test documents list.
pub(crate) const REDIRECT: &str = "http://127.0.0.1:33500/callback";

/// What the document server answers for each path, and how often each was fetched.
#[derive(Clone, Default)]
pub(crate) struct Documents {
    answers: Arc<Mutex<HashMap<String, Answer>>>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    origin: Arc<Mutex<String>>,
}

#[derive(Clone)]
pub(crate) enum Answer {
    Json {
        body: Value,
        cache: &'static str,
    },
    Raw {
        status: u16,
        content_type: &'static str,
        body: String,
        location: Option<&'static str>,
    },
    Slow,
}

impl Documents {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.origin.lock().unwrap())
    }
    pub(crate) fn set(&self, path: &str, answer: Answer) {
        self.answers.lock().unwrap().insert(path.to_owned(), answer);
    }
    pub(crate) fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
    /// A document for `path` naming itself, with `extra` members.
    pub(crate) fn document(&self, path: &str, extra: Value) -> Value {
        let mut doc = json!({
            "client_id": self.url(path),
            "client_name": format!("Docs client {path}"),
            "redirect_uris": [REDIRECT],
        });
        for (k, v) in extra.as_object().unwrap() {
            doc[k] = v.clone();
        }
        doc
    }
}

async fn answer(State(docs): State<Documents>, Path(path): Path<String>) -> Response {
    *docs.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    let answer = docs.answers.lock().unwrap().get(&path).cloned();
    match answer {
        None => StatusCode::NOT_FOUND.into_response(),
        Some(Answer::Json { body, cache }) => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, cache),
            ],
            body.to_string(),
        )
            .into_response(),
        Some(Answer::Raw {
            status,
            content_type,
            body,
            location,
        }) => {
            let mut response = (
                StatusCode::from_u16(status).unwrap(),
                [(header::CONTENT_TYPE, content_type)],
                body,
            )
                .into_response();
            if let Some(location) = location {
                response
                    .headers_mut()
                    .insert(header::LOCATION, location.parse().unwrap());
            }
            response
        }
        // Accepts the request and never answers.
        Some(Answer::Slow) => std::future::pending().await,
    }
}

/// Serves documents over HTTPS on `localhost`; returns them and the CA file to trust.
pub(crate) async fn document_server() -> (Documents, std::path::PathBuf) {
    let key = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let pem_path = super::scratch(format!("{}.pem", unique("cimd-ca")));
    std::fs::write(&pem_path, key.cert.pem()).unwrap();
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
    let listener = super::tokio_listener();
    let port = listener.local_addr().unwrap().port();
    let docs = Documents::default();
    *docs.origin.lock().unwrap() = format!("https://localhost:{port}");
    let app = Router::new()
        .route("/{*path}", get(answer))
        .with_state(docs.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .await;
            });
        }
    });
    (docs, pem_path)
}
