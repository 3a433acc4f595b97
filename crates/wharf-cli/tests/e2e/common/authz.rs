//! Support for the authorization server's tests: accounts, PKCE pairs, and a browser that
//! keeps cookies (per host, not per port, as browsers do) and follows no redirect by itself.

use std::collections::HashMap;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::header::{COOKIE, SET_COOKIE};
use sha2::{Digest, Sha256};

/// Every test account's password.
pub(crate) const PASSWORD: &str = "correct horse battery staple";

/// Adds `name` to the store through `wharf user add`, the password on standard input.
pub(crate) fn add_user(store: &str, name: &str) {
    user_command(store, "add", name, PASSWORD);
}

/// Runs `wharf user VERB NAME` on `store` with `input` on standard input, which must
/// succeed; what it wrote to stderr.
pub(crate) fn user_command(store: &str, verb: &str, name: &str, input: &str) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["user", verb, name, "--store", store])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{input}").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// `wharf serve --profile PROFILE --authorization-server` on a fresh SQLite store (named
/// after `tag`) that knows user `alice`, with `extra` arguments.
pub(crate) fn own_server(tag: &str, profile: &str, extra: &[&str]) -> super::ServerProcess {
    let store = super::import::sqlite_url(&super::import::unique(tag));
    add_user(&store, "alice");
    let args = [
        "--profile",
        profile,
        "--store",
        &store,
        "--authorization-server",
    ];
    super::ServerProcess::start_exact(&[&args[..], extra].concat())
}

/// A PKCE pair: a random verifier and its S256 challenge.
pub(crate) fn pkce() -> (String, String) {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).unwrap();
    let verifier = URL_SAFE_NO_PAD.encode(bytes);
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

/// The value of hidden field `name` in a page.
pub(crate) fn hidden(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        + marker.len();
    let end = start + page[start..].find('"').unwrap();
    page[start..end].replace("&amp;", "&")
}

/// The query parameters of a URL.
pub(crate) fn query(location: &str) -> HashMap<String, String> {
    url::Url::parse(location)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect()
}

/// A browser: a cookie jar and no automatic redirects.
pub(crate) struct Browser {
    http: reqwest::Client,
    cookies: Mutex<HashMap<String, String>>,
}

impl Browser {
    pub(crate) fn new() -> Self {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        Self {
            http,
            cookies: Mutex::new(HashMap::new()),
        }
    }

    /// Sends `request` with the jar's cookies and keeps the ones set (which must be
    /// HttpOnly and SameSite=Lax).
    async fn send(&self, request: reqwest::RequestBuilder) -> reqwest::Response {
        let cookie = {
            let jar = self.cookies.lock().unwrap();
            jar.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let response = request.header(COOKIE, cookie).send().await.unwrap();
        let mut jar = self.cookies.lock().unwrap();
        for header in response.headers().get_all(SET_COOKIE) {
            let text = header.to_str().unwrap();
            assert!(
                text.contains("HttpOnly") && text.contains("SameSite=Lax"),
                "{text}"
            );
            let (name, value) = text.split(';').next().unwrap().split_once('=').unwrap();
            jar.insert(name.to_owned(), value.to_owned());
        }
        response
    }

    /// Drops cookie `name`, as a browser does when it expires.
    pub(crate) fn forget(&self, name: &str) {
        assert!(
            self.cookies.lock().unwrap().remove(name).is_some(),
            "no cookie {name}"
        );
    }

    /// The value of cookie `name` in the jar, if any.
    pub(crate) fn cookie(&self, name: &str) -> Option<String> {
        self.cookies.lock().unwrap().get(name).cloned()
    }

    pub(crate) async fn get(&self, url: &str) -> reqwest::Response {
        self.send(self.http.get(url)).await
    }

    pub(crate) async fn post(&self, url: &str, form: &[(&str, &str)]) -> reqwest::Response {
        self.send(self.http.post(url).form(form)).await
    }

    /// The page `redirect` (a 303 to a path on `base`) leads to, as a browser follows it.
    pub(crate) async fn follow(&self, base: &str, redirect: &reqwest::Response) -> String {
        let next = redirect.headers()[reqwest::header::LOCATION]
            .to_str()
            .unwrap();
        self.get(&format!("{base}{next}"))
            .await
            .text()
            .await
            .unwrap()
    }

    /// Approves the consent page `html` as its person would, by its form.
    pub(crate) async fn approve(&self, base: &str, html: &str) -> reqwest::Response {
        let form = [
            ("request", hidden(html, "request")),
            ("csrf", hidden(html, "csrf")),
            ("decision", "approve".to_owned()),
        ];
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.post(&format!("{base}/authorize/consent"), &form).await
    }
}

/// The client id the test OpenID provider knows the server under test by.
pub(crate) const UPSTREAM_CLIENT_ID: &str = "wharf-under-test";

/// A test OpenID provider over http on loopback; its issuer. It signs ID tokens with an
/// HMAC key its JWKS publishes, and takes its authorization codes to be `SUBJECT.NONCE`:
/// a test plays the person at the provider by sending such a code to the callback.
pub(crate) async fn upstream_provider() -> String {
    use axum::extract::{Form, State};
    use axum::routing::{get, post};
    use serde_json::{Value, json};

    const KEY: &[u8] = b"the test provider's signing key, 32+ bytes";
    let listener = super::tokio_listener();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let metadata = json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}/auth"),
        "token_endpoint": format!("{issuer}/token"),
        "jwks_uri": format!("{issuer}/jwks"),
    });
    let jwks = json!({"keys": [{"kty": "oct", "kid": "k1", "alg": "HS256", "k": URL_SAFE_NO_PAD.encode(KEY)}]});
    let token = async |State(issuer): State<String>, Form(form): Form<HashMap<String, String>>| {
        let (sub, nonce) = form["code"].rsplit_once('.').unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = json!({"iss": issuer, "aud": UPSTREAM_CLIENT_ID, "sub": sub,
            "nonce": nonce, "iat": now, "exp": now + 300});
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("k1".into());
        let key = jsonwebtoken::EncodingKey::from_secret(KEY);
        let id_token = jsonwebtoken::encode(&header, &claims, &key).unwrap();
        axum::Json(json!({"access_token": "x", "token_type": "Bearer", "id_token": id_token}))
    };
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            get(async move || axum::Json::<Value>(metadata)),
        )
        .route("/jwks", get(async move || axum::Json::<Value>(jwks)))
        .route("/token", post(token))
        .with_state(issuer.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    issuer
}
