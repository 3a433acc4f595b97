//! What a request reaches through another method needs the same scopes as a direct call: a
//! completion those of its prompt or template (a completer lists their values), a
//! `subscriptions/listen` those of each resource it subscribes to (it learns when they
//! change). In-process, with OAuth principals.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::value::RawValue;
use serde_json::{Value, json};
use wharf::protocol::{Completion, GetPromptResult, Implementation, RequestId, ResourceContents};
use wharf::{
    ErrorKind, Grant, ParsedRequest, Principal, RpcError, Scope, Server, prompt, resource, template,
};

const READ: &str = "notes:read";

fn server(completions: &Arc<AtomicUsize>) -> Server {
    let completer = |n: &Arc<AtomicUsize>| {
        let n = Arc::clone(n);
        move |_cx, _arg, _ctx| {
            n.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, RpcError>(Completion {
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
        .resource(resource("notes://index", "index").scopes(&[READ]).handler(
            |_cx, req| async move { Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")]) },
        ))
        .build()
        .unwrap()
}

fn token(scopes: &[&str]) -> Principal {
    Principal::oauth(Grant {
        issuer: "https://as.example.com".into(),
        subject: "alice".into(),
        client_id: None,
        scopes: scopes
            .iter()
            .map(|s| (*s).to_owned())
            .collect::<BTreeSet<_>>(),
    })
}

fn request(server: &Server, method: &str, params: Value) -> ParsedRequest {
    let mut params = params;
    params["_meta"] = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {} });
    let params = RawValue::from_string(params.to_string()).unwrap();
    server
        .parse_request(RequestId::Int(1), method, Some(&params))
        .map_err(|(e, _)| e)
        .unwrap()
}

fn completion(reference: Value) -> Value {
    json!({ "ref": reference, "argument": { "name": "note", "value": "" } })
}

async fn complete(server: &Server, who: &Principal, reference: Value) -> Result<Value, RpcError> {
    let scope = Scope {
        principal: who.clone(),
        cancel: None,
        outbox: None,
    };
    let body = server
        .execute(
            request(server, "completion/complete", completion(reference)),
            scope,
        )
        .await?;
    Ok(serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn a_completion_needs_the_scopes_of_its_prompt_or_template() {
    let completions = Arc::new(AtomicUsize::new(0));
    let s = server(&completions);
    let prompt_ref = json!({ "type": "ref/prompt", "name": "summary" });
    let template_ref = json!({ "type": "ref/resource", "uri": "notes://{id}" });
    for reference in [&prompt_ref, &template_ref] {
        let refused = complete(&s, &token(&[]), reference.clone())
            .await
            .unwrap_err();
        assert_eq!(refused.kind, ErrorKind::InsufficientScope, "{reference}");
        assert_eq!(refused.data.unwrap()["requiredScopes"], json!([READ]));
    }
    assert_eq!(completions.load(Ordering::SeqCst), 0, "no completer ran");

    // With the scope (a template's per-item scopes name no item yet, so they do not apply).
    for reference in [prompt_ref, template_ref] {
        let done = complete(&s, &token(&[READ]), reference).await.unwrap();
        assert_eq!(
            done["result"]["completion"]["values"],
            json!(["secret-name"])
        );
    }
    // Principals not limited by scopes are not limited here either.
    let anonymous = complete(
        &s,
        &Principal::anonymous(),
        json!({ "type": "ref/prompt", "name": "summary" }),
    )
    .await
    .unwrap();
    assert_eq!(
        anonymous["result"]["completion"]["values"],
        json!(["secret-name"])
    );
    assert_eq!(completions.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_subscription_needs_the_scopes_of_each_resource() {
    let s = server(&Arc::new(AtomicUsize::new(0)));
    let listen = |uris: &[&str]| {
        request(
            &s,
            "subscriptions/listen",
            json!({ "notifications": { "toolsListChanged": true, "resourceSubscriptions": uris } }),
        )
    };
    let reader = token(&[READ]);
    // A fixed resource, and a template's item with its own scope.
    let refused = s
        .admit(&listen(&["notes://index"]), &token(&[]))
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::InsufficientScope);
    let refused = s.admit(&listen(&["notes://7"]), &reader).unwrap_err();
    assert_eq!(refused.kind, ErrorKind::InsufficientScope);
    assert_eq!(
        refused.data.unwrap()["requiredScopes"],
        json!([READ, "notes:item:7"])
    );
    // Allowed: what the token may read, and list changes, which need no scope.
    s.admit(
        &listen(&["notes://index", "notes://7"]),
        &token(&[READ, "notes:item:7"]),
    )
    .unwrap();
    s.admit(&listen(&[]), &token(&[])).unwrap();
}
