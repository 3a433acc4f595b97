//! `wharf check URL`: the operator's probe of an MCP endpoint. Each check sends what a
//! conforming 2026-07-28 server must answer in a given way and compares; the verdicts, a
//! summary and the exit code (1 when any check failed) suit a CI job or a monitor.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use wharf_client::{HttpClient, Reply};
use wharf_protocol::{codes, headers as mcp, meta, version};

mod report;

use report::{Outcome, Verdict, fail, info, pass, report, skip};

use super::Endpoint;
use super::oauth::{authorization_server_metadata, challenge_param, protects, resource_metadata};

/// `wharf check`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    endpoint: Endpoint,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// How long to wait for each answer, in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_secs: u64,
}

/// The probe: one client, and what discovery found for the later checks.
struct Probe {
    client: HttpClient,
    http: reqwest::Client,
    url: String,
    /// The server asks for a token this probe does not have.
    unauthorized: bool,
    /// Something answered HTTP at the URL (a legacy-only server fails discovery but still
    /// gets the other checks, which say what it does serve).
    answered: bool,
}

/// The version this probe speaks.
const VERSION: &str = version::LATEST;

pub(crate) fn run(args: CheckArgs) -> ExitCode {
    super::block_on(async move {
        let timeout = Duration::from_secs(args.timeout_secs);
        let http = match reqwest::Client::builder().timeout(timeout).build() {
            Ok(h) => h,
            Err(e) => {
                eprintln!("error: could not build an HTTP client: {e}");
                return ExitCode::from(2);
            }
        };
        let client = match args.endpoint.client().await {
            Ok(c) => c.with_http(http.clone()),
            Err(e) => return super::failed(e),
        };
        let probe = Probe {
            client,
            http,
            url: args.endpoint.url.clone(),
            unauthorized: false,
            answered: false,
        };
        let outcomes = probe.run().await;
        report(&args.endpoint.url, &outcomes, args.json)
    })
}

impl Probe {
    async fn run(mut self) -> Vec<Outcome> {
        let mut out = Vec::new();
        let discover = self.discover().await;
        out.push(discover);
        if !self.answered {
            // Nothing answers there: the other checks would only say so ten times more.
            return out;
        }
        out.push(self.latency().await);
        out.push(self.get_is_405().await);
        out.push(self.header_mismatch().await);
        out.push(self.header_missing().await);
        out.push(self.unknown_version().await);
        out.push(self.missing_meta().await);
        out.push(self.missing_capabilities().await);
        out.push(self.name_mismatch().await);
        out.push(self.unknown_method().await);
        out.push(self.legacy().await);
        out.push(self.auth().await);
        out.push(self.sse_buffering().await);
        out
    }

    /// A well-formed request of `method`: `_meta` and the headers that mirror it.
    fn request(&self, method: &str, params: Value) -> (Vec<u8>, HeaderMap) {
        let params = self.client.meta.apply(params);
        let headers = self.client.headers_for(method, &params);
        (envelope(method, params), headers)
    }

    async fn send(&self, body: Vec<u8>, headers: HeaderMap) -> Result<Reply, String> {
        self.client
            .send_raw(body, headers)
            .await
            .map_err(|e| format!("no answer: {e}"))
    }

    /// `server/discover`: versions, capabilities, server info and cache hints.
    async fn discover(&mut self) -> Outcome {
        let (body, headers) = self.request("server/discover", json!({}));
        let name = "discover";
        let reply = match self.send(body, headers).await {
            Ok(r) => r,
            Err(e) => return fail(name, e),
        };
        self.answered = true;
        if reply.status == 401 && self.client.has_bearer() {
            // The checks after this would all be skipped: a monitor must not stay green
            // with a token nobody accepts.
            self.unauthorized = true;
            return fail(
                name,
                "HTTP 401 although a token was sent: it is refused (expired, revoked, or for another server); run `wharf login` again, or check --token",
            );
        }
        if reply.status == 400 && reply.headers.contains_key(header::WWW_AUTHENTICATE) {
            // No legacy server challenges an unknown method: the token is what is wrong.
            self.unauthorized = true;
            return fail(
                name,
                "HTTP 400 with a challenge: the server refused the Authorization header as malformed; check --token",
            );
        }
        if reply.status == 401 {
            self.unauthorized = true;
            return skip(
                name,
                "HTTP 401: the server wants a token (see the auth check); pass --token or run `wharf login`",
            );
        }
        let Some(result) = reply.result() else {
            return fail(
                name,
                format!(
                    "HTTP {}: server/discover was not answered with a result ({}); the server does not speak {VERSION}",
                    reply.status,
                    error_summary(&reply)
                ),
            );
        };
        let versions: Vec<&str> = result["supportedVersions"]
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut problems = Vec::new();
        if reply.status != 200 {
            problems.push(format!("HTTP {} instead of 200", reply.status));
        }
        if !versions.contains(&VERSION) {
            problems.push(format!("supportedVersions {versions:?} lacks {VERSION}"));
        }
        if !result["capabilities"].is_object() {
            problems.push("no capabilities object".to_owned());
        }
        if result["resultType"] != "complete" {
            problems.push(format!(
                "resultType is {} instead of \"complete\"",
                result["resultType"]
            ));
        }
        let info = &result["_meta"][meta::SERVER_INFO];
        let capabilities: Vec<&str> = result["capabilities"]
            .as_object()
            .map(|c| c.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let cache = match result["ttlMs"].as_u64() {
            Some(ms) => format!(
                "cache {ms} ms ({})",
                result["cacheScope"].as_str().unwrap_or("public")
            ),
            None => "no cache hints".to_owned(),
        };
        let server = match info["name"].as_str() {
            Some(n) => format!("{n} {}", info["version"].as_str().unwrap_or("")),
            None => {
                problems.push("no serverInfo in the result's _meta".to_owned());
                "unnamed server".to_owned()
            }
        };
        let detail = format!(
            "{}; versions {}; capabilities {}; {cache}",
            server.trim_end(),
            versions.join(", "),
            if capabilities.is_empty() {
                "none".to_owned()
            } else {
                capabilities.join(", ")
            }
        );
        if problems.is_empty() {
            pass(name, detail)
        } else {
            fail(name, format!("{}; {detail}", problems.join("; ")))
        }
    }

    /// Round trips of `server/discover`: the smallest, median and largest of five.
    async fn latency(&self) -> Outcome {
        let mut times = Vec::new();
        for _ in 0..5 {
            let (body, headers) = self.request("server/discover", json!({}));
            let started = Instant::now();
            if let Err(e) = self.send(body, headers).await {
                return fail("latency", e);
            }
            times.push(started.elapsed());
        }
        times.sort();
        Outcome {
            name: "latency",
            verdict: Verdict::Info,
            detail: format!(
                "server/discover round trip: min {}, median {}, max {}",
                ms(times[0]),
                ms(times[2]),
                ms(times[4])
            ),
        }
    }

    /// GET on the endpoint: 405 (a stateless server offers no standalone stream).
    async fn get_is_405(&self) -> Outcome {
        let name = "get-405";
        // The version header tells a dual-era server this is not a legacy session's GET.
        let mut req = self
            .http
            .get(&self.url)
            .header(header::ACCEPT, "text/event-stream")
            .header(mcp::PROTOCOL_VERSION, VERSION);
        if let Some(auth) = self.client.authorization() {
            req = req.header(header::AUTHORIZATION, auth);
        }
        match req.send().await {
            Ok(res) if res.status().as_u16() == 405 => {
                pass(name, "GET answered 405 Method Not Allowed")
            }
            Ok(res) if self.unauthorized && res.status().as_u16() == 401 => {
                skip(name, "GET answered 401: needs a token")
            }
            Ok(res) => fail(
                name,
                format!(
                    "GET answered {} ({}); a {VERSION} endpoint answers GET with 405 Method Not Allowed",
                    res.status(),
                    content_type(res.headers())
                ),
            ),
            Err(e) => fail(name, format!("no answer to GET: {e}")),
        }
    }

    /// `Mcp-Method` naming another method than the body's: 400 with -32020.
    async fn header_mismatch(&self) -> Outcome {
        let (body, mut headers) = self.request("tools/list", json!({}));
        headers.insert(
            HeaderName::from_static(mcp::METHOD),
            HeaderValue::from_static("prompts/list"),
        );
        self.expect_error(
            "header-mismatch",
            "a tools/list body sent with Mcp-Method: prompts/list",
            (body, headers),
            400,
            codes::HEADER_MISMATCH,
        )
        .await
    }

    /// No `Mcp-Method` header at all: 400 with -32020.
    async fn header_missing(&self) -> Outcome {
        let (body, mut headers) = self.request("tools/list", json!({}));
        headers.remove(mcp::METHOD);
        self.expect_error(
            "header-missing",
            "a tools/list without the Mcp-Method header",
            (body, headers),
            400,
            codes::HEADER_MISMATCH,
        )
        .await
    }

    /// A version nobody speaks: 400 with -32022 and `data.supported`.
    async fn unknown_version(&self) -> Outcome {
        let name = "unknown-version";
        let params = json!({ "_meta": { meta::PROTOCOL_VERSION: "1999-01-01" } });
        let request = self.request("tools/list", params);
        let what = "a request for version 1999-01-01";
        let (reply, detail) = match self
            .refusal(
                name,
                what,
                request,
                400,
                codes::UNSUPPORTED_PROTOCOL_VERSION,
            )
            .await
        {
            Ok(refused) => refused,
            Err(outcome) => return outcome,
        };
        match reply
            .error()
            .and_then(|e| e["data"]["supported"].as_array())
        {
            Some(supported) => {
                let listed: Vec<&str> = supported.iter().filter_map(Value::as_str).collect();
                pass(
                    name,
                    format!("{detail}; data.supported lists {}", listed.join(", ")),
                )
            }
            None => fail(
                name,
                "the -32022 error has no data.supported list of the versions the server speaks",
            ),
        }
    }

    /// A request without `_meta`: 400 with -32602.
    async fn missing_meta(&self) -> Outcome {
        let mut headers = self.client.headers_for("tools/list", &json!({}));
        headers.insert(
            HeaderName::from_static(mcp::PROTOCOL_VERSION),
            HeaderValue::from_static(VERSION),
        );
        self.expect_error(
            "missing-meta",
            "a tools/list without params._meta",
            (envelope("tools/list", json!({})), headers),
            400,
            codes::INVALID_PARAMS,
        )
        .await
    }

    /// `_meta` without the required `clientCapabilities`: 400 with -32602.
    async fn missing_capabilities(&self) -> Outcome {
        let (body, headers) = self.request("tools/list", json!({}));
        let mut message: Value = serde_json::from_slice(&body).unwrap_or_default();
        if let Some(m) = message["params"]["_meta"].as_object_mut() {
            m.remove(meta::CLIENT_CAPABILITIES);
        }
        self.expect_error(
            "meta-capabilities",
            "a tools/list whose _meta lacks clientCapabilities",
            (message.to_string().into_bytes(), headers),
            400,
            codes::INVALID_PARAMS,
        )
        .await
    }

    /// `Mcp-Name` naming another tool than the body's: 400 with -32020.
    async fn name_mismatch(&self) -> Outcome {
        let params = json!({ "name": "wharf-check-probe", "arguments": {} });
        let (body, mut headers) = self.request("tools/call", params);
        headers.insert(
            HeaderName::from_static(mcp::NAME),
            HeaderValue::from_static("another-tool"),
        );
        self.expect_error(
            "name-mismatch",
            "a tools/call of wharf-check-probe sent with Mcp-Name: another-tool",
            (body, headers),
            400,
            codes::HEADER_MISMATCH,
        )
        .await
    }

    /// A method nobody defines: 404 with -32601.
    async fn unknown_method(&self) -> Outcome {
        let (body, headers) = self.request("wharf/no-such-method", json!({}));
        self.expect_error(
            "unknown-method",
            "a request of method wharf/no-such-method",
            (body, headers),
            404,
            codes::METHOD_NOT_FOUND,
        )
        .await
    }

    /// Whether the initialization-based era is served too (either answer is allowed).
    async fn legacy(&self) -> Outcome {
        let name = "legacy-era";
        let newest = version::LEGACY[0];
        let body = envelope(
            "initialize",
            json!({
                "protocolVersion": newest,
                "capabilities": {},
                "clientInfo": self.client.meta.client_info,
            }),
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if let Some(auth) = self.client.authorization() {
            headers.insert(header::AUTHORIZATION, auth);
        }
        let reply = match self.send(body, headers.clone()).await {
            Ok(r) => r,
            Err(e) => return fail(name, e),
        };
        if let Some(result) = reply.result() {
            let session = reply
                .headers
                .get(mcp::SESSION_ID)
                .and_then(|v| v.to_str().ok());
            if let Some(id) = session.and_then(|s| HeaderValue::from_str(s).ok()) {
                // Close the session this probe opened.
                headers.insert(HeaderName::from_static(mcp::SESSION_ID), id);
                let _ = self.http.delete(&self.url).headers(headers).send().await;
            }
            return info(
                name,
                format!(
                    "legacy clients served too: initialize negotiated {}{}",
                    result["protocolVersion"].as_str().unwrap_or("?"),
                    if session.is_some() {
                        ", with a session"
                    } else {
                        ""
                    }
                ),
            );
        }
        if reply.status == 401 && self.unauthorized {
            return skip(name, "initialize answered 401: needs a token");
        }
        info(
            name,
            format!(
                "{VERSION} only: initialize answered HTTP {} ({})",
                reply.status,
                error_summary(&reply)
            ),
        )
    }

    /// The challenge of a protected server and the metadata it points at (RFC 9728, RFC 8414).
    async fn auth(&self) -> Outcome {
        let name = "auth";
        let (body, mut headers) = self.request("server/discover", json!({}));
        headers.remove(header::AUTHORIZATION);
        let reply = match self.send(body, headers).await {
            Ok(r) => r,
            Err(e) => return fail(name, e),
        };
        if reply.status != 401 {
            return skip(
                name,
                format!(
                    "no token needed (server/discover without one answered HTTP {})",
                    reply.status
                ),
            );
        }
        let challenge = reply
            .headers
            .get(header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !challenge.to_ascii_lowercase().starts_with("bearer") {
            return fail(
                name,
                format!("HTTP 401 without a Bearer challenge (WWW-Authenticate: {challenge:?})"),
            );
        }
        let named = challenge_param(challenge, "resource_metadata");
        let (metadata_url, prm) = match resource_metadata(&self.http, &self.url, named.clone())
            .await
        {
            Ok(found) => found,
            // Nowhere a client looks: fine for API keys; an OAuth client, though, finds no
            // authorization server.
            Err(_) if named.is_none() => {
                return Outcome {
                    name,
                    verdict: Verdict::Warn,
                    detail: "HTTP 401 with a Bearer challenge but no resource_metadata (RFC 9728), and no protected-resource metadata at the well-known addresses: OAuth clients cannot find an authorization server; fine if the server takes only API keys".to_owned(),
                };
            }
            Err(e) => {
                return fail(name, format!("protected-resource metadata: {e}"));
            }
        };
        // RFC 9728 §3.3: metadata for another resource must not be used (`wharf login`
        // refuses it), the usual sign of a proxy in front of a server that does not know
        // its public URL.
        let resource = prm["resource"].as_str().unwrap_or_default();
        if !protects(resource, &self.url) {
            return fail(
                name,
                format!(
                    "protected-resource metadata {metadata_url} describes resource {resource:?}, which is not {}: clients must not use it (RFC 9728 §3.3); behind a proxy, give the server its public URL",
                    self.url
                ),
            );
        }
        let Some(issuer) = prm["authorization_servers"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(Value::as_str)
        else {
            return fail(
                name,
                format!(
                    "protected-resource metadata {metadata_url} names no authorization_servers"
                ),
            );
        };
        let as_meta = match authorization_server_metadata(&self.http, issuer).await {
            Ok(v) => v,
            Err(e) => return fail(name, e),
        };
        // RFC 8414 §3.3: the metadata's issuer must be the one it was fetched for.
        let named = as_meta["issuer"].as_str().unwrap_or_default();
        if named.trim_end_matches('/') != issuer.trim_end_matches('/') {
            return fail(
                name,
                format!(
                    "the authorization server metadata fetched for {issuer} names issuer {named:?}: clients must not use it (RFC 8414 §3.3)"
                ),
            );
        }
        let pkce = as_meta["code_challenge_methods_supported"]
            .as_array()
            .is_some_and(|m| m.iter().any(|v| v == "S256"));
        if !pkce {
            return fail(
                name,
                format!(
                    "the authorization server {issuer} does not list S256 in code_challenge_methods_supported (PKCE is required)"
                ),
            );
        }
        let scopes = challenge_param(challenge, "scope")
            .map(|s| format!(", scope {s}"))
            .unwrap_or_default();
        pass(
            name,
            format!(
                "401 with a Bearer challenge{scopes}; resource {}; authorization server {issuer} (PKCE S256{})",
                prm["resource"].as_str().unwrap_or("?"),
                if as_meta["client_id_metadata_document_supported"] == true {
                    ", client metadata documents"
                } else if as_meta["registration_endpoint"].is_string() {
                    ", dynamic registration"
                } else {
                    ""
                }
            ),
        )
    }

    /// Whether an SSE answer (a `subscriptions/listen` stream) says `X-Accel-Buffering: no`,
    /// so that a proxy such as nginx passes events on as they come.
    async fn sse_buffering(&self) -> Outcome {
        let name = "sse-buffering";
        let (body, headers) = self.request(
            "subscriptions/listen",
            json!({ "notifications": { "toolsListChanged": true } }),
        );
        let res = match self
            .http
            .post(&self.url)
            .headers(headers)
            .body(body)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => return fail(name, format!("no answer to subscriptions/listen: {e}")),
        };
        let status = res.status().as_u16();
        let sse = content_type(res.headers()).starts_with("text/event-stream");
        let buffering = res
            .headers()
            .get("x-accel-buffering")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Dropping the response closes the stream, which ends the subscription.
        drop(res);
        if status == 401 && self.unauthorized {
            return skip(name, "subscriptions/listen answered 401: needs a token");
        }
        if !sse {
            return skip(
                name,
                format!(
                    "subscriptions/listen answered HTTP {status} without a stream; no SSE answer to inspect"
                ),
            );
        }
        match buffering.as_deref() {
            Some(v) if v.eq_ignore_ascii_case("no") => {
                pass(name, "SSE answers carry X-Accel-Buffering: no")
            }
            other => Outcome {
                name,
                verdict: Verdict::Warn,
                detail: format!(
                    "SSE answers carry {}; without X-Accel-Buffering: no, nginx holds events back until its buffer fills",
                    match other {
                        Some(v) => format!("X-Accel-Buffering: {v}"),
                        None => "no X-Accel-Buffering header".to_owned(),
                    }
                ),
            },
        }
    }

    /// Sends a request that must be refused with HTTP `status` and JSON-RPC `code`: the
    /// refusal when it came as it should, else the failing (or skipped) outcome.
    async fn refusal(
        &self,
        name: &'static str,
        what: &str,
        (body, headers): (Vec<u8>, HeaderMap),
        status: u16,
        code: i32,
    ) -> Result<(Reply, String), Outcome> {
        let reply = self.send(body, headers).await.map_err(|e| fail(name, e))?;
        if reply.status == 401 && self.unauthorized {
            return Err(skip(name, "answered 401: needs a token"));
        }
        let got = reply.error_code();
        if reply.status == status && got == Some(i64::from(code)) {
            return Ok((reply, format!("{what}: HTTP {status}, error {code}")));
        }
        Err(fail(
            name,
            format!(
                "{what} was answered HTTP {} with {}; expected HTTP {status} with error {code}",
                reply.status,
                match got {
                    Some(c) => format!("error {c}"),
                    None if reply.result().is_some() => "a result".to_owned(),
                    None => "no JSON-RPC error".to_owned(),
                }
            ),
        ))
    }

    /// [`Probe::refusal`] as an outcome.
    async fn expect_error(
        &self,
        name: &'static str,
        what: &str,
        request: (Vec<u8>, HeaderMap),
        status: u16,
        code: i32,
    ) -> Outcome {
        match self.refusal(name, what, request, status, code).await {
            Ok((_, detail)) => pass(name, detail),
            Err(outcome) => outcome,
        }
    }
}

fn envelope(method: &str, params: Value) -> Vec<u8> {
    json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params })
        .to_string()
        .into_bytes()
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("no content type")
}

/// A JSON-RPC error's code and message, or what else the reply held.
fn error_summary(reply: &Reply) -> String {
    match reply.error() {
        Some(e) => format!(
            "error {}: {}",
            e["code"],
            e["message"].as_str().unwrap_or("")
        ),
        None => {
            let body: String = reply.body.chars().take(120).collect();
            format!("body {body:?}")
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
