//! Request-time scope challenges (SEP-2350), as the conformance scenario
//! `sep-2350-server-scope-challenge` checks them: `wharf serve --profile conformance` takes
//! opaque tokens by introspection (RFC 7662) from an authorization server played by this
//! test on loopback. A token with only `mcp:conformance:baseline` is refused each of four
//! fixtures with HTTP 403 and one `insufficient_scope` challenge naming every scope the
//! request needs; the same request with a token holding them all is served.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::post;
use common::{ServerProcess, validate_reply};
use serde_json::{Value, json};
use wharf_client::Reply;

const LOW: &str = "mcp-conformance-scope-low";
const FULL: &str = "mcp-conformance-scope-full";
const BASELINE: &str = "mcp:conformance:baseline";

/// One request of the scenario and the two scopes its challenge must name.
struct Fixture {
    method: &'static str,
    params: Value,
    scopes: [&'static str; 2],
}

fn fixtures() -> Vec<Fixture> {
    vec![
        Fixture {
            method: "tools/call",
            params: json!({ "name": "test_simple_text" }),
            scopes: [
                "mcp:conformance:tools:call",
                "mcp:conformance:tools:test_simple_text",
            ],
        },
        Fixture {
            method: "resources/read",
            params: json!({ "uri": "test://static-text" }),
            scopes: [
                "mcp:conformance:resources:read",
                "mcp:conformance:resources:static",
            ],
        },
        Fixture {
            method: "resources/read",
            params: json!({ "uri": "test://template/123/data" }),
            scopes: [
                "mcp:conformance:resources:read",
                "mcp:conformance:resources:template:123",
            ],
        },
        Fixture {
            method: "prompts/get",
            params: json!({ "name": "test_simple_prompt" }),
            scopes: [
                "mcp:conformance:prompts:get",
                "mcp:conformance:prompts:test_simple_prompt",
            ],
        },
    ]
}

/// The authorization server's introspection endpoint, for tokens issued to `resource`.
#[derive(Clone)]
struct Issuer {
    url: String,
    resource: String,
}

/// Starts the issuer on a free loopback port; it knows the tokens [`scopes_of_token`] lists.
async fn issuer(resource: String) -> Issuer {
    // Bound by the system (nothing else holds it) and never handed to a server by free_port.
    let listener = common::tokio_listener();
    let state = Issuer {
        url: format!("http://{}", listener.local_addr().unwrap()),
        resource,
    };
    let app = Router::new()
        .route("/introspect", post(introspect))
        .with_state(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    state
}

/// The scopes of each token the issuer knows.
fn scopes_of_token(token: &str) -> Option<Vec<&'static str>> {
    let every_fixture = fixtures().into_iter().flat_map(|f| f.scopes);
    Some(match token {
        LOW => vec![BASELINE],
        FULL => std::iter::once(BASELINE).chain(every_fixture).collect(),
        // Half of what the tool needs, and the template's item 7 rather than 123.
        "partial" => vec![
            BASELINE,
            "mcp:conformance:tools:call",
            "mcp:conformance:resources:read",
            "mcp:conformance:resources:template:7",
        ],
        // Everything the fixtures need, but not what every request needs.
        "no-baseline" => every_fixture.collect(),
        _ => return None,
    })
}

async fn introspect(State(s): State<Issuer>, body: String) -> Json<Value> {
    // The test's tokens need no percent-decoding.
    let token = body.split('&').find_map(|pair| pair.strip_prefix("token="));
    Json(match token.and_then(scopes_of_token) {
        Some(scopes) => json!({
            "active": true, "sub": "conformance", "iss": s.url, "client_id": "suite",
            "aud": s.resource, "scope": scopes.join(" "), "token_type": "Bearer" }),
        None => json!({ "active": false }),
    })
}

/// `wharf serve --profile conformance` taking the issuer's tokens, with the baseline scope
/// needed by every request.
async fn server() -> (ServerProcess, Issuer) {
    let port = common::free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let issuer = issuer(resource.clone()).await;
    let introspection = format!("{}/introspect", issuer.url);
    let server = ServerProcess::start_on(
        port,
        &[
            "--profile",
            "conformance",
            "--oauth-issuer",
            &issuer.url,
            "--oauth-resource",
            &resource,
            "--oauth-introspection-url",
            &introspection,
            "--oauth-client-id",
            "wharf",
            "--oauth-client-secret",
            "s3cret-for-tests",
            "--oauth-required-scope",
            BASELINE,
        ],
    );
    (server, issuer)
}

async fn send(server: &ServerProcess, token: &str, method: &str, params: &Value) -> Reply {
    let reply = server
        .client()
        .with_bearer(token)
        .request(method, params.clone())
        .await
        .unwrap();
    validate_reply(method, &reply);
    reply
}

/// The `Bearer` challenge's parameters (RFC 9110 §11.2 auth-params, quoted or not).
fn bearer_params(reply: &Reply) -> BTreeMap<String, String> {
    let header = reply
        .headers
        .get("www-authenticate")
        .unwrap_or_else(|| panic!("no WWW-Authenticate: {}", reply.body))
        .to_str()
        .unwrap();
    let rest = header
        .strip_prefix("Bearer ")
        .unwrap_or_else(|| panic!("not a Bearer challenge: {header}"));
    let mut params = BTreeMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ' || *c == ',').is_some() {}
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if key.is_empty() {
            break;
        }
        assert_eq!(chars.next(), Some('='), "{header}");
        let mut value = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('"') => break,
                    Some(c) => value.push(c),
                    None => panic!("unclosed quoted value in {header}"),
                }
            }
        } else {
            value.extend(std::iter::from_fn(|| chars.next_if(|c| *c != ',')));
        }
        let key = key.trim().to_ascii_lowercase();
        assert!(
            params.insert(key.clone(), value).is_none(),
            "{key} twice: {header}"
        );
    }
    params
}

/// A 403 with exactly `error`, `scope` (as a set: `needed`) and an absolute
/// `resource_metadata` at the server's own origin; the body is JSON-RPC -31003.
fn assert_challenged(reply: &Reply, server: &ServerProcess, needed: &BTreeSet<&str>) {
    assert_eq!(reply.status, 403, "{}", reply.body);
    let params = bearer_params(reply);
    assert_eq!(
        params.keys().map(String::as_str).collect::<Vec<_>>(),
        ["error", "resource_metadata", "scope"],
        "{params:?}"
    );
    assert_eq!(params["error"], "insufficient_scope");
    // Plain http is acceptable only at the origin of the endpoint itself.
    let origin = format!("http://127.0.0.1:{}", server.port);
    assert!(server.url().starts_with(&origin));
    assert_eq!(
        params["resource_metadata"],
        format!("{origin}/.well-known/oauth-protected-resource/mcp")
    );
    let challenged: Vec<&str> = params["scope"].split(' ').collect();
    let set: BTreeSet<&str> = challenged.iter().copied().collect();
    assert_eq!(set.len(), challenged.len(), "a scope twice: {challenged:?}");
    assert_eq!(&set, needed, "the challenge names what the request needs");
    assert_eq!(reply.error_code(), Some(-31003), "{}", reply.body);
}

/// The normal result of a fixture, as the scenario checks it.
fn assert_served(reply: &Reply, f: &Fixture) {
    assert_eq!(reply.status, 200, "{}", reply.body);
    let result = reply
        .result()
        .unwrap_or_else(|| panic!("no result: {}", reply.body));
    match f.method {
        "tools/call" => {
            assert_eq!(result["content"][0]["type"], "text");
            assert!(result["content"][0]["text"].is_string());
            assert_ne!(result["isError"], true);
        }
        "resources/read" => {
            let uri = f.params["uri"].as_str().unwrap();
            assert_eq!(result["contents"][0]["uri"], uri);
            let text = result["contents"][0]["text"].as_str().unwrap();
            if uri.contains("/123/") {
                assert!(text.contains("123"), "{text}");
            }
        }
        _ => {
            assert_eq!(result["messages"][0]["role"], "user");
            assert!(result["messages"][0]["content"].is_object());
        }
    }
}

#[tokio::test]
async fn the_scenarios_requests_are_challenged_then_served_with_the_full_token() {
    let (server, _issuer) = server().await;
    for f in fixtures() {
        let low = send(&server, LOW, f.method, &f.params).await;
        // The union of what every request needs and what this fixture needs.
        let needed: BTreeSet<&str> = std::iter::once(BASELINE).chain(f.scopes).collect();
        assert_challenged(&low, &server, &needed);
        let error = low.error().unwrap();
        assert_eq!(error["data"]["requiredScopes"], json!(f.scopes), "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.ends_with(&format!("the token lacks {}", f.scopes.join(" "))),
            "{message}"
        );

        let full = send(&server, FULL, f.method, &f.params).await;
        assert_served(&full, &f);
    }
}

/// `wharf call` with a token short of a scope says which scopes the call needs and how to
/// get a token that has them: for a token it was given, that it needs another; for the one
/// `wharf login` kept, the login that asks for every scope the server offers.
#[tokio::test]
async fn the_command_says_how_to_get_the_scopes_a_call_needs() {
    let (server, _issuer) = server().await;
    let url = server.url();
    let needed = fixtures()[0].scopes.join(" ");
    let call = |env: Vec<(String, String)>, token: Option<&'static str>| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let mut args = vec!["call", url.as_str(), "test_simple_text"];
            args.extend(token.map(|t| ["--token", t]).into_iter().flatten());
            common::wharf_in(&env, &args)
        })
    };

    let given = call(Vec::new(), Some(LOW)).await.unwrap();
    assert!(!given.status.success());
    let said = String::from_utf8_lossy(&given.stderr);
    assert!(
        said.contains(&format!(
            "(--token or WHARF_TOKEN) lacks a scope this call needs ({needed})"
        )),
        "{said}"
    );

    // The same token, as a login kept it.
    let config = std::env::temp_dir().join(format!("wharf-scope-hint-{}", std::process::id()));
    std::fs::create_dir_all(&config).unwrap();
    let grant = json!({ url.as_str(): {
        "access_token": LOW,
        "token_endpoint": "http://127.0.0.1:9/token",
        "client_id": "wharf-cli",
        "resource": url,
    }});
    std::fs::write(config.join("tokens.json"), grant.to_string()).unwrap();
    let env = vec![("WHARF_CONFIG_DIR".to_owned(), config.display().to_string())];
    let kept = call(env, None).await.unwrap();
    std::fs::remove_dir_all(&config).unwrap();
    assert!(!kept.status.success());
    let said = String::from_utf8_lossy(&kept.stderr);
    assert!(
        said.contains(&format!(
            "needs ({needed}): sign in again with `wharf login '{url}'`"
        )),
        "{said}"
    );
}

#[tokio::test]
async fn a_challenge_names_every_scope_needed_not_only_the_missing_ones() {
    let (server, _issuer) = server().await;
    let [tool, template] = [&fixtures()[0], &fixtures()[2]].map(|f| (f.method, f.params.clone()));

    // The token has tools:call but not the tool's own scope: asked for both (and the
    // baseline), a client that re-authorizes with the challenge alone keeps what it needs.
    let r = send(&server, "partial", tool.0, &tool.1).await;
    let needed = BTreeSet::from([
        BASELINE,
        "mcp:conformance:tools:call",
        "mcp:conformance:tools:test_simple_text",
    ]);
    assert_challenged(&r, &server, &needed);
    let message = r.error().unwrap()["message"].as_str().unwrap();
    assert!(
        message.ends_with("the token lacks mcp:conformance:tools:test_simple_text"),
        "{message}"
    );

    // Template scopes are per item: item 7 is this token's, item 123 is not.
    let r = send(&server, "partial", template.0, &template.1).await;
    let needed = BTreeSet::from([
        BASELINE,
        "mcp:conformance:resources:read",
        "mcp:conformance:resources:template:123",
    ]);
    assert_challenged(&r, &server, &needed);
    let seven = json!({ "uri": "test://template/7/data" });
    let r = send(&server, "partial", "resources/read", &seven).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = send(&server, FULL, "resources/read", &seven).await;
    let needed = BTreeSet::from([
        BASELINE,
        "mcp:conformance:resources:read",
        "mcp:conformance:resources:template:7",
    ]);
    assert_challenged(&r, &server, &needed);

    // Without the scope every request needs, every request is refused, naming it.
    let r = send(&server, "no-baseline", tool.0, &tool.1).await;
    assert_challenged(&r, &server, &BTreeSet::from([BASELINE]));
}

/// What a request reaches through another method needs the target's scopes: a completion
/// those of its prompt, a `subscriptions/listen` those of each resource it subscribes to.
#[tokio::test]
async fn completions_and_subscriptions_need_the_scopes_of_their_targets() {
    let (server, _issuer) = server().await;
    let complete = json!({ "ref": { "type": "ref/prompt", "name": "test_prompt_with_arguments" },
        "argument": { "name": "arg1", "value": "pa" } });
    let r = send(&server, LOW, "completion/complete", &complete).await;
    assert_challenged(
        &r,
        &server,
        &BTreeSet::from([BASELINE, "mcp:conformance:prompts:get"]),
    );
    let r = send(&server, FULL, "completion/complete", &complete).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.result().unwrap()["completion"]["values"],
        json!(["paris", "park", "party"])
    );

    let listen = json!({ "notifications": { "resourceSubscriptions": ["test://static-text"] } });
    let r = send(&server, LOW, "subscriptions/listen", &listen).await;
    assert_challenged(
        &r,
        &server,
        &BTreeSet::from([
            BASELINE,
            "mcp:conformance:resources:read",
            "mcp:conformance:resources:static",
        ]),
    );
    let mut stream = Box::pin(
        server
            .client()
            .with_bearer(FULL)
            .open_stream("subscriptions/listen", listen)
            .await
            .unwrap(),
    );
    let first = futures_util::StreamExt::next(&mut stream).await.unwrap();
    common::validate_message("subscriptions/listen", &first);
    assert_eq!(
        first["method"], "notifications/subscriptions/acknowledged",
        "{first}"
    );
}

#[tokio::test]
async fn anonymous_runs_are_not_limited_by_these_scopes() {
    let server = ServerProcess::start_exact(&["--profile", "conformance", "--anonymous"]);
    let client = server.client();
    for f in fixtures() {
        let reply = common::request(&client, f.method, f.params.clone()).await;
        assert_served(&reply, &f);
    }
}
