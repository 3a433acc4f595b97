//! Clients that identify with a Client ID Metadata Document, against `wharf serve
//! --authorization-server`: the documents are served over HTTPS by this test (a certificate
//! it made, which the server is told to trust; loopback documents allowed by the test-only
//! switch), and the server fetches them for real. A good document signs a user in (PKCE, or
//! `private_key_jwt` with replay protection) and is reused within its freshness; each hostile
//! one is refused with an error that names the problem, and fetched again next time (a
//! failure is never cached).

use crate::common;

use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use common::ServerProcess;
use common::authz::{Browser, PASSWORD, add_user, hidden, pkce, query};
use common::documents::{Answer, Documents, REDIRECT, document_server};
use common::import::{sqlite_url, unique};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::header::LOCATION;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};
use url::Url;

fn server(store: &str, ca: &std::path::Path) -> ServerProcess {
    add_user(store, "alice");
    ServerProcess::start_exact(&[
        "--profile",
        "default",
        "--store",
        store,
        "--authorization-server",
        "--authz-allow-loopback-documents",
        "--authz-document-root-cert",
        ca.to_str().unwrap(),
    ])
}

/// A document server, and an authorization server on a store of its own (`tag` names it)
/// that trusts the documents' certificate: the documents, the server, its store and its
/// origin.
async fn documents_and_server(tag: &str) -> (Documents, ServerProcess, String, String) {
    let (docs, ca) = document_server().await;
    let store = sqlite_url(&unique(tag));
    let server = server(&store, &ca);
    let base = format!("http://127.0.0.1:{}", server.port);
    (docs, server, store, base)
}

/// Serves a plain document (no extra member), fresh for five minutes, at `app.json`: its
/// URL, the client's id.
fn plain_document(docs: &Documents) -> String {
    docs.set(
        "app.json",
        Answer::Json {
            body: docs.document("app.json", json!({})),
            cache: "public, max-age=300",
        },
    );
    docs.url("app.json")
}

/// Opens the authorization URL for `client_id`; on a consent flow signs in, checks the
/// consent page with `check`, approves, and returns the code.
async fn code_for(
    browser: &Browser,
    base: &str,
    client_id: &str,
    challenge: &str,
    check: impl Fn(&str),
) -> Result<String, (StatusCode, String)> {
    let url = Url::parse_with_params(
        &format!("{base}/authorize"),
        &[
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", REDIRECT),
            ("code_challenge", challenge),
            ("code_challenge_method", "S256"),
        ],
    )
    .unwrap();
    let page = browser.get(url.as_str()).await;
    let status = page.status();
    let mut html = page.text().await.unwrap();
    if status != StatusCode::OK {
        return Err((status, html));
    }
    if html.contains("Sign in</h1>") {
        let (request, csrf) = (hidden(&html, "request"), hidden(&html, "csrf"));
        let form = [
            ("request", request.as_str()),
            ("csrf", &csrf),
            ("username", "alice"),
            ("password", PASSWORD),
        ];
        let signed = browser
            .post(&format!("{base}/authorize/login"), &form)
            .await;
        html = browser.follow(base, &signed).await;
    }
    check(&html);
    let approved = browser.approve(base, &html).await;
    Ok(query(approved.headers()[LOCATION].to_str().unwrap())["code"].clone())
}

async fn token(base: &str, form: &[(&str, &str)]) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}/token"))
        .form(form)
        .send()
        .await
        .unwrap();
    (response.status(), response.json().await.unwrap())
}

/// An ES256 key: the signer, and its public JWK set.
fn client_key() -> (EncodingKey, Value) {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    let jwks = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "c1", "alg": "ES256", "use": "sig",
        "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..65])}]});
    (EncodingKey::from_ec_der(pkcs8.as_ref()), jwks)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn assertion(key: &EncodingKey, client_id: &str, audience: &str, jti: &str) -> String {
    assertion_until(key, client_id, audience, jti, now_secs() + 60)
}

/// An assertion that expires at `exp` (seconds).
fn assertion_until(
    key: &EncodingKey,
    client_id: &str,
    audience: &str,
    jti: &str,
    exp: u64,
) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("c1".into());
    let claims = json!({"iss": client_id, "sub": client_id, "aud": audience, "exp": exp, "iat": now_secs(), "jti": jti});
    jsonwebtoken::encode(&header, &claims, key).unwrap()
}

#[tokio::test]
async fn a_document_client_signs_in_and_its_document_is_reused_while_fresh() {
    let (docs, server, _store, base) = documents_and_server("cimd-good").await;
    let client_id = plain_document(&docs);
    let browser = Browser::new();
    let (verifier, challenge) = pkce();
    let code = code_for(&browser, &base, &client_id, &challenge, |page| {
        assert!(page.contains("Docs client app.json"), "{page}");
        assert!(
            page.contains("id=\"client-host\">localhost<"),
            "the client_id's host is shown: {page}"
        );
        assert!(
            page.contains("id=\"localhost-warning\""),
            "a loopback redirect is flagged: {page}"
        );
    })
    .await
    .unwrap();
    let (status, tokens) = token(
        &base,
        &[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("client_id", &client_id),
            ("code_verifier", &verifier),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    let reply = server
        .client()
        .with_bearer(tokens["access_token"].as_str().unwrap())
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.error_code(), None);
    // A second sign-in within the document's freshness reuses it: no second fetch.
    let (_, challenge) = pkce();
    code_for(&browser, &base, &client_id, &challenge, |_| {})
        .await
        .unwrap();
    assert_eq!(docs.hits("app.json"), 1, "fresh for 300 s: fetched once");

    // A document that may not be stored is fetched every time.
    docs.set(
        "nostore.json",
        Answer::Json {
            body: docs.document("nostore.json", json!({})),
            cache: "no-store",
        },
    );
    for _ in 0..2 {
        code_for(
            &browser,
            &base,
            &docs.url("nostore.json"),
            &challenge,
            |_| {},
        )
        .await
        .unwrap();
    }
    assert_eq!(docs.hits("nostore.json"), 2);
}

#[tokio::test]
async fn a_document_client_may_authenticate_with_private_key_jwt_once_per_jti() {
    let (docs, _server, _store, base) = documents_and_server("cimd-pkjwt").await;
    let (key, jwks) = client_key();
    let path = "keyed.json";
    docs.set(
        path,
        Answer::Json {
            body: docs.document(
                path,
                json!({"token_endpoint_auth_method": "private_key_jwt", "jwks": jwks}),
            ),
            cache: "max-age=60",
        },
    );
    let client_id = docs.url(path);
    let audience = format!("{base}/token");
    let browser = Browser::new();
    let exchange = |code: String, verifier: String, assertion: Option<String>| {
        let (base, client_id) = (base.clone(), client_id.clone());
        async move {
            let mut form = vec![
                ("grant_type", "authorization_code".to_owned()),
                ("code", code),
                ("code_verifier", verifier),
                ("client_id", client_id),
            ];
            if let Some(a) = assertion {
                form.push((
                    "client_assertion_type",
                    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".into(),
                ));
                form.push(("client_assertion", a));
            }
            let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
            token(&base, &form).await
        }
    };
    let (verifier, challenge) = pkce();
    let code = code_for(&browser, &base, &client_id, &challenge, |_| {})
        .await
        .unwrap();
    let (status, err) = exchange(code.clone(), verifier.clone(), None).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("invalid_client")),
        "no assertion: {err}"
    );
    let (other_key, _) = client_key();
    let (status, err) = exchange(
        code.clone(),
        verifier.clone(),
        Some(assertion(&other_key, &client_id, &audience, "j0")),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "signed with a key not in the document: {err}"
    );
    // One that would never expire: refused, not read as expired long ago (which would
    // keep no record of its jti, so it could be replayed at will).
    let (status, err) = exchange(
        code.clone(),
        verifier.clone(),
        Some(assertion_until(
            &key,
            &client_id,
            &audience,
            "j-forever",
            u64::MAX,
        )),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{err}");
    assert!(
        err["error_description"].as_str().unwrap().contains("exp"),
        "{err}"
    );
    let first = assertion(&key, &client_id, &audience, "j1");
    let (status, tokens) = exchange(code, verifier, Some(first.clone())).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    // The same assertion again, on a new code: its jti was seen.
    let (verifier, challenge) = pkce();
    let code = code_for(&browser, &base, &client_id, &challenge, |_| {})
        .await
        .unwrap();
    let (status, err) = exchange(code.clone(), verifier.clone(), Some(first)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        err["error_description"]
            .as_str()
            .unwrap()
            .contains("used before"),
        "{err}"
    );
    let (status, _) = exchange(
        code,
        verifier,
        Some(assertion(&key, &client_id, &audience, "j2")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

/// A client whose keys are published at a `jwks_uri` that fails for now (a 503) is told to
/// retry (503 `temporarily_unavailable` with `Retry-After`), not that it is a bad client
/// (401 `invalid_client` makes a client drop its credentials), and the refused exchange
/// spent nothing: once the keys are back, the same code gets tokens. A key set larger than
/// a metadata document is taken, and kept while its host says it is fresh.
#[tokio::test]
async fn a_key_host_down_for_now_is_retried_not_taken_for_a_bad_client() {
    let (docs, _server, _store, base) = documents_and_server("cimd-jwks-down").await;
    let (key, jwks) = client_key();
    let path = "keys-elsewhere.json";
    let keys = "keys-down.json";
    docs.set(
        path,
        Answer::Json {
            body: docs.document(
                path,
                json!({"token_endpoint_auth_method": "private_key_jwt", "jwks_uri": docs.url(keys)}),
            ),
            cache: "max-age=60",
        },
    );
    docs.set(
        keys,
        Answer::Raw {
            status: 503,
            content_type: "text/plain",
            body: "down for maintenance".into(),
            location: None,
        },
    );
    let client_id = docs.url(path);
    let audience = format!("{base}/token");
    let (verifier, challenge) = pkce();
    let code = code_for(&Browser::new(), &base, &client_id, &challenge, |_| {})
        .await
        .unwrap();
    let exchange = |key: &EncodingKey, jti: &str| {
        let a = assertion(key, &client_id, &audience, jti);
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code.as_str()),
            ("code_verifier", verifier.as_str()),
            ("client_id", client_id.as_str()),
            (
                "client_assertion_type",
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            ),
            ("client_assertion", a.as_str()),
        ]
        .map(|(k, v)| (k, v.to_owned()));
        let base = base.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{base}/token"))
                .form(&form)
                .send()
                .await
                .unwrap()
        }
    };
    let refused = exchange(&key, "j1").await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key("retry-after"));
    let err: Value = refused.json().await.unwrap();
    assert_eq!(err["error"], "temporarily_unavailable", "{err}");
    assert_eq!(docs.hits(keys), 1);

    // Back, and larger than a metadata document may be: a key set of many keys (a
    // rotation's, or certificate chains) is taken up to 64 KiB.
    let mut jwks = jwks;
    let published = jwks["keys"][0].clone();
    for n in 0..60 {
        let mut other = published.clone();
        other["kid"] = json!(format!("retired-{n}"));
        jwks["keys"].as_array_mut().unwrap().push(other);
    }
    assert!(jwks.to_string().len() > 5 * 1024);
    docs.set(
        keys,
        Answer::Json {
            body: jwks,
            cache: "max-age=60",
        },
    );
    let accepted = exchange(&key, "j2").await;
    assert_eq!(accepted.status(), StatusCode::OK);
    let tokens: Value = accepted.json().await.unwrap();
    assert!(tokens["access_token"].is_string(), "{tokens}");
    assert_eq!(docs.hits(keys), 2);
    // Kept while fresh: the next assertion is checked without a fetch (its code was spent,
    // so the exchange is refused, after the client was authenticated).
    let spent = exchange(&key, "j3").await;
    assert_eq!(spent.status(), StatusCode::BAD_REQUEST);
    let err: Value = spent.json().await.unwrap();
    assert_eq!(err["error"], "invalid_grant", "{err}");
    assert_eq!(docs.hits(keys), 2, "the kept key set was used");
    // Re-keyed under the same kid: the kept set does not verify the assertion, so it is
    // fetched again once, and the client is authenticated (its spent code refused as
    // before), not told it is invalid.
    let (rekeyed, rekeyed_jwks) = client_key();
    docs.set(
        keys,
        Answer::Json {
            body: rekeyed_jwks,
            cache: "max-age=60",
        },
    );
    let spent = exchange(&rekeyed, "j4").await;
    let err: Value = spent.json().await.unwrap();
    assert_eq!(err["error"], "invalid_grant", "{err}");
    assert_eq!(docs.hits(keys), 3);
    // An assertion its keys fail again right after (anyone may send one) is refused without
    // another fetch from the client's host.
    let (stranger, _) = client_key();
    let forged = exchange(&stranger, "j5").await;
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    let err: Value = forged.json().await.unwrap();
    assert_eq!(err["error"], "invalid_client", "{err}");
    assert_eq!(docs.hits(keys), 3, "not fetched again within a minute");
}

/// This server's own store failing is no fault of the client's: a document fetched but not
/// cached (the store refused the write) still signs the user in, and a store that cannot
/// be read at all answers 503 with `Retry-After` ("cannot sign in right now"), where both
/// answered 400 "cannot sign in here".
#[tokio::test]
async fn a_store_failing_for_now_is_not_blamed_on_the_client() {
    let (docs, _server, store, base) = documents_and_server("cimd-store-down").await;
    let client_id = plain_document(&docs);
    let pool = sqlx::SqlitePool::connect(&format!("{store}?mode=rw"))
        .await
        .unwrap();
    let run = async |sql: &str| sqlx::query(sql).execute(&pool).await.map(drop).unwrap();
    run("CREATE TRIGGER no_cache BEFORE INSERT ON wharf_records \
         WHEN NEW.namespace = 'authz-cimd' BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    .await;
    let (_, challenge) = pkce();
    code_for(&Browser::new(), &base, &client_id, &challenge, |_| {})
        .await
        .expect("a document the store did not cache still signs the user in");
    run("DROP TRIGGER no_cache").await;

    run("ALTER TABLE wharf_records RENAME TO wharf_records_away").await;
    let refused = code_for(&Browser::new(), &base, &client_id, &challenge, |_| {}).await;
    run("ALTER TABLE wharf_records_away RENAME TO wharf_records").await;
    let (status, page) = refused.expect_err("the store cannot be read");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{page}");
    assert!(page.contains("cannot sign in right now"), "{page}");
    code_for(&Browser::new(), &base, &client_id, &challenge, |_| {})
        .await
        .expect("signs in once the store is back");
}

#[tokio::test]
async fn hostile_documents_are_refused_by_name_and_never_cached() {
    let (docs, _server, _store, base) = documents_and_server("cimd-hostile").await;
    let big = "x".repeat(6000);
    let cases: Vec<(&str, Answer, &str)> = vec![
        (
            "redirect.json",
            Answer::Raw {
                status: 302,
                content_type: "text/plain",
                body: String::new(),
                location: Some("/app.json"),
            },
            "redirects are not followed",
        ),
        (
            "missing.json",
            Answer::Raw {
                status: 404,
                content_type: "text/plain",
                body: String::new(),
                location: None,
            },
            "HTTP 404",
        ),
        (
            "html.json",
            Answer::Raw {
                status: 200,
                content_type: "text/html",
                body: "<html></html>".into(),
                location: None,
            },
            "not application/json",
        ),
        (
            "big.json",
            Answer::Json {
                body: docs.document("big.json", json!({"padding": big})),
                cache: "max-age=300",
            },
            "larger than 5120 bytes",
        ),
        (
            "mismatch.json",
            Answer::Json {
                body: docs.document("app.json", json!({})),
                cache: "max-age=300",
            },
            "is not the URL it was fetched from",
        ),
        (
            "secret.json",
            Answer::Json {
                body: docs.document(
                    "secret.json",
                    json!({"token_endpoint_auth_method": "client_secret_post"}),
                ),
                cache: "max-age=300",
            },
            "shared secret",
        ),
        (
            "elsewhere.json",
            Answer::Json {
                body: docs.document(
                    "elsewhere.json",
                    json!({"redirect_uris": ["https://elsewhere.example/cb"]}),
                ),
                cache: "max-age=300",
            },
            "not one of the client&#39;s registered redirect URIs",
        ),
        (
            "cleartext.json",
            Answer::Json {
                body: docs.document(
                    "cleartext.json",
                    json!({"redirect_uris": ["http://app.example.com/cb"]}),
                ),
                cache: "max-age=300",
            },
            "plain http to a host other than this machine",
        ),
        ("slow.json", Answer::Slow, "did not arrive within"),
        (
            "down.json",
            Answer::Raw {
                status: 503,
                content_type: "text/plain",
                body: String::new(),
                location: None,
            },
            "HTTP 503",
        ),
    ];
    // A document host that failed for now says nothing of the client: retry later (503),
    // where a bad document is refused (400).
    let transient = |path: &str| matches!(path, "slow.json" | "down.json");
    let browser = Browser::new();
    let (_, challenge) = pkce();
    for (path, answer, reason) in cases {
        docs.set(path, answer);
        for attempt in 1..=2 {
            let (status, page) = code_for(&browser, &base, &docs.url(path), &challenge, |_| {})
                .await
                .unwrap_err();
            let expected = if transient(path) {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::BAD_REQUEST
            };
            assert_eq!(status, expected, "{path}");
            assert!(
                page.contains(reason),
                "{path}: expected {reason:?} in {page}"
            );
            if path != "elsewhere.json" {
                assert_eq!(
                    docs.hits(path),
                    attempt,
                    "{path}: a refused document is fetched again"
                );
            }
        }
    }
    // At the token endpoint, invalid_client (which makes a client drop its credentials) only
    // for a document that is wrong; a host that failed for now is 503, to retry.
    for (path, status, error) in [
        (
            "down.json",
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
        ),
        (
            "slow.json",
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
        ),
        ("missing.json", StatusCode::UNAUTHORIZED, "invalid_client"),
        ("mismatch.json", StatusCode::UNAUTHORIZED, "invalid_client"),
    ] {
        let response = reqwest::Client::new()
            .post(format!("{base}/token"))
            .form(&[
                ("grant_type", "authorization_code"),
                ("code", "x"),
                ("code_verifier", "x"),
                ("client_id", &docs.url(path)),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{path}");
        let retry_after = response.headers().get("retry-after").is_some();
        assert_eq!(retry_after, transient(path), "{path}");
        let err: Value = response.json().await.unwrap();
        assert_eq!(err["error"], error, "{path}: {err}");
    }
    // Addresses no document is fetched from, whatever the switch for loopback says.
    for client_id in [
        "https://10.0.0.1/c.json",
        "https://169.254.169.254/latest/meta-data",
        "https://[fd00::1]/c.json",
    ] {
        let (status, page) = code_for(&browser, &base, client_id, &challenge, |_| {})
            .await
            .unwrap_err();
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(page.contains("special-use"), "{client_id}: {page}");
    }
    // The token endpoint, which anyone may call, tells no more than the pages: neither the
    // network a name is in nor what the resolver said.
    for client_id in [
        "https://10.0.0.1/c.json",
        "https://no-such-host.invalid/c.json",
    ] {
        let (status, err) = token(
            &base,
            &[
                ("grant_type", "authorization_code"),
                ("code", "x"),
                ("code_verifier", "x"),
                ("client_id", client_id),
            ],
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{client_id}: {err}");
        let said = err["error_description"].as_str().unwrap();
        assert!(
            said.contains("not one this server fetches documents from"),
            "{said}"
        );
        assert!(
            !said.contains("10.0.0.0/8") && !said.contains("resolved"),
            "{said}"
        );
    }
    for (client_id, reason) in [
        ("http://localhost/c.json", "https scheme"),
        ("https://localhost/", "must have a path"),
        ("https://localhost/c.json#x", "fragment"),
    ] {
        let (_, page) = code_for(&browser, &base, client_id, &challenge, |_| {})
            .await
            .unwrap_err();
        assert!(page.contains(reason), "{client_id}: {page}");
    }
}
