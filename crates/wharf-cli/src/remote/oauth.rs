//! What an OAuth client reads before it signs in: the resource's challenge and metadata
//! (RFC 9728) and its authorization server's metadata (RFC 8414, OpenID discovery).

use serde_json::Value;

/// The value of `param` in a `WWW-Authenticate` challenge (quoted or bare), read as
/// RFC 9110 auth-params so that text inside a quoted value is never taken for a parameter.
pub(crate) fn challenge_param(challenge: &str, param: &str) -> Option<String> {
    // Skip the scheme.
    let mut rest = challenge.trim_start();
    rest = rest.split_once(' ').map_or("", |(_, r)| r);
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        let (name, after) = rest.split_once('=')?;
        let name = name.trim();
        let after = after.trim_start();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => {
                let mut value = String::new();
                let mut chars = quoted.char_indices();
                let mut end = quoted.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some((_, escaped)) = chars.next() {
                                value.push(escaped);
                            }
                        }
                        '"' => {
                            end = i + 1;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                (value, &quoted[end..])
            }
            None => {
                let end = after.find([',', ' ']).unwrap_or(after.len());
                (after[..end].to_owned(), &after[end..])
            }
        };
        if name.eq_ignore_ascii_case(param) {
            return Some(value);
        }
        rest = next;
    }
}

/// Where the protected-resource metadata of `resource` may be, for a server whose challenge
/// names none, in the order a client asks (MCP 2025-11-25 authorization): RFC 9728's address
/// (the well-known prefix inserted before the path), then the origin's own.
pub(crate) fn resource_metadata_urls(resource: &str) -> Vec<String> {
    let (origin, path) = split_origin(resource);
    let mut urls = vec![format!(
        "{origin}/.well-known/oauth-protected-resource{path}"
    )];
    if !path.is_empty() {
        urls.push(format!("{origin}/.well-known/oauth-protected-resource"));
    }
    urls
}

/// The protected-resource metadata of `resource` and where it was found: at `named` (the
/// challenge's `resource_metadata`), else at the first of [`resource_metadata_urls`] that
/// has it.
pub(crate) async fn resource_metadata(
    http: &reqwest::Client,
    resource: &str,
    named: Option<String>,
) -> Result<(String, Value), String> {
    let urls = named.map_or_else(|| resource_metadata_urls(resource), |url| vec![url]);
    let mut errors = Vec::new();
    for url in urls {
        match fetch_json(http, &url).await {
            Ok(metadata) => return Ok((url, metadata)),
            Err(e) => errors.push(e),
        }
    }
    Err(errors.join("; "))
}

/// Refuses `url` (`what` names it) unless it is `https`, or `http` to this machine: the
/// authorization server's endpoints carry codes, verifiers and refresh tokens, and its
/// metadata says where they go (MCP authorization: its endpoints MUST be served over HTTPS).
/// The authorization endpoint is handed to the browser too, where any other scheme would
/// open whatever handles it.
pub(crate) fn secure_url(what: &str, url: &str) -> Result<(), String> {
    reqwest::Url::parse(url).map_err(|e| format!("{what} {url:?}: {e}"))?;
    if wharf_auth::is_secure_url(url) {
        Ok(())
    } else {
        Err(format!(
            "{what} {url} is not https (plain http only on a loopback host): the codes, tokens, keys and secrets it carries could be read or forged on the way"
        ))
    }
}

/// The metadata addresses of `issuer`: RFC 8414 (path inserted after the well-known
/// prefix), then OpenID Connect discovery in both placements.
pub(crate) fn well_known(issuer: &str) -> Vec<String> {
    let issuer = issuer.trim_end_matches('/');
    let (origin, path) = split_origin(issuer);
    vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{origin}/.well-known/openid-configuration{path}"),
        format!("{issuer}/.well-known/openid-configuration"),
    ]
}

/// `https://host:port` and the path after it (empty, or starting with `/`).
fn split_origin(url: &str) -> (&str, &str) {
    let url = url.trim_end_matches('/');
    match url
        .find("://")
        .and_then(|s| url[s + 3..].find('/').map(|p| s + 3 + p))
    {
        Some(at) => (&url[..at], &url[at..]),
        None => (url, ""),
    }
}

/// GETs `url` and reads its JSON; an error says what came back instead.
pub(crate) async fn fetch_json(http: &reqwest::Client, url: &str) -> Result<Value, String> {
    let res = http
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| format!("{url}: {}", wharf_client::ClientError::Http(e)))?;
    if !res.status().is_success() {
        return Err(format!("{url}: HTTP {}", res.status()));
    }
    res.json()
        .await
        .map_err(|e| format!("{url}: not JSON: {e}"))
}

/// Why an authorization server's endpoint gave no answer to use.
#[derive(Debug)]
pub(crate) struct Refused {
    /// The HTTP status, when it answered at all.
    status: Option<u16>,
    message: String,
}

impl Refused {
    /// Whether asking again later may work: it could not be reached, or answered that it is
    /// in trouble (5xx) or busy (429). Anything else (`invalid_grant`, say) is its verdict.
    pub(crate) fn may_pass(&self) -> bool {
        self.status.is_none_or(|s| s >= 500 || s == 429)
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// POSTs `form` to an authorization server's `endpoint` (token, RFC 6749 §3.2) and reads
/// its JSON; a refusal comes back as the status and the server's description of it.
pub(crate) async fn post_form(
    http: &reqwest::Client,
    endpoint: &str,
    form: &[(&str, &str)],
) -> Result<Value, Refused> {
    let res = http
        .post(endpoint)
        .form(form)
        .send()
        .await
        .map_err(|e| Refused {
            status: None,
            message: format!("{endpoint}: {}", wharf_client::ClientError::Http(e)),
        })?;
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(body);
    }
    let said = body["error_description"]
        .as_str()
        .or(body["error"].as_str())
        .unwrap_or("no reason given");
    Err(Refused {
        status: Some(status.as_u16()),
        message: format!("{status}: {said}"),
    })
}

/// The metadata of authorization server `issuer`, from the first address that has it.
pub(crate) async fn authorization_server_metadata(
    http: &reqwest::Client,
    issuer: &str,
) -> Result<Value, String> {
    let mut errors = Vec::new();
    for url in well_known(issuer) {
        match fetch_json(http, &url).await {
            Ok(v) => return Ok(v),
            Err(e) => errors.push(e),
        }
    }
    Err(format!(
        "no metadata for the authorization server {issuer} ({})",
        errors.join("; ")
    ))
}

/// Whether `resource` (from protected-resource metadata) covers endpoint `url`: the same
/// URL, or a prefix of it ending at a path boundary (scheme and host compared without case).
pub(crate) fn protects(resource: &str, url: &str) -> bool {
    let (Ok(resource), Ok(url)) = (reqwest::Url::parse(resource), reqwest::Url::parse(url)) else {
        return false;
    };
    let base = resource.path().trim_end_matches('/');
    let path = url.path();
    resource.scheme() == url.scheme()
        && resource.host_str() == url.host_str()
        && resource.port_or_known_default() == url.port_or_known_default()
        && (path.trim_end_matches('/') == base
            || path
                .strip_prefix(base)
                .is_some_and(|rest| rest.starts_with('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenge_parameters_are_read_quoted_or_bare() {
        let c = r#"Bearer error="invalid_token", resource_metadata="https://a.example/.well-known/oauth-protected-resource/mcp", scope=files:read"#;
        assert_eq!(
            challenge_param(c, "resource_metadata").as_deref(),
            Some("https://a.example/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(challenge_param(c, "scope").as_deref(), Some("files:read"));
        assert_eq!(challenge_param(c, "realm"), None);
        // A parameter's name inside another's value is not the parameter, and escapes hold.
        let tricky = r#"Bearer error_description="no \"scope=x\" here", scope="a b""#;
        assert_eq!(challenge_param(tricky, "scope").as_deref(), Some("a b"));
        assert_eq!(
            challenge_param(tricky, "error_description").as_deref(),
            Some(r#"no "scope=x" here"#)
        );
    }

    #[test]
    fn metadata_addresses_follow_the_rfcs() {
        assert_eq!(
            well_known("https://auth.example/tenant1"),
            vec![
                "https://auth.example/.well-known/oauth-authorization-server/tenant1",
                "https://auth.example/.well-known/openid-configuration/tenant1",
                "https://auth.example/tenant1/.well-known/openid-configuration",
            ]
        );
        assert_eq!(
            well_known("http://127.0.0.1:9/")[0],
            "http://127.0.0.1:9/.well-known/oauth-authorization-server"
        );
        assert_eq!(
            resource_metadata_urls("https://api.example/mcp"),
            [
                "https://api.example/.well-known/oauth-protected-resource/mcp",
                "https://api.example/.well-known/oauth-protected-resource",
            ]
        );
        assert_eq!(
            resource_metadata_urls("https://api.example/"),
            ["https://api.example/.well-known/oauth-protected-resource"]
        );
    }

    /// A server whose challenge names no metadata, and which serves it only at its origin's
    /// well-known address, is still found there (MCP 2025-11-25: path first, then root).
    #[tokio::test]
    async fn protected_resource_metadata_is_looked_for_at_the_root_too() {
        let app = axum::Router::new().route(
            "/.well-known/oauth-protected-resource",
            axum::routing::get(|| async {
                axum::Json(serde_json::json!({ "resource": "http://x/mcp" }))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        let (found, metadata) = resource_metadata(&http, &format!("{origin}/mcp"), None)
            .await
            .unwrap();
        assert_eq!(
            found,
            format!("{origin}/.well-known/oauth-protected-resource")
        );
        assert_eq!(metadata["resource"], "http://x/mcp");
        // One the challenge names is the only one asked.
        let named = format!("{origin}/elsewhere");
        let e = resource_metadata(&http, &format!("{origin}/mcp"), Some(named.clone()))
            .await
            .unwrap_err();
        assert!(e.contains(&named), "{e}");
    }

    #[test]
    fn credentials_go_only_over_https_or_to_this_machine() {
        for fine in [
            "https://as.example/token",
            "http://127.0.0.1:9/token",
            "http://localhost:9/authorize",
            "http://[::1]:9/token",
        ] {
            assert_eq!(secure_url("token_endpoint", fine), Ok(()), "{fine}");
        }
        for refused in [
            "http://as.example/token",
            "http://10.0.0.1/token",
            "file:///etc/passwd",
            "javascript:alert(1)",
        ] {
            let e = secure_url("authorization_endpoint", refused).unwrap_err();
            assert!(e.contains("authorization_endpoint"), "{e}");
        }
    }
}
