//! `wharf serve --authorization-server` over real HTTP: a client registers (RFC 7591), a user
//! signs in and consents through the server's pages (driven here as a browser would, with its
//! cookies), the code is exchanged with PKCE, and the access token calls a tool on the same
//! server. Then what must be refused: reused codes and refresh tokens (which revoke their
//! family), missing or `plain` PKCE, redirects nobody registered, tokens for another
//! resource; and a flow that hops between two replicas on one store.

use crate::common;

use std::collections::HashMap;

use base64::Engine as _;
use common::ServerProcess;
use common::authz::{
    Browser, PASSWORD, UPSTREAM_CLIENT_ID, add_user, hidden, pkce, query, upstream_provider,
    user_command,
};
use common::import::{sqlite_url, unique};
use reqwest::StatusCode;
use reqwest::header::{LOCATION, RETRY_AFTER};
use serde_json::{Value, json};
use url::Url;

/// The arguments of a server that is its own authorization server, on `store`.
fn own_authorization_server(store: &str) -> [&str; 5] {
    [
        "--profile",
        "default",
        "--store",
        store,
        "--authorization-server",
    ]
}

/// A server that is its own authorization server, with user `alice`.
fn server(store: &str, extra: &[&str]) -> ServerProcess {
    server_with_env(store, extra, &[])
}

/// [`server`] with the environment variables `env` set.
fn server_with_env(store: &str, extra: &[&str], env: &[(&str, &str)]) -> ServerProcess {
    add_user(store, "alice");
    let args = [&own_authorization_server(store)[..], extra].concat();
    ServerProcess::start_with_env(common::free_port(), &args, env)
}

/// Registers a public native client redirecting to `redirect`.
async fn register(base: &str, redirect: &str) -> String {
    let body = registration(base, redirect, json!({})).await;
    body["client_id"].as_str().unwrap().to_owned()
}

/// Registers a public native client redirecting to `redirect`, with `more` metadata; the
/// server's answer.
async fn registration(base: &str, redirect: &str, more: Value) -> Value {
    let mut metadata = json!({
        "client_name": "Test CLI",
        "application_type": "native",
        "redirect_uris": [redirect],
        "token_endpoint_auth_method": "none",
    });
    metadata
        .as_object_mut()
        .unwrap()
        .extend(more.as_object().unwrap().clone());
    let response = reqwest::Client::new()
        .post(format!("{base}/register"))
        .json(&metadata)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.unwrap();
    assert!(
        body.get("client_secret").is_none(),
        "a public client gets no secret"
    );
    body
}

/// Registers a web client; its id and its redirect URI. A web redirect: a remembered consent
/// skips the page for it.
async fn web_client(base: &str) -> (String, &'static str) {
    let redirect = "https://client.example/callback";
    let web = json!({"application_type": "web"});
    let client_id = registration(base, redirect, web).await["client_id"]
        .as_str()
        .unwrap()
        .to_owned();
    (client_id, redirect)
}

/// The account page `browser` sees at `base`.
async fn account_page(browser: &Browser, base: &str) -> String {
    browser
        .get(&format!("{base}/account"))
        .await
        .text()
        .await
        .unwrap()
}

/// An authorization request's parameters: a code with an S256 challenge, and `extra`.
fn code_request<'a>(
    client_id: &'a str,
    redirect: &'a str,
    challenge: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut params = vec![
        ("response_type", "code"),
        ("client_id", client_id),
        ("redirect_uri", redirect),
        ("code_challenge", challenge),
        ("code_challenge_method", "S256"),
    ];
    params.extend_from_slice(extra);
    params
}

/// Runs the browser part: authorize, sign in (if asked), approve. Returns the redirect's
/// query parameters.
async fn authorize(
    browser: &Browser,
    base: &str,
    params: &[(&str, &str)],
) -> HashMap<String, String> {
    let url = Url::parse_with_params(&format!("{base}/authorize"), params).unwrap();
    let page = browser.get(url.as_str()).await;
    assert_eq!(page.status(), StatusCode::OK, "{:?}", page.text().await);
    let mut html = page.text().await.unwrap();
    if html.contains("Sign in</h1>") {
        let request = hidden(&html, "request");
        let csrf = hidden(&html, "csrf");
        let wrong = browser
            .post(
                &format!("{base}/authorize/login"),
                &[
                    ("request", &request),
                    ("csrf", &csrf),
                    ("username", "alice"),
                    ("password", "nope"),
                ],
            )
            .await;
        assert_eq!(wrong.status(), StatusCode::FORBIDDEN);
        assert!(wrong.text().await.unwrap().contains("wrong"));
        let signed_in = browser
            .post(
                &format!("{base}/authorize/login"),
                &[
                    ("request", &request),
                    ("csrf", &csrf),
                    ("username", "alice"),
                    ("password", PASSWORD),
                ],
            )
            .await;
        assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
        html = browser.follow(base, &signed_in).await;
    }
    assert!(html.contains("Allow access?"), "{html}");
    let approved = browser.approve(base, &html).await;
    assert_eq!(approved.status(), StatusCode::SEE_OTHER);
    query(approved.headers()[LOCATION].to_str().unwrap())
}

/// The authorization server's metadata (RFC 8414) at `base`.
async fn as_metadata(base: &str) -> Value {
    reqwest::get(format!("{base}/.well-known/oauth-authorization-server"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Posts `form` to the token or revocation endpoint at `path`, whose every answer must be
/// kept out of caches.
async fn post_form(base: &str, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .form(form)
        .send()
        .await
        .unwrap();
    assert!(
        response.headers()["cache-control"]
            .to_str()
            .unwrap()
            .contains("no-store"),
        "{path} answers are never cached"
    );
    response
}

async fn token(base: &str, form: &[(&str, &str)]) -> (StatusCode, Value) {
    let response = post_form(base, "/token", form).await;
    (response.status(), response.json().await.unwrap())
}

/// Exchanges `code` with its verifier, and `extra` parameters.
async fn redeem(
    base: &str,
    code: &str,
    client_id: &str,
    verifier: &str,
    extra: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut form = vec![
        ("grant_type", "authorization_code"),
        ("code", code),
        ("client_id", client_id),
        ("code_verifier", verifier),
    ];
    form.extend_from_slice(extra);
    token(base, &form).await
}

/// Exchanges refresh token `refresh` for `client_id`.
async fn refresh(base: &str, client_id: &str, refresh: &str) -> (StatusCode, Value) {
    let form = [
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh),
        ("client_id", client_id),
    ];
    token(base, &form).await
}

/// A code a new client (redirecting to `redirect`) got for `alice`, not yet redeemed.
struct Grant {
    client_id: String,
    verifier: String,
    code: String,
}

/// Registers a client and runs a whole sign-in and consent in a new browser.
async fn grant(base: &str, redirect: &str) -> Grant {
    let client_id = register(base, redirect).await;
    let (verifier, challenge) = pkce();
    let mut answer = authorize(
        &Browser::new(),
        base,
        &code_request(&client_id, redirect, &challenge, &[]),
    )
    .await;
    let code = answer.remove("code").expect("a code");
    Grant {
        client_id,
        verifier,
        code,
    }
}

impl Grant {
    /// Redeems the code with its verifier.
    async fn redeem(&self, base: &str) -> (StatusCode, Value) {
        redeem(base, &self.code, &self.client_id, &self.verifier, &[]).await
    }
}

/// An access token's claims, read without checking its signature.
fn claims(access: &str) -> Value {
    let payload = access.split('.').nth(1).unwrap();
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&json).unwrap()
}

/// A registration body for a public native client.
fn native_client() -> Value {
    json!({"application_type": "native", "redirect_uris": ["http://127.0.0.1:9/cb"], "token_endpoint_auth_method": "none"})
}

/// Asserts that OAuth error `err` says `words` in its description.
#[track_caller]
fn says(err: &Value, words: &str) {
    let description = err["error_description"].as_str().unwrap_or_default();
    assert!(description.contains(words), "{err}");
}

/// The error a refusal page links back to the client with.
async fn refused(response: reqwest::Response) -> HashMap<String, String> {
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let page = response.text().await.unwrap();
    let marker = "id=\"return\" href=\"";
    let start = page
        .find(marker)
        .unwrap_or_else(|| panic!("no link back in {page}"))
        + marker.len();
    let link = &page[start..start + page[start..].find('"').unwrap()];
    query(&link.replace("&amp;", "&"))
}

/// `refresh_token` is refused as revoked at once, and `access` (bought with it) stops
/// calling the server within seconds.
async fn revoked(server: &ServerProcess, client_id: &str, refresh_token: &str, access: &str) {
    let (status, err) = refresh(&server.origin(), client_id, refresh_token).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    says(&err, "revoked");
    until_refused(server, access).await;
}

/// After its person was signed out everywhere: their tokens are [`revoked`], and `pending`, a
/// code (with its verifier) issued before and not yet redeemed, is refused.
async fn signed_out_everywhere(
    server: &ServerProcess,
    client_id: &str,
    (refresh_token, access): (&str, &str),
    (pending, verifier): (&str, &str),
) {
    revoked(server, client_id, refresh_token, access).await;
    let (status, err) = redeem(&server.origin(), pending, client_id, verifier, &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    says(&err, "signed out");
}

/// Waits until `token` is refused (401): a revoked family's access tokens stop within the
/// two seconds the resource server trusts a family it found alive.
async fn until_refused(server: &ServerProcess, token: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tools_list(server, token).await != Some(401) {
        assert!(
            std::time::Instant::now() < deadline,
            "the revoked family's access token still works"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `None` when `tools/list` succeeds with `token`; else the HTTP status or JSON-RPC code.
async fn tools_list(server: &ServerProcess, token: &str) -> Option<i64> {
    let reply = server
        .client()
        .with_bearer(token)
        .request("tools/list", json!({}))
        .await
        .unwrap();
    if reply.status != 200 {
        return Some(i64::from(reply.status));
    }
    reply.error_code()
}

#[tokio::test]
async fn a_registered_client_signs_a_user_in_and_calls_a_tool() {
    let store = sqlite_url(&unique("authz-flow"));
    let server = server(&store, &[]);
    let base = server.origin();

    let metadata = as_metadata(&base).await;
    assert_eq!(metadata["issuer"], base);
    assert_eq!(
        metadata["code_challenge_methods_supported"],
        json!(["S256"])
    );
    assert_eq!(metadata["client_id_metadata_document_supported"], true);
    assert_eq!(
        metadata["authorization_response_iss_parameter_supported"],
        true
    );
    assert_eq!(
        metadata["registration_endpoint"],
        format!("{base}/register")
    );
    assert_eq!(metadata["revocation_endpoint"], format!("{base}/revoke"));
    // The protected resource metadata names this server as its authorization server.
    let resource: Value = reqwest::get(format!("{base}/.well-known/oauth-protected-resource/mcp"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resource["authorization_servers"], json!([base]));

    // A web client may not register a loopback redirect; the error names the field.
    let refused = reqwest::Client::new()
        .post(format!("{base}/register"))
        .json(&json!({"application_type": "web", "redirect_uris": ["http://127.0.0.1:9/cb"], "token_endpoint_auth_method": "none"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "invalid_redirect_uri");
    says(&body, "application_type");
    // Without an application_type, loopback redirects alone make a native client, as
    // clients that never send one expect.
    let inferred = reqwest::Client::new()
        .post(format!("{base}/register"))
        .json(&json!({"redirect_uris": ["http://127.0.0.1:19876/cb"], "token_endpoint_auth_method": "none"}))
        .send()
        .await
        .unwrap();
    assert_eq!(inferred.status(), StatusCode::CREATED);
    let body: Value = inferred.json().await.unwrap();
    assert_eq!(body["application_type"], "native", "{body}");

    let redirect = "http://127.0.0.1:33418/callback";
    let client_id = register(&base, redirect).await;
    let (verifier, challenge) = pkce();
    let browser = Browser::new();
    let answer = authorize(
        &browser,
        &base,
        &code_request(&client_id, redirect, &challenge, &[("state", "s-1")]),
    )
    .await;
    assert_eq!(answer["state"], "s-1");
    assert_eq!(answer["iss"], base, "RFC 9207");
    let code = answer["code"].clone();
    let exchange = [
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("redirect_uri", redirect),
        ("client_id", client_id.as_str()),
        ("code_verifier", verifier.as_str()),
    ];
    let (status, tokens) = token(&base, &exchange).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    assert_eq!(tokens["token_type"], "Bearer");
    let access = tokens["access_token"].as_str().unwrap();
    let r1 = tokens["refresh_token"].as_str().unwrap().to_owned();
    assert_eq!(
        tools_list(&server, access).await,
        None,
        "the token calls the server"
    );
    assert_eq!(tools_list(&server, "not-a-token").await, Some(401));

    // The code again: refused, and what it produced is revoked.
    let (status, err) = token(&base, &exchange).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_grant"))
    );
    says(&err, "already used");
    // And the access token it bought stops working, though it has not expired.
    revoked(&server, &client_id, &r1, access).await;

    // A code the client got before the consent is withdrawn, redeemed after.
    let (late_verifier, challenge) = pkce();
    let late = authorize(
        &browser,
        &base,
        &code_request(&client_id, redirect, &challenge, &[]),
    )
    .await;
    let late_code = late["code"].clone();
    let late_exchange = [
        ("grant_type", "authorization_code"),
        ("code", late_code.as_str()),
        ("client_id", client_id.as_str()),
        ("code_verifier", late_verifier.as_str()),
    ];

    // The consent is remembered, and listed on the account page, where it can be revoked.
    let account = account_page(&browser, &base).await;
    assert!(
        account.contains("Test CLI") && account.contains(&client_id),
        "{account}"
    );
    let csrf = hidden(&account, "csrf");
    let revoked = browser
        .post(
            &format!("{base}/account/consents/revoke"),
            &[("client_id", &client_id), ("csrf", &csrf)],
        )
        .await;
    assert_eq!(revoked.status(), StatusCode::SEE_OTHER);
    let account = account_page(&browser, &base).await;
    assert!(!account.contains(&client_id), "{account}");
    // What the client held when the consent went is refused, the code it had not yet
    // redeemed too.
    let (status, err) = token(&base, &late_exchange).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_grant"))
    );
    says(&err, "withdrawn the consent");
    // Consenting again starts over.
    let (verifier, challenge) = pkce();
    let again = authorize(
        &browser,
        &base,
        &code_request(&client_id, redirect, &challenge, &[]),
    )
    .await;
    let exchange = [
        ("grant_type", "authorization_code"),
        ("code", again["code"].as_str()),
        ("client_id", client_id.as_str()),
        ("code_verifier", verifier.as_str()),
    ];
    let (status, tokens) = token(&base, &exchange).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
}

#[tokio::test]
async fn pkce_is_required_s256_only_and_a_failed_exchange_burns_nothing() {
    let store = sqlite_url(&unique("authz-pkce"));
    let server = server(&store, &[]);
    let base = server.origin();
    let redirect = "http://127.0.0.1:33419/callback";
    let client_id = register(&base, redirect).await;
    let browser = Browser::new();
    let (verifier, challenge) = pkce();
    for (method, challenge) in [
        (None, None),
        (Some("plain"), Some(verifier.as_str())),
        (None, Some(challenge.as_str())),
    ] {
        let mut params = vec![
            ("response_type", "code"),
            ("client_id", client_id.as_str()),
            ("redirect_uri", redirect),
            ("state", "st"),
        ];
        params.extend(challenge.map(|c| ("code_challenge", c)));
        params.extend(method.map(|m| ("code_challenge_method", m)));
        let url = Url::parse_with_params(&format!("{base}/authorize"), &params).unwrap();
        let response = browser.get(url.as_str()).await;
        // Shown on a page, never redirected by itself: the page links back to the client.
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{method:?}");
        assert!(response.headers().get(LOCATION).is_none());
        let answer = refused(response).await;
        assert_eq!(answer["error"], "invalid_request");
        assert!(
            answer["error_description"].contains("code_challenge"),
            "{answer:?}"
        );
        assert_eq!(
            (answer["state"].as_str(), answer["iss"].as_str()),
            ("st", base.as_str())
        );
        assert!(!answer.contains_key("code"));
    }

    let answer = authorize(
        &browser,
        &base,
        &code_request(&client_id, redirect, &challenge, &[]),
    )
    .await;
    let code = answer["code"].as_str();
    let with_verifier = |v: &'static str| {
        [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("client_id", client_id.as_str()),
            ("code_verifier", v),
        ]
    };
    let other = Box::leak(pkce().0.into_boxed_str());
    let (status, err) = token(&base, &with_verifier(other)).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_grant"))
    );
    says(&err, "code_verifier");
    let (status, _) = token(
        &base,
        &[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("client_id", &client_id),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no verifier at all");
    // Wrong guesses did not burn the code: the client with the right verifier gets tokens.
    let verifier: &'static str = Box::leak(verifier.into_boxed_str());
    let (status, tokens) = token(&base, &with_verifier(verifier)).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
}

#[tokio::test]
async fn refresh_tokens_rotate_and_a_reused_one_revokes_its_family() {
    let store = sqlite_url(&unique("authz-refresh"));
    let server = server(&store, &[]);
    let base = server.origin();
    let grant = grant(&base, "http://127.0.0.1:33420/callback").await;
    let (_, first) = grant.redeem(&base).await;
    let r1 = first["refresh_token"].as_str().unwrap();
    let pool = sqlx::SqlitePool::connect(&format!("{store}?mode=rw"))
        .await
        .unwrap();
    let consent = "namespace = 'authz-consent'";
    let consent_expiry = async || -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT expires_at FROM wharf_records WHERE {consent}"
        ))
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    // The consent is about to expire: a refresh of its grant keeps it, so that /account
    // still lists the client that holds tokens.
    let day: i64 = 24 * 3600 * 1000;
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    sqlx::query(&format!(
        "UPDATE wharf_records SET expires_at = ? WHERE {consent}"
    ))
    .bind(now + day)
    .execute(&pool)
    .await
    .unwrap();
    // Parameters sent without a value are as if omitted (RFC 6749 §3.2): the same scope
    // and resource as before, not none.
    let form = [
        ("grant_type", "refresh_token"),
        ("refresh_token", r1),
        ("client_id", grant.client_id.as_str()),
        ("scope", ""),
        ("resource", ""),
    ];
    let (status, second) = token(&base, &form).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["scope"], first["scope"], "{second}");
    assert!(
        consent_expiry().await > now + 300 * day,
        "the consent was kept"
    );
    let r2 = second["refresh_token"].as_str().unwrap();
    assert_ne!(r1, r2, "rotated at use");
    assert_eq!(
        tools_list(&server, second["access_token"].as_str().unwrap()).await,
        None
    );
    // A consent record that has expired (gone from the store) is not a withdrawal: the
    // grant made under it goes on.
    let expired = sqlx::query(&format!("DELETE FROM wharf_records WHERE {consent}"))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(expired.rows_affected(), 1);
    pool.close().await;
    let (status, third) = refresh(&base, &grant.client_id, r2).await;
    assert_eq!(status, StatusCode::OK, "{third}");
    let r3 = third["refresh_token"].as_str().unwrap();
    // r1 again: someone holds a copy. The family goes, r3 with it.
    let (status, err) = refresh(&base, &grant.client_id, r1).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    says(&err, "already used");
    until_refused(&server, third["access_token"].as_str().unwrap()).await;
    let (status, err) = refresh(&base, &grant.client_id, r3).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    says(&err, "revoked");
    // Another client cannot use a refresh token it was not given.
    let stranger = register(&base, "http://127.0.0.1:33420/callback").await;
    let (status, err) = refresh(&base, &stranger, r3).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_grant"))
    );
}

/// A sign-in form a browser was shown for a new authorization request.
struct Login {
    request: String,
    csrf: String,
}

/// Starts an authorization request in `browser`, which must be shown the sign-in form.
async fn login_form(browser: &Browser, base: &str, client_id: &str, redirect: &str) -> Login {
    let page = login_page(browser, base, client_id, redirect).await;
    Login::read(&page.text().await.unwrap())
}

/// The answer to a new authorization request from `browser`, not signed in.
async fn login_page(
    browser: &Browser,
    base: &str,
    client_id: &str,
    redirect: &str,
) -> reqwest::Response {
    let (_, challenge) = pkce();
    let params = code_request(client_id, redirect, &challenge, &[]);
    let url = Url::parse_with_params(&format!("{base}/authorize"), &params).unwrap();
    browser.get(url.as_str()).await
}

impl Login {
    /// The sign-in form of page `html`.
    fn read(html: &str) -> Self {
        assert!(html.contains("Sign in</h1>"), "{html}");
        Login {
            request: hidden(html, "request"),
            csrf: hidden(html, "csrf"),
        }
    }

    /// Submits the form from `browser` as `alice` with `password`.
    async fn submit(&self, browser: &Browser, base: &str, password: &str) -> reqwest::Response {
        let form = [
            ("request", self.request.as_str()),
            ("csrf", self.csrf.as_str()),
            ("username", "alice"),
            ("password", password),
        ];
        browser
            .post(&format!("{base}/authorize/login"), &form)
            .await
    }
}

/// The host of `--public-url` is served without `--allowed-host`: behind a proxy that passes
/// `Host` on (as the nginx of `deploy/` does), the README's command was refused 403 on the
/// MCP endpoint and its metadata. Other hosts still are.
#[tokio::test]
async fn the_public_urls_host_is_served_without_naming_it_again() {
    let server = server(
        &sqlite_url(&unique("authz-public-host")),
        &["--public-url", "https://mcp.example.com"],
    );
    let base = server.origin();
    let http = reqwest::Client::new();
    let metadata = |host: &'static str| {
        http.get(format!("{base}/.well-known/oauth-protected-resource/mcp"))
            .header(reqwest::header::HOST, host)
            .send()
    };
    let served = metadata("mcp.example.com").await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    let body: Value = served.json().await.unwrap();
    assert_eq!(body["resource"], "https://mcp.example.com/mcp", "{body}");
    let call = http
        .post(format!("{base}/mcp"))
        .header(reqwest::header::HOST, "mcp.example.com")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(call.status(), StatusCode::UNAUTHORIZED, "asks for a token");
    assert_eq!(
        metadata("elsewhere.example").await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
}

/// A form posted from elsewhere (another site's page in a victim's browser: no sign-in of
/// its own, no CSRF token) is refused before it counts against the address's sign-in
/// budget, so it cannot lock out the people behind that address; and each page of a
/// sign-in sets its browser cookie again, so a cookie that would expire meanwhile is
/// renewed with the same value.
#[tokio::test]
async fn forms_from_elsewhere_do_not_spend_the_sign_in_budget() {
    let server = server(&sqlite_url(&unique("authz-forged")), &[]);
    let base = server.origin();
    let redirect = "http://127.0.0.1:33437/callback";
    let client_id = register(&base, redirect).await;
    let owner = Browser::new();
    let login = login_form(&owner, &base, &client_id, redirect).await;
    let cookie = owner
        .cookie("wharf_authz_browser")
        .expect("a browser cookie");

    let elsewhere = Browser::new();
    for _ in 0..25 {
        let forged = [
            ("request", login.request.as_str()),
            ("csrf", "guessed"),
            ("username", "alice"),
            ("password", "guess"),
        ];
        let refused = elsewhere
            .post(&format!("{base}/authorize/login"), &forged)
            .await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    }

    let page = login_page(&owner, &base, &client_id, redirect).await;
    let renewed: Vec<_> = page
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|h| h.to_str().ok())
        .filter(|h| h.starts_with("wharf_authz_browser="))
        .collect();
    assert_eq!(renewed.len(), 1, "{renewed:?}");
    assert!(
        renewed[0].starts_with(&format!("wharf_authz_browser={cookie};")),
        "renewed with the same value: {renewed:?}"
    );
    let again = Login::read(&page.text().await.unwrap());
    let signed_in = again.submit(&owner, &base, PASSWORD).await;
    assert_eq!(
        signed_in.status(),
        StatusCode::SEE_OTHER,
        "the budget is whole"
    );
}

/// Guesses at one account's password are spaced out once five have failed, whatever the
/// per-address budget has left: an attempt that must wait is refused with `Retry-After`
/// before its password is checked (the right one too). The browser the account's owner
/// signed in on before is not slowed by the stranger.
#[tokio::test]
async fn a_strangers_guesses_slow_the_account_down_but_not_its_owners_browser() {
    let server = server(&sqlite_url(&unique("authz-guess")), &[]);
    let base = server.origin();
    let redirect = "http://127.0.0.1:33424/callback";
    let client_id = register(&base, redirect).await;
    let (_, challenge) = pkce();
    let owner = Browser::new();
    authorize(
        &owner,
        &base,
        &code_request(&client_id, redirect, &challenge, &[]),
    )
    .await;
    // Her session ends; the browser still carries its device cookie.
    owner.forget("wharf_authz_session");

    let stranger = Browser::new();
    let login = login_form(&stranger, &base, &client_id, redirect).await;
    let sign_in = async |password: &str| login.submit(&stranger, &base, password).await;
    for _ in 0..5 {
        assert_eq!(sign_in("guess").await.status(), StatusCode::FORBIDDEN);
    }
    // Guess on until a refusal leaves more than three seconds to wait, so that the next
    // attempt (no password hashed) surely comes within it; each wait taken doubles the next.
    let mut waits = 0;
    loop {
        let slowed = sign_in("guess").await;
        if slowed.status() == StatusCode::FORBIDDEN {
            continue;
        }
        assert_eq!(slowed.status(), StatusCode::TOO_MANY_REQUESTS);
        let wait: u64 = slowed.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let page = slowed.text().await.unwrap();
        assert!(page.contains("Too many failed sign-ins"), "{page}");
        assert!(page.contains("id=\"sign-in\""), "the form stays: {page}");
        if wait >= 4 {
            break;
        }
        waits += 1;
        assert!(waits < 8, "the waits do not grow");
        tokio::time::sleep(std::time::Duration::from_millis(wait * 1000 + 100)).await;
    }
    let right = sign_in(PASSWORD).await;
    assert_eq!(
        right.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "not even checked"
    );

    let login = login_form(&owner, &base, &client_id, redirect).await;
    let signed_in = login.submit(&owner, &base, PASSWORD).await;
    assert_eq!(
        signed_in.status(),
        StatusCode::SEE_OTHER,
        "her browser is let in"
    );
}

/// A row of the store's records table: namespace, key, value, version, owner, expiry.
type RecordRow = (String, String, String, i64, Option<String>, Option<i64>);

/// `wharf user passwd` gives an account a new password and signs it out everywhere (its
/// refresh tokens refused, its access tokens within two seconds); `wharf user remove` takes
/// the account away.
#[tokio::test]
async fn an_administrator_resets_a_password_and_removes_an_account() {
    let store = sqlite_url(&unique("authz-admin"));
    let server = server(&store, &[]);
    let base = server.origin();
    let redirect = "http://127.0.0.1:33429/callback";
    let client_id = register(&base, redirect).await;
    let browser = Browser::new();
    let code = async || {
        let (verifier, challenge) = pkce();
        let params = code_request(&client_id, redirect, &challenge, &[]);
        let answer = authorize(&browser, &base, &params).await;
        (answer["code"].clone(), verifier)
    };
    let (first, verifier) = code().await;
    let (_, tokens) = redeem(&base, &first, &client_id, &verifier, &[]).await;
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(tools_list(&server, access).await, None);
    // A second code from the same session, not yet redeemed when the password changes.
    let (pending, pending_verifier) = code().await;

    let pool = sqlx::SqlitePool::connect(&format!("{store}?mode=rw"))
        .await
        .unwrap();
    let sessions_and_families = "SELECT namespace, key, value, version, owner, expires_at \
        FROM wharf_records WHERE namespace IN ('authz-session', 'authz-family')";
    let before: Vec<RecordRow> = sqlx::query_as(sessions_and_families)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(before.len(), 2, "one session, one family: {before:?}");

    let new = "a brand new passphrase";
    let said = user_command(&store, "passwd", "alice", new);
    assert!(said.contains("tokens revoked"), "{said}");
    let r1 = tokens["refresh_token"].as_str().unwrap();
    signed_out_everywhere(
        &server,
        &client_id,
        (r1, access),
        (&pending, &pending_verifier),
    )
    .await;
    // The session and the family as they were, written again after the change as a sign-in
    // racing it would: the clean-up cannot have found them, and they count no more.
    for (namespace, key, value, version, owner, expires_at) in before {
        sqlx::query("INSERT OR REPLACE INTO wharf_records VALUES (?, ?, ?, ?, ?, ?)")
            .bind(namespace)
            .bind(key)
            .bind(value)
            .bind(version)
            .bind(owner)
            .bind(expires_at)
            .execute(&pool)
            .await
            .unwrap();
    }
    pool.close().await;
    let (status, err) = refresh(&base, &client_id, r1).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    says(&err, "signed out");
    // The browser's session counts no more: it is asked to sign in again.
    login_form(&browser, &base, &client_id, redirect).await;
    let sign_in = async |password: &str| {
        let browser = Browser::new();
        let login = login_form(&browser, &base, &client_id, redirect).await;
        login.submit(&browser, &base, password).await.status()
    };
    assert_eq!(sign_in(PASSWORD).await, StatusCode::FORBIDDEN);
    assert_eq!(sign_in(new).await, StatusCode::SEE_OTHER);

    let said = user_command(&store, "remove", "alice", "");
    assert!(said.contains("removed"), "{said}");
    assert_eq!(sign_in(new).await, StatusCode::FORBIDDEN);
}

/// A server on `store` that signs people in through the test's upstream OpenID provider,
/// named "Idp". Its environment names a proxy nobody answers on: a provider on loopback is
/// reached directly (through a proxy, "127.0.0.1" would be the proxy's machine).
async fn upstream_server(store: &str) -> ServerProcess {
    let issuer = upstream_provider().await;
    let upstream = [
        "--authz-upstream-issuer",
        &issuer,
        "--authz-upstream-client-id",
        UPSTREAM_CLIENT_ID,
        "--authz-upstream-name",
        "Idp",
    ];
    let proxy = format!("http://127.0.0.1:{}", common::free_port());
    server_with_env(store, &upstream, &common::proxy_env(&proxy))
}

/// Runs an authorization request for `client_id` in `browser` up to its code: the sign-in
/// page (which `sign_in` says must be shown) through the test provider as `subject`, then
/// the consent. The code and its verifier.
async fn upstream_code(
    browser: &Browser,
    base: &str,
    (client_id, redirect): (&str, &str),
    subject: &str,
    sign_in: bool,
) -> (String, String) {
    let (verifier, challenge) = pkce();
    let params = code_request(client_id, redirect, &challenge, &[]);
    let url = Url::parse_with_params(&format!("{base}/authorize"), &params).unwrap();
    let mut html = browser.get(url.as_str()).await.text().await.unwrap();
    assert_eq!(html.contains("Sign in</h1>"), sign_in, "{html}");
    if sign_in {
        let request = hidden(&html, "request");
        let start = format!("{base}/authorize/upstream?request={request}");
        let off = browser.get(&start).await;
        assert_eq!(off.status(), StatusCode::SEE_OTHER);
        let at_provider = query(off.headers()[LOCATION].to_str().unwrap());
        let code = format!("{subject}.{}", at_provider["nonce"]);
        let callback = Url::parse_with_params(
            &format!("{base}/authorize/upstream/callback"),
            &[("code", code.as_str()), ("state", &at_provider["state"])],
        )
        .unwrap();
        let back = browser.get(callback.as_str()).await;
        assert_eq!(
            back.status(),
            StatusCode::SEE_OTHER,
            "{:?}",
            back.text().await
        );
        html = browser.follow(base, &back).await;
    }
    assert!(html.contains("Allow access?"), "{html}");
    let approved = browser.approve(base, &html).await;
    assert_eq!(approved.status(), StatusCode::SEE_OTHER);
    let mut answer = query(approved.headers()[LOCATION].to_str().unwrap());
    (answer.remove("code").expect("a code"), verifier)
}

/// A person an upstream provider signed in has no account here, yet `wharf user remove
/// PROVIDER:SUBJECT` signs them out everywhere as it does an account: their refresh tokens
/// are refused at once, their access tokens within two seconds, a code not yet redeemed and
/// their browser's session no longer count. Someone else the provider signed in keeps
/// theirs, and the person may sign in through the provider again.
#[tokio::test]
async fn an_administrator_signs_out_a_person_an_upstream_provider_signed_in() {
    let store = sqlite_url(&unique("authz-upstream-admin"));
    let server = upstream_server(&store).await;
    let base = server.origin();
    let redirect = "http://127.0.0.1:33431/callback";
    let client_id = register(&base, redirect).await;
    let client = (client_id.as_str(), redirect);
    let browser = Browser::new();
    let (code, verifier) = upstream_code(&browser, &base, client, "person-1", true).await;
    let (status, tokens) = redeem(&base, &code, &client_id, &verifier, &[]).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(claims(access)["sub"], "Idp:person-1");
    assert_eq!(tools_list(&server, access).await, None);
    // A second code from the same session, not yet redeemed when the person is signed out.
    let (pending, pending_verifier) =
        upstream_code(&browser, &base, client, "person-1", false).await;
    let (code, verifier) = upstream_code(&Browser::new(), &base, client, "person-2", true).await;
    let (_, others) = redeem(&base, &code, &client_id, &verifier, &[]).await;

    let said = user_command(&store, "remove", "Idp:person-1", "");
    assert!(said.contains("signed out everywhere"), "{said}");
    let r1 = tokens["refresh_token"].as_str().unwrap();
    signed_out_everywhere(
        &server,
        &client_id,
        (r1, access),
        (&pending, &pending_verifier),
    )
    .await;
    let (status, refreshed) =
        refresh(&base, &client_id, others["refresh_token"].as_str().unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{refreshed}");

    // The browser is asked to sign in again, and the provider's word is enough for that.
    let (code, verifier) = upstream_code(&browser, &base, client, "person-1", true).await;
    let (status, tokens) = redeem(&base, &code, &client_id, &verifier, &[]).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(tools_list(&server, access).await, None);
}

/// Each trip to the upstream provider counts as a sign-in attempt: one pending request
/// started over and over is refused past the address's budget (20 a minute), where each
/// start used to store a round trip for ten minutes, without limit.
#[tokio::test]
async fn trips_to_the_upstream_provider_count_against_the_sign_in_budget() {
    let store = sqlite_url(&unique("authz-upstream-budget"));
    let server = upstream_server(&store).await;
    let base = server.origin();
    let redirect = "http://127.0.0.1:33432/callback";
    let client_id = register(&base, redirect).await;
    let browser = Browser::new();
    let (_, challenge) = pkce();
    let params = code_request(&client_id, redirect, &challenge, &[]);
    let url = Url::parse_with_params(&format!("{base}/authorize"), &params).unwrap();
    let html = browser.get(url.as_str()).await.text().await.unwrap();
    let start = format!(
        "{base}/authorize/upstream?request={}",
        hidden(&html, "request")
    );
    // The budget gives one attempt back every 3 s: a slow machine may get a 21st in.
    let mut trips = 0;
    let refused = loop {
        let off = browser.get(&start).await;
        if off.status() != StatusCode::SEE_OTHER {
            break off;
        }
        trips += 1;
        assert!(trips <= 30, "{trips} trips and no refusal");
    };
    assert!(trips >= 20, "refused after {trips} trips");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()[RETRY_AFTER], "60");
    let pool = sqlx::SqlitePool::connect(&format!("{store}?mode=ro"))
        .await
        .unwrap();
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM wharf_records WHERE namespace = 'authz-upstream'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, trips, "a refused start stored nothing");
}

/// A client allowed two resources of one authorization server keeps both: asking for the
/// first again skips the page (a web redirect), and the account page lists what it may hold
/// on each. The second consent used to replace the first, so the page came back at every
/// switch and the account page showed the last resource only.
#[tokio::test]
async fn a_consent_for_a_second_resource_keeps_the_first() {
    let other = "https://other.example/mcp";
    let server = server(
        &sqlite_url(&unique("authz-two-resources")),
        &["--authz-resource", other],
    );
    let base = server.origin();
    let (client_id, redirect) = web_client(&base).await;
    let (_, challenge) = pkce();
    let own = code_request(&client_id, redirect, &challenge, &[]);
    let elsewhere = code_request(&client_id, redirect, &challenge, &[("resource", other)]);
    let browser = Browser::new();
    authorize(&browser, &base, &own).await;
    authorize(&browser, &base, &elsewhere).await;
    for params in [&own, &elsewhere] {
        let url = Url::parse_with_params(&format!("{base}/authorize"), params).unwrap();
        let answer = browser.get(url.as_str()).await;
        assert_eq!(answer.status(), StatusCode::SEE_OTHER, "{params:?}");
        let location = answer.headers()[LOCATION].to_str().unwrap().to_owned();
        assert!(query(&location).contains_key("code"), "{location}");
    }
    let account = account_page(&browser, &base).await;
    let own_resource = format!("{base}/mcp");
    for resource in [own_resource.as_str(), other] {
        assert!(
            account.contains(&format!("{resource}: ")),
            "{resource}: {account}"
        );
    }
}

/// On a shared computer, signing out on the account page ends the browser's session: an
/// application the user allowed no longer gets a code without anyone being asked, and a
/// copy of the old session cookie signs nobody in. A sign-out without the page's CSRF token
/// is refused and changes nothing.
#[tokio::test]
async fn signing_out_ends_the_browsers_session() {
    let server = server(&sqlite_url(&unique("authz-signout")), &[]);
    let base = server.origin();
    let (client_id, redirect) = web_client(&base).await;
    let (_, challenge) = pkce();
    let params = code_request(&client_id, redirect, &challenge, &[]);
    let browser = Browser::new();
    authorize(&browser, &base, &params).await;
    let url = Url::parse_with_params(&format!("{base}/authorize"), &params).unwrap();
    let session = browser.cookie("wharf_authz_session").expect("a session");
    // What the next person at this browser gets: a code, nobody asked. And what a copy of
    // the session cookie gets.
    let unasked = async |browser: &Browser| {
        let answer = browser.get(url.as_str()).await;
        match answer.status() {
            StatusCode::SEE_OTHER => {
                let location = answer.headers()[LOCATION].to_str().unwrap().to_owned();
                assert!(location.starts_with(redirect), "{location}");
                assert!(query(&location).contains_key("code"), "{location}");
                true
            }
            status => {
                let page = answer.text().await.unwrap();
                assert_eq!(status, StatusCode::OK, "{page}");
                assert!(page.contains("Sign in</h1>"), "{page}");
                false
            }
        }
    };
    let copy = async || {
        let copied = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .get(url.as_str())
            .header("cookie", format!("wharf_authz_session={session}"))
            .send()
            .await
            .unwrap();
        copied.status() == StatusCode::SEE_OTHER
    };
    assert!(unasked(&browser).await);
    assert!(copy().await);

    let account = browser.get(&format!("{base}/account")).await;
    let account = account.text().await.unwrap();
    assert!(account.contains("id=\"sign-out\""), "{account}");
    let csrf = hidden(&account, "csrf");
    let sign_out = format!("{base}/account/signout");
    let forged = browser.post(&sign_out, &[("csrf", "forged")]).await;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let without = browser.post(&sign_out, &[]).await;
    assert!(without.status().is_client_error(), "{}", without.status());
    assert!(
        unasked(&browser).await,
        "a refused sign-out changes nothing"
    );

    let signed_out = browser.post(&sign_out, &[("csrf", &csrf)]).await;
    assert_eq!(signed_out.status(), StatusCode::OK);
    let expired = signed_out.headers().get_all("set-cookie").iter().any(|c| {
        let c = c.to_str().unwrap();
        c.starts_with("wharf_authz_session=;") && c.contains("Max-Age=0")
    });
    assert!(expired, "{:?}", signed_out.headers());
    assert!(!unasked(&browser).await);
    assert!(
        !copy().await,
        "the session itself is gone, not only the cookie"
    );
    let account = browser.get(&format!("{base}/account")).await;
    assert_eq!(account.status(), StatusCode::FORBIDDEN);
}

/// Posts `form` to `/revoke` (RFC 7009); the status and the body.
async fn revoke(base: &str, form: &[(&str, &str)]) -> (StatusCode, String) {
    let response = post_form(base, "/revoke", form).await;
    (response.status(), response.text().await.unwrap())
}

/// A client that is done (its user signed out) revokes a token at `/revoke`, and the whole
/// family goes: by its refresh token, or by an access token. Unknown tokens are answered as
/// revoked; another client's token, a request without a token, or a client that does not
/// authenticate are refused.
#[tokio::test]
async fn a_client_revokes_its_tokens_at_the_revocation_endpoint() {
    let server = server(&sqlite_url(&unique("authz-revoke")), &[]);
    let base = server.origin();
    let redirect = "http://127.0.0.1:33428/callback";

    // Refused: another client's token, no token, a client that does not authenticate, an
    // access token whose signature is not this server's. None of them revoked anything:
    // the refresh token still rotates.
    let first = grant(&base, redirect).await;
    let (_, tokens) = first.redeem(&base).await;
    let stranger = register(&base, redirect).await;
    let r0 = tokens["refresh_token"].as_str().unwrap();
    let (status, body) = revoke(&base, &[("token", r0), ("client_id", &stranger)]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("unauthorized_client") && body.contains("another client"),
        "{body}"
    );
    let (status, body) = revoke(&base, &[("client_id", &first.client_id)]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("token is required"), "{body}");
    let (status, body) = revoke(&base, &[("token", r0), ("client_id", "wc_nobody")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let access = tokens["access_token"].as_str().unwrap();
    let (head, payload) = access.rsplit_once('.').unwrap().0.split_once('.').unwrap();
    let forged = format!("{head}.{payload}.{}", "A".repeat(86));
    let (status, _) = revoke(
        &base,
        &[("token", &forged), ("client_id", &first.client_id)],
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "not this server's token: nothing to revoke"
    );
    let (status, tokens) = refresh(&base, &first.client_id, r0).await;
    assert_eq!(status, StatusCode::OK, "the family lives: {tokens}");

    // By the refresh token: it stops at once, the access token within two seconds.
    let (access, r1) = (
        tokens["access_token"].as_str().unwrap(),
        tokens["refresh_token"].as_str().unwrap(),
    );
    let hint = [
        ("token", r1),
        ("token_type_hint", "refresh_token"),
        ("client_id", &first.client_id),
    ];
    let (status, body) = revoke(&base, &hint).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    revoked(&server, &first.client_id, r1, access).await;
    // Again: nothing left to revoke, and that is no error.
    let (status, _) = revoke(&base, &hint).await;
    assert_eq!(status, StatusCode::OK);

    // By the access token: the family's refresh token goes with it.
    let second = grant(&base, redirect).await;
    let (_, tokens) = second.redeem(&base).await;
    let (access, r1) = (
        tokens["access_token"].as_str().unwrap(),
        tokens["refresh_token"].as_str().unwrap(),
    );
    let (status, _) = revoke(
        &base,
        &[("token", access), ("client_id", &second.client_id)],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = refresh(&base, &second.client_id, r1).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    until_refused(&server, access).await;

    let (status, _) = revoke(
        &base,
        &[("token", "never-issued"), ("client_id", &second.client_id)],
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an unknown token is no error (RFC 7009 §2.2)"
    );
}

/// Makes the store refuse to write a new refresh token while the returned guard lives: a
/// real SQLite trigger on the server's own database file, as a full disk or a lost
/// connection would fail that write.
async fn refresh_tokens_cannot_be_stored(store: &str) -> sqlx::SqlitePool {
    let pool = sqlx::SqlitePool::connect(&format!("{store}?mode=rw"))
        .await
        .unwrap();
    sqlx::query(
        "CREATE TRIGGER no_refresh BEFORE INSERT ON wharf_records \
         WHEN NEW.namespace = 'authz-refresh' BEGIN SELECT RAISE(ABORT, 'disk full'); END",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool
}

async fn refresh_tokens_can_be_stored_again(pool: sqlx::SqlitePool) {
    sqlx::query("DROP TRIGGER no_refresh")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}

/// A token request that failed inside the store spends nothing: the client's retry with the
/// same code, or the same refresh token, gets tokens, instead of being taken for a second
/// use that revokes the family. Nor does one whose answer was lost: the same refresh again
/// gets the same tokens, until the client used the refresh token it was given.
#[tokio::test]
async fn a_token_request_the_store_failed_can_be_retried() {
    let store = sqlite_url(&unique("authz-retry"));
    let server = server(&store, &[]);
    let base = server.origin();
    let grant = grant(&base, "http://127.0.0.1:33422/callback").await;

    let failing = refresh_tokens_cannot_be_stored(&store).await;
    let (status, err) = grant.redeem(&base).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, Some("server_error")),
        "{err}"
    );
    refresh_tokens_can_be_stored_again(failing).await;
    let (status, first) = grant.redeem(&base).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the retry redeems the code: {first}"
    );

    let r1 = first["refresh_token"].as_str().unwrap().to_owned();
    let failing = refresh_tokens_cannot_be_stored(&store).await;
    let (status, err) = refresh(&base, &grant.client_id, &r1).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, Some("server_error")),
        "{err}"
    );
    refresh_tokens_can_be_stored_again(failing).await;
    let (status, second) = refresh(&base, &grant.client_id, &r1).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the retry rotates the token: {second}"
    );
    let access = second["access_token"].as_str().unwrap();
    assert_eq!(tools_list(&server, access).await, None, "the family lives");
    let r2 = second["refresh_token"].as_str().unwrap().to_owned();
    assert_ne!(r1, r2);
    // The answer was lost on its way (the client saw a timeout): the same request again
    // gets the same tokens, and the family lives.
    let (status, again) = refresh(&base, &grant.client_id, &r1).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["refresh_token"].as_str(), Some(r2.as_str()));
    assert_eq!(again["access_token"].as_str(), Some(access));
    assert_eq!(tools_list(&server, access).await, None, "the family lives");
    let (status, third) = refresh(&base, &grant.client_id, &r2).await;
    assert_eq!(status, StatusCode::OK, "{third}");
    // Once r2 was used, its answer reached the client: r1 once more is someone's copy.
    let (status, err) = refresh(&base, &grant.client_id, &r1).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    says(&err, "already used");
    until_refused(&server, third["access_token"].as_str().unwrap()).await;
}

/// When the store forgets the client registered as `client_id`, in days from now.
async fn client_expires_in_days(pool: &sqlx::SqlitePool, client_id: &str) -> f64 {
    let (expires_at,): (i64,) = sqlx::query_as(
        "SELECT expires_at FROM wharf_records WHERE namespace = 'authz-client' AND key = ?",
    )
    .bind(client_id)
    .fetch_one(pool)
    .await
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    (expires_at as f64 - now) / 86_400_000.0
}

/// Registrations do not pile up: one that never got a token is forgotten after 30 days, one
/// given tokens is kept as long as its refresh tokens can live and a month more (then 90
/// days from now), and a forgotten client is refused everywhere, its refresh tokens
/// included.
#[tokio::test]
async fn registered_clients_are_kept_while_used_and_then_forgotten() {
    let store = sqlite_url(&unique("authz-client-expiry"));
    let server = server(&store, &[]);
    let base = server.origin();
    let pool = sqlx::SqlitePool::connect(&format!("{store}?mode=rw"))
        .await
        .unwrap();
    let grant = grant(&base, "http://127.0.0.1:33426/callback").await;
    let days = client_expires_in_days(&pool, &grant.client_id).await;
    assert!((29.9..=30.0).contains(&days), "unused: {days} days");
    let (status, tokens) = grant.redeem(&base).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    let days = client_expires_in_days(&pool, &grant.client_id).await;
    assert!((89.9..=90.0).contains(&days), "given tokens: {days} days");

    // The time passes.
    sqlx::query(
        "UPDATE wharf_records SET expires_at = 1 WHERE namespace = 'authz-client' AND key = ?",
    )
    .bind(&grant.client_id)
    .execute(&pool)
    .await
    .unwrap();
    let r1 = tokens["refresh_token"].as_str().unwrap();
    let (status, err) = refresh(&base, &grant.client_id, r1).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("invalid_client")),
        "{err}"
    );
    let (_, challenge) = pkce();
    let params = code_request(
        &grant.client_id,
        "http://127.0.0.1:33426/callback",
        &challenge,
        &[],
    );
    let url = Url::parse_with_params(&format!("{base}/authorize"), &params).unwrap();
    let page = Browser::new().get(url.as_str()).await;
    assert_eq!(page.status(), StatusCode::BAD_REQUEST);
    assert!(page.text().await.unwrap().contains("not registered"));
    pool.close().await;
}

/// With a key encryption key, the token-signing keys are stored sealed, so the store alone
/// signs nothing; a replica given another key does not start, and says why; the key can be
/// changed, the old one retired; and a key that is not 32 bytes of base64 stops the server
/// from starting.
#[tokio::test]
async fn signing_keys_are_sealed_with_the_key_encryption_key() {
    let store = sqlite_url(&unique("authz-sealed"));
    add_user(&store, "alice");
    let args = own_authorization_server(&store);
    let with_key = |key: &'static str| {
        ServerProcess::start_with_env(
            common::free_port(),
            &args,
            &[("WHARF_AUTHZ_KEY_ENCRYPTION_KEY", key)],
        )
    };
    let redirect = "http://127.0.0.1:33427/callback";
    let old = "q1Kd5Z5y4mUoGqP2v0F7m3S1o8J6c9T2w4E5r7Y8u0I=";
    let sealed = with_key(old);
    let base = sealed.origin();
    let (status, tokens) = grant(&base, redirect).await.redeem(&base).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(
        tools_list(&sealed, access).await,
        None,
        "signed and verified"
    );
    let pool = sqlx::SqlitePool::connect(&format!("{store}?mode=ro"))
        .await
        .unwrap();
    let stored: Vec<(String,)> =
        sqlx::query_as("SELECT value FROM wharf_records WHERE namespace = 'authz-signing-key'")
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    assert!(!stored.is_empty());
    for (value,) in &stored {
        assert!(
            value.contains("\"sealed\"") && !value.contains("pkcs8"),
            "{value}"
        );
    }
    drop(sealed);

    // A replica given another key does not start, and says which keys it lacks.
    let new = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
    let stderr = common::refused_start(
        "127.0.0.1:0",
        &args,
        &[("WHARF_AUTHZ_KEY_ENCRYPTION_KEY", new)],
    );
    assert!(
        stderr.contains("signing keys") && stderr.contains("and this server has"),
        "{stderr}"
    );

    // The key changes in the README's three steps: the new one retired (it only opens),
    // then sealing with the old one retired (the stored keys are sealed again at startup),
    // then the new one alone.
    for env in [
        &[
            ("WHARF_AUTHZ_KEY_ENCRYPTION_KEY", old),
            ("WHARF_AUTHZ_RETIRED_KEY_ENCRYPTION_KEYS", new),
        ][..],
        &[
            ("WHARF_AUTHZ_KEY_ENCRYPTION_KEY", new),
            ("WHARF_AUTHZ_RETIRED_KEY_ENCRYPTION_KEYS", old),
        ][..],
        &[("WHARF_AUTHZ_KEY_ENCRYPTION_KEY", new)][..],
    ] {
        let rotated = ServerProcess::start_with_env(common::free_port(), &args, env);
        let base = rotated.origin();
        let (status, tokens) = grant(&base, redirect).await.redeem(&base).await;
        assert_eq!(status, StatusCode::OK, "{env:?}: {tokens}");
    }

    let env = [("WHARF_AUTHZ_KEY_ENCRYPTION_KEY", "c2hvcnQ=")];
    let stderr = common::refused_start("127.0.0.1:0", &args, &env);
    assert!(
        stderr.contains("--authz-key-encryption-key") && stderr.contains("32 bytes"),
        "{stderr}"
    );
}

/// An address of this machine other than loopback: the one it sends from.
fn non_loopback_address() -> std::net::IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    // Connecting a UDP socket sends nothing: it picks the route, and so the source address.
    socket
        .connect("192.0.2.1:9")
        .expect("this test needs a non-loopback IPv4 address with a route");
    let ip = socket.local_addr().unwrap().ip();
    assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
    ip
}

/// Listening on one address that is not loopback, under a public URL that does not lead
/// back to it, the server verifies its own tokens: it reads its signing keys in-process,
/// where it used to fetch them over plain HTTP from its listen address (which it refuses
/// off loopback, so it did not start).
#[tokio::test]
async fn tokens_verify_whatever_address_the_server_listens_on() {
    let store = sqlite_url(&unique("authz-listen"));
    add_user(&store, "alice");
    let ip = non_loopback_address();
    // Without a public URL its issuer would be plain http off loopback: refused, and the
    // error names the option that fixes it.
    let listen = std::net::SocketAddr::new(ip, common::free_port()).to_string();
    let stderr = common::refused_start(&listen, &own_authorization_server(&store), &[]);
    assert!(
        stderr.contains("--public-url") && stderr.contains("https"),
        "{stderr}"
    );
    let public = format!("http://localhost:{}", common::free_port());
    let server = ServerProcess::start_at(
        ip,
        common::free_port(),
        &[
            &own_authorization_server(&store)[..],
            &["--public-url", &public, "--allowed-host", &ip.to_string()],
        ]
        .concat(),
        &[],
    );
    let base = server.origin();
    let grant = grant(&base, "http://127.0.0.1:33423/callback").await;
    let (status, tokens) = grant.redeem(&base).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    assert_eq!(
        tools_list(&server, tokens["access_token"].as_str().unwrap()).await,
        None,
        "the access token is accepted"
    );
}

#[tokio::test]
async fn redirects_nobody_registered_are_never_followed_and_resources_are_bound() {
    let store = sqlite_url(&unique("authz-redirect"));
    let other = "https://other.example/mcp";
    let server = server(&store, &["--authz-resource", other]);
    let base = server.origin();
    let redirect = "http://127.0.0.1:33421/callback";
    let client_id = register(&base, redirect).await;
    let (verifier, challenge) = pkce();
    let browser = Browser::new();
    for bad in [
        "https://evil.example/callback",
        "http://127.0.0.1:33421/other",
    ] {
        let url = Url::parse_with_params(
            &format!("{base}/authorize"),
            &code_request(client_id.as_str(), bad, &challenge, &[]),
        )
        .unwrap();
        let response = browser.get(url.as_str()).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(response.headers().get(LOCATION).is_none());
        assert!(
            response
                .text()
                .await
                .unwrap()
                .contains("not one of the client")
        );
    }
    let unknown = browser
        .get(&format!(
            "{base}/authorize?client_id=nobody&response_type=code"
        ))
        .await;
    assert_eq!(unknown.status(), StatusCode::BAD_REQUEST);
    assert!(unknown.text().await.unwrap().contains("not registered"));
    // An id longer than the store takes as a key is an unknown client, not a server error.
    let long = "x".repeat(3000);
    let (status, err) = refresh(&base, &long, "r").await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("invalid_client")),
        "{err}"
    );
    let (status, body) = revoke(&base, &[("token", "t"), ("client_id", &long)]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body.contains("invalid_client"), "{body}");

    // A resource this server does not serve: refused at the authorization endpoint.
    let url = Url::parse_with_params(
        &format!("{base}/authorize"),
        &code_request(
            client_id.as_str(),
            redirect,
            &challenge,
            &[("resource", "https://unknown.example/")],
        ),
    )
    .unwrap();
    let answer = refused(browser.get(url.as_str()).await).await;
    assert_eq!(answer["error"], "invalid_target");

    // A token for the other resource it serves (its scheme and host spelled in capitals, a
    // default port written out: the same resource): this resource server refuses it.
    let answer = authorize(
        &browser,
        &base,
        &code_request(
            &client_id,
            redirect,
            &challenge,
            &[("resource", "HTTPS://OTHER.EXAMPLE/mcp")],
        ),
    )
    .await;
    let (status, tokens) = redeem(
        &base,
        &answer["code"],
        &client_id,
        &verifier,
        &[("resource", "https://Other.Example:443/mcp")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    let claims = claims(tokens["access_token"].as_str().unwrap());
    assert_eq!(claims["aud"], other, "the configured spelling: {claims}");
    assert_eq!(
        tools_list(&server, tokens["access_token"].as_str().unwrap()).await,
        Some(401)
    );
}

/// A client is registered with the scopes it asked for that the server offers, and the
/// response says so; asking for none later gets what it registered, not every scope
/// offered; asking for more later (MCP's step-up, with the same registration) is its right,
/// shown on the consent page.
#[tokio::test]
async fn a_client_that_asks_for_no_scope_gets_what_it_registered() {
    let server = server(&sqlite_url(&unique("authz-scope")), &[]);
    let base = server.origin();
    let redirect = "http://127.0.0.1:33425/callback";
    let scope = json!({"scope": "datasets:read unheard:of"});
    let registered = registration(&base, redirect, scope).await;
    assert_eq!(
        registered["scope"], "datasets:read",
        "unheard:of is not offered"
    );
    let client_id = registered["client_id"].as_str().unwrap();

    let (verifier, challenge) = pkce();
    let browser = Browser::new();
    let answer = authorize(
        &browser,
        &base,
        &code_request(client_id, redirect, &challenge, &[]),
    )
    .await;
    let (status, tokens) = redeem(&base, &answer["code"], client_id, &verifier, &[]).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    assert_eq!(tokens["scope"], "datasets:read");
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(claims(access)["scope"], "datasets:read");
    let write = server
        .client()
        .with_bearer(access)
        .call_tool("import_begin", json!({"name": "scoped"}))
        .await
        .unwrap();
    assert_eq!(write.status, 403, "datasets:write was not granted");

    // The step-up: the same client asks for the scope the 403 named, and gets it.
    let (verifier, challenge) = pkce();
    let wider = [("scope", "datasets:read datasets:write")];
    let answer = authorize(
        &browser,
        &base,
        &code_request(client_id, redirect, &challenge, &wider),
    )
    .await;
    let (status, tokens) = redeem(&base, &answer["code"], client_id, &verifier, &[]).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    assert_eq!(tokens["scope"], "datasets:read datasets:write");

    // Asking for less again, approved, leaves the wider tokens working: the account page
    // still says what the application may hold.
    let (_, challenge) = pkce();
    let narrower = [("scope", "datasets:read")];
    authorize(
        &browser,
        &base,
        &code_request(client_id, redirect, &challenge, &narrower),
    )
    .await;
    let account = browser.get(&format!("{base}/account")).await;
    let page = account.text().await.unwrap();
    assert!(
        page.contains("datasets:read datasets:write"),
        "what the application holds: {page}"
    );
}

/// A scope every request needs is one the built-in authorization server offers and grants:
/// a client that asks for what the resource server's challenge names gets it, and is let in.
#[tokio::test]
async fn a_required_scope_is_one_the_authorization_server_grants() {
    let server = server(
        &sqlite_url(&unique("authz-required")),
        &["--oauth-required-scope", "mcp:access"],
    );
    let base = server.origin();
    let metadata = as_metadata(&base).await;
    let offered = metadata["scopes_supported"].as_array().unwrap();
    assert!(offered.contains(&json!("mcp:access")), "{metadata}");
    let redirect = "http://127.0.0.1:33425/callback";
    let client_id = register(&base, redirect).await;
    let (verifier, challenge) = pkce();
    let asked = [("scope", "mcp:access datasets:read")];
    let answer = authorize(
        &Browser::new(),
        &base,
        &code_request(&client_id, redirect, &challenge, &asked),
    )
    .await;
    let (status, tokens) = redeem(&base, &answer["code"], &client_id, &verifier, &[]).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    assert_eq!(tokens["scope"], "mcp:access datasets:read");
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(tools_list(&server, access).await, None);
}

/// A client gets the grants it registered: one that names only `authorization_code` is
/// given no refresh token and may not refresh; one that could never get a first token is
/// not registered.
#[tokio::test]
async fn a_client_gets_the_grant_types_it_registered() {
    let server = server(&sqlite_url(&unique("authz-grants")), &[]);
    let base = server.origin();
    let redirect = "http://127.0.0.1:33426/callback";
    let only_refresh = reqwest::Client::new()
        .post(format!("{base}/register"))
        .json(
            &json!({"redirect_uris": [redirect], "application_type": "native",
            "token_endpoint_auth_method": "none", "grant_types": ["refresh_token"]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(only_refresh.status(), StatusCode::BAD_REQUEST);
    let body: Value = only_refresh.json().await.unwrap();
    assert_eq!(body["error"], "invalid_client_metadata");
    says(&body, "must include authorization_code");

    let grants = json!({"grant_types": ["authorization_code", "authorization_code"]});
    let registered = registration(&base, redirect, grants).await;
    assert_eq!(registered["grant_types"], json!(["authorization_code"]));
    let client_id = registered["client_id"].as_str().unwrap();
    let (verifier, challenge) = pkce();
    let answer = authorize(
        &Browser::new(),
        &base,
        &code_request(client_id, redirect, &challenge, &[]),
    )
    .await;
    let (status, tokens) = redeem(&base, &answer["code"], client_id, &verifier, &[]).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    assert!(tokens.get("refresh_token").is_none(), "{tokens}");
    assert_eq!(
        tools_list(&server, tokens["access_token"].as_str().unwrap()).await,
        None
    );
    let (status, err) = refresh(&base, client_id, "any").await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("unauthorized_client"))
    );
}

#[tokio::test]
async fn a_flow_continues_on_another_replica() {
    let store = common::import::pg_url();
    let user = unique("alice");
    add_user(&store, &user);
    let port_a = common::free_port();
    let public = format!("http://127.0.0.1:{port_a}");
    let args = [
        &own_authorization_server(&store)[..],
        &["--public-url", &public],
    ]
    .concat();
    let a = ServerProcess::start_on(port_a, &args);
    let b = ServerProcess::start_exact(&args);
    let (base_a, base_b) = (a.origin(), b.origin());
    let redirect = "http://127.0.0.1:33422/callback";
    let client_id = register(&base_b, redirect).await;
    let (verifier, challenge) = pkce();
    let browser = Browser::new();
    // The request on A; sign-in and consent on B (the form posts go to B).
    let url = Url::parse_with_params(
        &format!("{base_a}/authorize"),
        &code_request(
            client_id.as_str(),
            redirect,
            &challenge,
            &[("state", "hop")],
        ),
    )
    .unwrap();
    let html = browser.get(url.as_str()).await.text().await.unwrap();
    let (request, csrf) = (hidden(&html, "request"), hidden(&html, "csrf"));
    let signed_in = browser
        .post(
            &format!("{base_b}/authorize/login"),
            &[
                ("request", &request),
                ("csrf", &csrf),
                ("username", &user),
                ("password", PASSWORD),
            ],
        )
        .await;
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    let approved = browser
        .post(
            &format!("{base_b}/authorize/consent"),
            &[
                ("request", &request),
                ("csrf", &csrf),
                ("decision", "approve"),
            ],
        )
        .await;
    let answer = query(approved.headers()[LOCATION].to_str().unwrap());
    assert_eq!(
        (answer["state"].as_str(), answer["iss"].as_str()),
        ("hop", public.as_str())
    );
    // The exchange on A, the call on B.
    let (status, tokens) = redeem(
        &base_a,
        &answer["code"],
        &client_id,
        &verifier,
        &[("redirect_uri", redirect)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    assert_eq!(
        tools_list(&b, tokens["access_token"].as_str().unwrap()).await,
        None
    );
}

/// Behind a proxy named with `--trusted-proxy`, each client the proxy names in
/// `X-Forwarded-For` has a budget of its own; a server that does not trust the proxy counts
/// every request as the proxy's, whatever the header says.
#[tokio::test]
async fn behind_a_trusted_proxy_each_client_has_its_own_budget() {
    let store = sqlite_url(&unique("authz-proxy"));
    let body = native_client();
    let http = reqwest::Client::new();
    // This test is the proxy: it connects from 127.0.0.1 and names the client.
    let register_as = async |base: &str, client: &str| {
        http.post(format!("{base}/register"))
            .header("x-forwarded-for", client)
            .json(&body)
            .send()
            .await
            .unwrap()
            .status()
    };
    let trusting = server(&store, &["--trusted-proxy", "127.0.0.1/32"]);
    let base = trusting.origin();
    for _ in 0..20 {
        assert_eq!(register_as(&base, "203.0.113.5").await, StatusCode::CREATED);
    }
    assert_eq!(
        register_as(&base, "203.0.113.5").await,
        StatusCode::TOO_MANY_REQUESTS,
        "that client's 21st within a minute"
    );
    assert_eq!(
        register_as(&base, "203.0.113.6").await,
        StatusCode::CREATED,
        "another client behind the same proxy"
    );

    let distrusting = server(&sqlite_url(&unique("authz-no-proxy")), &[]);
    let base = distrusting.origin();
    for i in 0..20 {
        let client = format!("203.0.113.{i}");
        assert_eq!(register_as(&base, &client).await, StatusCode::CREATED);
    }
    assert_eq!(
        register_as(&base, "198.51.100.1").await,
        StatusCode::TOO_MANY_REQUESTS,
        "an untrusted peer's header names nobody"
    );
}

/// A token request that is not one form of known parameters, each once, is answered with an
/// OAuth error in JSON (RFC 6749 §5.2), not the framework's plain text.
#[tokio::test]
async fn malformed_token_requests_get_oauth_errors() {
    let server = server(&sqlite_url(&unique("authz-token-body")), &[]);
    let base = server.origin();
    let http = reqwest::Client::new();
    for (content_type, body) in [
        (
            "application/x-www-form-urlencoded",
            "grant_type=authorization_code&code=a&code=b",
        ),
        ("application/json", r#"{"grant_type":"authorization_code"}"#),
        ("text/plain", "grant_type=authorization_code"),
    ] {
        let response = http
            .post(format!("{base}/token"))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{content_type}");
        let err: Value = response.json().await.unwrap();
        assert_eq!(err["error"], "invalid_request", "{content_type}: {err}");
        assert!(
            err["error_description"]
                .as_str()
                .unwrap()
                .contains("each parameter once"),
            "{err}"
        );
    }
    // A parameter sent empty counts as omitted, as at /authorize: sent again with a value,
    // it is not a repeat, and the request goes on to the client's authentication.
    let response = http
        .post(format!("{base}/token"))
        .header(
            "content-type",
            "application/x-www-form-urlencoded; charset=UTF-8",
        )
        .body("grant_type=&grant_type=authorization_code&code=a")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let err: Value = response.json().await.unwrap();
    assert_eq!(err["error"], "invalid_client", "{err}");
    // Several resources are RFC 8707's to ask for, and its error to refuse.
    let response = http
        .post(format!("{base}/token"))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", "a"),
            ("resource", "https://a.example/mcp"),
            ("resource", "https://b.example/mcp"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let err: Value = response.json().await.unwrap();
    assert_eq!(err["error"], "invalid_target", "{err}");
}

#[tokio::test]
async fn registration_is_rate_limited_per_address_and_can_be_closed() {
    let store = sqlite_url(&unique("authz-limits"));
    let server = server(&store, &[]);
    let base = server.origin();
    let body = native_client();
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..21 {
        let response = http
            .post(format!("{base}/register"))
            .json(&body)
            .send()
            .await
            .unwrap();
        statuses.push(response.status());
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            let err: Value = response.json().await.unwrap();
            assert!(
                err["error_description"]
                    .as_str()
                    .unwrap()
                    .contains("too many"),
                "{err}"
            );
        }
    }
    assert!(
        statuses[..20].iter().all(|s| *s == StatusCode::CREATED),
        "{statuses:?}"
    );
    assert_eq!(
        statuses[20],
        StatusCode::TOO_MANY_REQUESTS,
        "the 21st within a minute"
    );

    // The same store, served by one process at a time.
    drop(server);
    let closed = ServerProcess::start_exact(
        &[
            &own_authorization_server(&store)[..],
            &["--authz-closed-registration"],
        ]
        .concat(),
    );
    let base = closed.origin();
    let metadata = as_metadata(&base).await;
    assert!(
        metadata.get("registration_endpoint").is_none(),
        "{metadata}"
    );
    let refused = http
        .post(format!("{base}/register"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
}
