//! What a request reaches through another method needs the same scopes as a direct call: a
//! completion those of its prompt or template (a completer lists their values), a
//! `subscriptions/listen` those of each resource it subscribes to (it learns when they
//! change). In-process, with OAuth principals.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wharf::protocol::{Completion, GetPromptResult, Implementation, ResourceContents};
use wharf::testing::{Harness, oauth_user};
use wharf::{ErrorKind, ErrorReply, HandlerError, Principal, Server, prompt, resource, template};

const READ: &str = "notes:read";

fn server(completions: &Arc<AtomicUsize>) -> Server {
    let completer = |n: &Arc<AtomicUsize>| {
        let n = Arc::clone(n);
        move |_cx, _arg, _ctx| {
            n.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, HandlerError>(Completion {
                    values: vec!["secret-name".into()],
                    ..Default::default()
                })
            }
        }
    };
    Server::builder(Implementation::new("t", "1"))
        .prompt(
            prompt("summary")
                .argument("note", "Which note", true)
                .scopes(&[READ])
                .completer(completer(completions))
                .handler(|_cx, _args| async { Ok(GetPromptResult::default()) }),
        )
        .template(
            template("notes://{id}", "note")
                .scopes(&[READ, "notes:item:{id}"])
                .completer(completer(completions))
                .handler(|_cx, req| async move {
                    Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
                }),
        )
        .template(
            template("notes://{id}/{part}", "part of a note")
                .scopes(&[READ, "notes:item:{id}"])
                .completer(completer(completions))
                .handler(|_cx, req| async move {
                    Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
                }),
        )
        .resource(resource("notes://index", "index").scopes(&[READ]).handler(
            |_cx, req| async move { Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")]) },
        ))
        .build()
        .unwrap()
}

/// A completion of the prompt's argument, or the template's variable.
fn completion(reference: Value) -> Value {
    let name = if reference["type"] == "ref/prompt" {
        "note"
    } else {
        "id"
    };
    json!({ "ref": reference, "argument": { "name": name, "value": "" } })
}

async fn complete(server: &Server, who: &Principal, reference: Value) -> Result<Value, ErrorReply> {
    Harness::new(server.clone())
        .principal(who.clone())
        .call("completion/complete", completion(reference))
        .await
}

#[tokio::test]
async fn a_completion_needs_the_scopes_of_its_prompt_or_template() {
    let completions = Arc::new(AtomicUsize::new(0));
    let s = server(&completions);
    let prompt_ref = json!({ "type": "ref/prompt", "name": "summary" });
    let template_ref = json!({ "type": "ref/resource", "uri": "notes://{id}" });
    for reference in [&prompt_ref, &template_ref] {
        let refused = complete(&s, &oauth_user(&[]), reference.clone())
            .await
            .unwrap_err();
        assert_eq!(
            refused.error().kind,
            ErrorKind::InsufficientScope,
            "{reference}"
        );
        assert_eq!(refused.required_scopes(), [READ]);
    }
    assert_eq!(completions.load(Ordering::SeqCst), 0, "no completer ran");

    // With the scope (a template's per-item scopes name no item yet, so they do not apply).
    for reference in [prompt_ref, template_ref] {
        let done = complete(&s, &oauth_user(&[READ]), reference).await.unwrap();
        assert_eq!(done["completion"]["values"], json!(["secret-name"]));
    }
    // Principals not limited by scopes are not limited here either.
    let anonymous = complete(
        &s,
        &Principal::anonymous(),
        json!({ "type": "ref/prompt", "name": "summary" }),
    )
    .await
    .unwrap();
    assert_eq!(anonymous["completion"]["values"], json!(["secret-name"]));
    assert_eq!(completions.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_completion_under_a_bound_variable_needs_that_items_scope() {
    let completions = Arc::new(AtomicUsize::new(0));
    let s = server(&completions);
    let under_seven = json!({
        "ref": { "type": "ref/resource", "uri": "notes://{id}/{part}" },
        "argument": { "name": "part", "value": "" },
        "context": { "arguments": { "id": "7" } }
    });
    let call = |who: Principal| {
        let harness = Harness::new(s.clone()).principal(who);
        let params = under_seven.clone();
        async move { harness.call("completion/complete", params).await }
    };
    let refused = call(oauth_user(&[READ])).await.unwrap_err();
    assert_eq!(refused.error().kind, ErrorKind::InsufficientScope);
    assert_eq!(refused.required_scopes(), [READ, "notes:item:7"]);
    assert_eq!(completions.load(Ordering::SeqCst), 0, "no completer ran");
    let done = call(oauth_user(&[READ, "notes:item:7"])).await.unwrap();
    assert_eq!(done["completion"]["values"], json!(["secret-name"]));
}

/// Completion inputs are checked as any other: an argument (or a context argument) its
/// prompt or template does not have is refused (-32602) before any completer runs; a
/// static resource has none.
#[tokio::test]
async fn a_completion_of_an_argument_its_target_lacks_is_refused() {
    let completions = Arc::new(AtomicUsize::new(0));
    let s = server(&completions);
    let who = oauth_user(&[READ, "notes:item:7"]);
    for params in [
        json!({ "ref": { "type": "ref/prompt", "name": "summary" },
            "argument": { "name": "bogus", "value": "" } }),
        json!({ "ref": { "type": "ref/resource", "uri": "notes://{id}" },
            "argument": { "name": "part", "value": "" } }),
        json!({ "ref": { "type": "ref/resource", "uri": "notes://{id}/{part}" },
            "argument": { "name": "part", "value": "" },
            "context": { "arguments": { "id": "7", "owner": "x" } } }),
        json!({ "ref": { "type": "ref/resource", "uri": "notes://index" },
            "argument": { "name": "id", "value": "" } }),
    ] {
        let refused = Harness::new(s.clone())
            .principal(who.clone())
            .call("completion/complete", params.clone())
            .await
            .unwrap_err();
        assert_eq!(refused.error().kind, ErrorKind::InvalidParams, "{params}");
        assert!(
            refused.error().message.contains("is not an argument of"),
            "{params}: {}",
            refused.error().message
        );
    }
    assert_eq!(completions.load(Ordering::SeqCst), 0, "no completer ran");
}

#[tokio::test]
async fn a_subscription_needs_the_scopes_of_each_resource() {
    let s = server(&Arc::new(AtomicUsize::new(0)));
    // The first messages of a listen stream, or its refusal.
    let listen = |who: Principal, uris: &[&str]| {
        let h = Harness::new(s.clone()).principal(who);
        let params =
            json!({ "notifications": { "toolsListChanged": true, "resourceSubscriptions": uris } });
        async move {
            let cancel = CancellationToken::new();
            // Shut down at once: an admitted stream acknowledges, then ends.
            h.server().shutdown();
            h.stream("subscriptions/listen", params, cancel).await
        }
    };
    let reader = oauth_user(&[READ]);
    // A fixed resource, and a template's item with its own scope.
    let refused = listen(oauth_user(&[]), &["notes://index"])
        .await
        .unwrap_err();
    assert_eq!(refused.error().kind, ErrorKind::InsufficientScope);
    let refused = listen(reader, &["notes://7"]).await.unwrap_err();
    assert_eq!(refused.error().kind, ErrorKind::InsufficientScope);
    assert_eq!(refused.required_scopes(), [READ, "notes:item:7"]);
    // Allowed: what the token may read, and list changes, which need no scope.
    let sent = listen(
        oauth_user(&[READ, "notes:item:7"]),
        &["notes://index", "notes://7"],
    )
    .await
    .unwrap();
    assert_eq!(
        sent[0]["method"],
        "notifications/subscriptions/acknowledged"
    );
    assert_eq!(
        sent[0]["params"]["notifications"]["resourceSubscriptions"],
        json!(["notes://index", "notes://7"])
    );
    let sent = listen(oauth_user(&[]), &[]).await.unwrap();
    assert_eq!(
        sent[0]["method"],
        "notifications/subscriptions/acknowledged"
    );
}

/// What protected resource metadata advertises: every fixed scope the definitions declare,
/// once each; a template's per-item scope names no scope until a URI fills it in.
#[test]
fn the_server_lists_the_scopes_its_definitions_use() {
    let server = server(&Arc::new(AtomicUsize::new(0)));
    assert_eq!(server.scopes(), [READ.to_owned()]);
    let more = Server::builder(Implementation::new("t", "1"))
        .prompt(
            prompt("b")
                .scopes(&["z:write", "a:read"])
                .handler(|_cx, _args| async { Ok(GetPromptResult::default()) }),
        )
        .resource(
            resource("notes://a", "a")
                .scopes(&["a:read"])
                .handler(|_cx, req| async move {
                    Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
                }),
        )
        .build()
        .unwrap();
    assert_eq!(more.scopes(), ["a:read".to_owned(), "z:write".to_owned()]);
}

/// Scopes are quoted into WWW-Authenticate challenges: one that is not an RFC 6749 scope
/// token is refused when the server is built, naming it and its definition.
#[test]
fn a_scope_outside_the_scope_grammar_is_refused_at_build() {
    for bad in ["notes read", "notes\"read", "notes\\read", "", "caf\u{e9}"] {
        let refused = Server::builder(Implementation::new("t", "1"))
            .prompt(
                prompt("summary")
                    .scopes(&[READ, bad])
                    .handler(|_cx, _args| async { Ok(GetPromptResult::default()) }),
            )
            .build()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            refused.starts_with(&format!(
                "prompt \"summary\": scope {bad:?} is not a valid scope"
            )),
            "{bad:?}: {refused}"
        );
    }
    let refused = Server::builder(Implementation::new("t", "1"))
        .template(
            template("notes://{id}", "note")
                .scopes(&["notes:item {id}"])
                .handler(|_cx, req| async move {
                    Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
                }),
        )
        .build()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.starts_with("resource template \"notes://{id}\": scope \"notes:item {id}\" is not"),
        "{refused}"
    );
}

/// A completion carries at most 100 values; its total counts at least what the completer
/// gave (a smaller total it said is raised), and more than are sent says `hasMore`.
#[tokio::test]
async fn a_completion_is_capped_and_its_total_counts_what_was_given() {
    let s = Server::builder(Implementation::new("t", "1"))
        .prompt(
            prompt("many")
                .argument("n", "A number", true)
                .completer(|_cx, _arg, _ctx| async {
                    Ok::<_, HandlerError>(Completion {
                        values: (0..150).map(|i| i.to_string()).collect(),
                        total: Some(50),
                        ..Default::default()
                    })
                })
                .handler(|_cx, _args| async { Ok(GetPromptResult::default()) }),
        )
        .build()
        .unwrap();
    let done = Harness::new(s)
        .call(
            "completion/complete",
            json!({ "ref": { "type": "ref/prompt", "name": "many" },
                "argument": { "name": "n", "value": "" } }),
        )
        .await
        .unwrap();
    let completion = &done["completion"];
    assert_eq!(completion["values"].as_array().unwrap().len(), 100);
    assert_eq!(completion["total"], 150, "{completion}");
    assert_eq!(completion["hasMore"], true, "{completion}");
}

/// A URI reaches what serves it, and what that needs, however it is written: the static
/// resource it names percent-encoded (not a template that also matches, with its looser
/// scopes), and the most specific of two templates that match it (not the first
/// registered). A scope template whose variables could run into each other is refused.
#[tokio::test]
async fn a_uri_reaches_the_most_specific_target_however_it_is_written() {
    let served = |by: &'static str| {
        move |_cx, req: wharf::ReadRequest| async move {
            Ok(vec![ResourceContents::text(req.uri, "text/plain", by)])
        }
    };
    let s = Server::builder(Implementation::new("t", "1"))
        .template(
            template("config://{ns}/{key}", "config")
                .scopes(&["config:read"])
                .handler(served("template")),
        )
        .template(template("config://public/{key}", "public config").handler(served("public")))
        .resource(
            resource("config://app/secrets", "secrets")
                .scopes(&["admin"])
                .handler(served("static")),
        )
        .build()
        .unwrap();
    let read = |who: Principal, uri: &str| {
        let harness = Harness::new(s.clone()).principal(who);
        let params = json!({ "uri": uri });
        async move { harness.call("resources/read", params).await }
    };
    let reader = oauth_user(&["config:read"]);
    let refused = read(reader.clone(), "config://app/secr%65ts")
        .await
        .unwrap_err();
    assert_eq!(refused.error().kind, ErrorKind::InsufficientScope);
    assert_eq!(refused.required_scopes(), ["admin"]);
    let admin = read(oauth_user(&["admin"]), "config://app/secr%65ts")
        .await
        .unwrap();
    assert_eq!(admin["contents"][0]["text"], "static");
    let public = read(oauth_user(&[]), "config://public/x").await.unwrap();
    assert_eq!(public["contents"][0]["text"], "public");
    let other = read(reader, "config://team/x").await.unwrap();
    assert_eq!(other["contents"][0]["text"], "template");

    let ambiguous = Server::builder(Implementation::new("t", "1"))
        .template(
            template("files://{owner}/{name}", "files")
                .scopes(&["files:{owner}-{name}"])
                .handler(served("files")),
        )
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(ambiguous.contains("between two variables"), "{ambiguous}");
}

/// A resource that needs scopes is read `private` whatever its own hints say: a shared
/// cache must not hand one holder's read to anyone else. One that needs none keeps them.
#[tokio::test]
async fn a_scoped_read_is_never_cached_publicly() {
    let public = wharf::protocol::CacheHints {
        ttl_ms: 60_000,
        cache_scope: wharf::protocol::CacheScope::Public,
    };
    let text = |_cx, req: wharf::ReadRequest| async move {
        Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
    };
    let s = Server::builder(Implementation::new("t", "1"))
        .resource(
            resource("notes://scoped", "scoped")
                .scopes(&[READ])
                .cache(public)
                .handler(text),
        )
        .resource(resource("notes://open", "open").cache(public).handler(text))
        .build()
        .unwrap();
    for (uri, scope) in [("notes://scoped", "private"), ("notes://open", "public")] {
        let read = Harness::new(s.clone())
            .principal(oauth_user(&[READ]))
            .call("resources/read", json!({ "uri": uri }))
            .await
            .unwrap();
        assert_eq!(read["cacheScope"], scope, "{uri}: {read}");
        assert_eq!(read["ttlMs"], 60_000, "{uri}: {read}");
    }
}
