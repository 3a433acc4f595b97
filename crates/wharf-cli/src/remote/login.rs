//! `wharf login URL`: OAuth 2.1 authorization code with PKCE for a CLI. The server's
//! challenge leads to its protected-resource metadata and its authorization server; the
//! client identifies with a Client ID Metadata Document when one is given and accepted,
//! else registers (RFC 7591, `application_type: native`); the person signs in in a browser
//! that comes back to a loopback redirect; the tokens go to the token file.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::Html;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use clap::Args;
use reqwest::header;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;

use super::oauth::{
    authorization_server_metadata, challenge_param, post_form, protects, resource_metadata,
    secure_url,
};
use super::tokens::{Grant, Tokens};

/// `wharf login`.
#[derive(Debug, Args)]
pub(crate) struct LoginArgs {
    /// The server's MCP endpoint, e.g. https://mcp.example.com/mcp.
    url: String,
    /// Identify with this Client ID Metadata Document (an https URL you host) when the
    /// authorization server accepts them; otherwise the client registers.
    #[arg(long, env = "WHARF_CLIENT_METADATA_URL")]
    client_metadata_url: Option<String>,
    /// The scopes to ask for (space-separated); default: what the server's challenge names,
    /// else every scope it supports.
    #[arg(long)]
    scope: Option<String>,
    /// Print the sign-in URL instead of opening a browser.
    #[arg(long)]
    no_browser: bool,
    /// The loopback port the browser comes back to (default: any free port).
    #[arg(long, default_value_t = 0)]
    callback_port: u16,
    /// How long to wait for the sign-in, in seconds.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_secs: u64,
}

pub(crate) fn run(args: LoginArgs) -> ExitCode {
    super::block_on(async move {
        match login(&args).await {
            Ok(message) => {
                outln!("{message}");
                ExitCode::SUCCESS
            }
            Err(e) => super::failed(e),
        }
    })
}

/// What the authorization server needs to know, found through the resource.
struct Discovered {
    resource: String,
    issuer: String,
    metadata: Value,
    scope: Option<String>,
}

async fn login(args: &LoginArgs) -> Result<String, String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let Some(found) = discover(&http, args).await? else {
        return Ok(format!(
            "{} asks for no token: nothing to log in to",
            args.url
        ));
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.callback_port))
        .await
        .map_err(|e| format!("cannot listen for the browser's return: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");
    let client_id = identify(&http, args, &found, &redirect_uri).await?;

    let verifier = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    let state = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>());
    let authorization_endpoint = found.metadata["authorization_endpoint"]
        .as_str()
        .ok_or("the authorization server's metadata has no authorization_endpoint")?;
    secure_url("authorization_endpoint", authorization_endpoint)?;
    let mut params = vec![
        ("response_type", "code"),
        ("client_id", client_id.as_str()),
        ("redirect_uri", redirect_uri.as_str()),
        ("code_challenge", challenge.as_str()),
        ("code_challenge_method", "S256"),
        ("state", state.as_str()),
        ("resource", found.resource.as_str()),
    ];
    if let Some(scope) = &found.scope {
        params.push(("scope", scope));
    }
    let sign_in = reqwest::Url::parse_with_params(authorization_endpoint, &params)
        .map_err(|e| format!("authorization_endpoint {authorization_endpoint:?}: {e}"))?;
    eprintln!("Sign in at:\n  {sign_in}");
    if !args.no_browser {
        open_browser(sign_in.as_str());
    }

    let returned = wait_for_return(listener, Duration::from_secs(args.timeout_secs)).await?;
    if returned.get("state") != Some(&state) {
        return Err("the browser came back with another sign-in's state; try again".to_owned());
    }
    if let Some(error) = returned.get("error") {
        return Err(format!(
            "the sign-in was refused: {error}{}",
            returned
                .get("error_description")
                .map(|d| format!(" ({d})"))
                .unwrap_or_default()
        ));
    }
    // RFC 9207: a response from another issuer is a mix-up attack.
    match returned.get("iss") {
        Some(iss) if *iss != found.issuer => {
            return Err(format!(
                "the browser came back from issuer {iss}, not {}",
                found.issuer
            ));
        }
        None if found.metadata["authorization_response_iss_parameter_supported"] == true => {
            return Err(format!(
                "the browser came back without the iss that {} promises to send",
                found.issuer
            ));
        }
        _ => {}
    }
    let code = returned
        .get("code")
        .ok_or("the browser came back without a code")?;
    let token_endpoint = found.metadata["token_endpoint"]
        .as_str()
        .ok_or("the authorization server's metadata has no token_endpoint")?;
    secure_url("token_endpoint", token_endpoint)?;
    let body = post_form(
        &http,
        token_endpoint,
        &[
            ("grant_type", "authorization_code"),
            ("code", code.as_str()),
            ("redirect_uri", redirect_uri.as_str()),
            ("client_id", client_id.as_str()),
            ("code_verifier", verifier.as_str()),
            ("resource", found.resource.as_str()),
        ],
    )
    .await
    .map_err(|e| format!("the token endpoint refused the code ({e})"))?;
    let grant = Grant::from_response(&body, token_endpoint, &client_id, &found.resource, None)?;
    let lifetime = match (grant.expires_at, grant.refresh_token.is_some()) {
        (Some(_), true) => format!(
            "the token lasts {} s and is refreshed when it runs out",
            body["expires_in"]
        ),
        (Some(_), false) => format!(
            "the token lasts {} s; log in again then",
            body["expires_in"]
        ),
        (None, _) => "the token has no stated expiry".to_owned(),
    };
    let tokens = Tokens::open()?;
    let held = tokens.lock().await?;
    let place = tokens.put(&held, &args.url, grant).await?;
    Ok(format!(
        "Logged in to {}: {lifetime}. Kept in {place}.",
        args.url
    ))
}

/// Follows the server's 401 to its authorization server; `None` when it asks no token.
async fn discover(http: &reqwest::Client, args: &LoginArgs) -> Result<Option<Discovered>, String> {
    let anonymous = wharf_client::HttpClient::new(args.url.clone()).with_http(http.clone());
    let reply = anonymous
        .request("server/discover", json!({}))
        .await
        .map_err(|e| format!("{}: {e}", args.url))?;
    // Only an answer proves that the server asks no token; anything else (a wrong path's
    // 404, a 403, a failing server) is not a server to log in to, nor one that is open.
    if reply.status == 200 && reply.response().is_some_and(|r| r.get("result").is_some()) {
        return Ok(None);
    }
    if reply.status != 401 {
        return Err(format!(
            "{} answered server/discover with HTTP {} and no challenge: is it the MCP endpoint (often ending in /mcp)?",
            args.url, reply.status
        ));
    }
    let challenge = reply
        .headers
        .get(header::WWW_AUTHENTICATE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let named = challenge_param(challenge, "resource_metadata");
    let (metadata_url, resource_metadata) = resource_metadata(http, &args.url, named)
        .await
        .map_err(|e| {
            format!("the server wants a token but publishes no protected-resource metadata ({e}); it may take API keys instead: pass --token")
        })?;
    let resource = resource_metadata["resource"]
        .as_str()
        .ok_or_else(|| format!("{metadata_url} names no resource"))?
        .to_owned();
    // RFC 9728 §3.3: metadata for another resource would have this client hand that
    // resource's token to this server.
    if !protects(&resource, &args.url) {
        return Err(format!(
            "{metadata_url} describes resource {resource}, which is not {}: refusing to sign in for it",
            args.url
        ));
    }
    let issuer = resource_metadata["authorization_servers"][0]
        .as_str()
        .ok_or_else(|| format!("{metadata_url} names no authorization server"))?
        .to_owned();
    secure_url("the authorization server", &issuer)?;
    let metadata = authorization_server_metadata(http, &issuer).await?;
    // RFC 8414 §3.3: the metadata must be the issuer's own.
    let issuer = match metadata["issuer"].as_str() {
        Some(said) if said.trim_end_matches('/') == issuer.trim_end_matches('/') => said.to_owned(),
        said => {
            return Err(format!(
                "the metadata of authorization server {issuer} names issuer {}: refusing it",
                said.unwrap_or("none")
            ));
        }
    };
    let pkce = metadata["code_challenge_methods_supported"]
        .as_array()
        .is_some_and(|m| m.iter().any(|v| v == "S256"));
    if !pkce {
        return Err(format!(
            "the authorization server {issuer} does not offer PKCE with S256, which this client requires"
        ));
    }
    let scope = args
        .scope
        .clone()
        .or_else(|| challenge_param(challenge, "scope"))
        .or_else(|| {
            resource_metadata["scopes_supported"].as_array().map(|s| {
                s.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        })
        .filter(|s| !s.is_empty());
    Ok(Some(Discovered {
        resource,
        issuer,
        metadata,
        scope,
    }))
}

/// The client id: the metadata document's URL when given and accepted, else a fresh
/// registration as a native public client.
async fn identify(
    http: &reqwest::Client,
    args: &LoginArgs,
    found: &Discovered,
    redirect_uri: &str,
) -> Result<String, String> {
    let documents = found.metadata["client_id_metadata_document_supported"] == true;
    if let Some(url) = &args.client_metadata_url {
        if documents {
            return Ok(url.clone());
        }
        eprintln!(
            "note: {} does not accept client metadata documents; registering instead",
            found.issuer
        );
    }
    let Some(endpoint) = found.metadata["registration_endpoint"].as_str() else {
        return Err(format!(
            "the authorization server {} takes neither {} nor registrations",
            found.issuer,
            if documents {
                "an unconfigured client (pass --client-metadata-url)"
            } else {
                "client metadata documents"
            }
        ));
    };
    secure_url("registration_endpoint", endpoint)?;
    let res = http
        .post(endpoint)
        .json(&json!({
            "client_name": "wharf (command line)",
            "application_type": "native",
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }))
        .send()
        .await
        .map_err(|e| format!("registration: {}", wharf_client::ClientError::Http(e)))?;
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    match body["client_id"].as_str() {
        Some(id) if status.is_success() => Ok(id.to_owned()),
        _ => Err(format!(
            "the authorization server refused the registration ({status}): {}",
            body["error_description"]
                .as_str()
                .or(body["error"].as_str())
                .unwrap_or("")
        )),
    }
}

/// Opens `url` in the desktop's browser, if there is one; the URL is printed either way.
fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let _ = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

/// Serves the loopback redirect until the browser comes back; returns its query.
async fn wait_for_return(
    listener: tokio::net::TcpListener,
    timeout: Duration,
) -> Result<HashMap<String, String>, String> {
    let (tx, mut rx) = mpsc::channel::<HashMap<String, String>>(1);
    let app = axum::Router::new()
        .route("/callback", axum::routing::get(returned))
        .with_state(tx);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let outcome = tokio::select! {
        query = rx.recv() => query.ok_or_else(|| "the loopback listener stopped".to_owned()),
        _ = tokio::time::sleep(timeout) => Err(format!("nobody signed in within {} s", timeout.as_secs())),
        _ = tokio::signal::ctrl_c() => Err("cancelled".to_owned()),
    };
    server.abort();
    outcome
}

async fn returned(
    State(tx): State<mpsc::Sender<HashMap<String, String>>>,
    Query(query): Query<HashMap<String, String>>,
) -> Html<&'static str> {
    let ok = query.contains_key("code");
    let _ = tx.send(query).await;
    Html(if ok {
        "<!doctype html><title>wharf login</title><p>Signed in. You can close this tab and return to the terminal."
    } else {
        "<!doctype html><title>wharf login</title><p>The sign-in did not complete; the terminal says why."
    })
}

#[cfg(test)]
mod tests {
    use super::protects;

    #[test]
    fn a_resource_covers_its_own_url_and_the_paths_below_it() {
        assert!(protects(
            "https://api.example/mcp",
            "https://api.example/mcp"
        ));
        assert!(protects("https://API.example/", "https://api.example/mcp"));
        assert!(protects(
            "https://api.example",
            "https://api.example:443/mcp"
        ));
        assert!(protects(
            "https://api.example/v1",
            "https://api.example/v1/mcp"
        ));
        assert!(!protects(
            "https://api.example/v1",
            "https://api.example/v10/mcp"
        ));
        assert!(!protects(
            "https://other.example/mcp",
            "https://api.example/mcp"
        ));
        assert!(!protects(
            "http://api.example/mcp",
            "https://api.example/mcp"
        ));
        assert!(!protects(
            "https://api.example:8443/mcp",
            "https://api.example/mcp"
        ));
        assert!(!protects("not a url", "https://api.example/mcp"));
    }
}
