//! Over stdio too, a completion needs the scopes of its prompt and a `subscriptions/listen`
//! those of each resource it subscribes to, when the process acts for an OAuth principal.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use wharf::protocol::{Completion, GetPromptResult, Implementation, ResourceContents};
use wharf::{HandlerError, Server, prompt, resource};
use wharf_stdio::{StdioConfig, serve_with};

fn server() -> Server {
    Server::builder(Implementation::new("t", "1"))
        .prompt(
            prompt("summary")
                .argument("note", "Which note", true)
                .scopes(&["notes:read"])
                .completer(|_cx, _arg, _ctx| async {
                    Ok::<_, HandlerError>(Completion {
                        values: vec!["secret-name".into()],
                        ..Default::default()
                    })
                })
                .handler(|_cx, _args| async { Ok(GetPromptResult::default()) }),
        )
        .resource(
            resource("notes://index", "index")
                .scopes(&["notes:read"])
                .handler(|_cx, req| async move {
                    Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
                }),
        )
        .build()
        .unwrap()
}

fn meta() -> Value {
    json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {} })
}

#[tokio::test]
async fn completions_and_subscriptions_need_the_scopes_of_their_targets() {
    let principal = wharf::testing::oauth_user(&[]);
    let (mut to_server, server_in) = tokio::io::duplex(64 * 1024);
    let (server_out, from_server) = tokio::io::duplex(64 * 1024);
    let mut config = StdioConfig::default();
    config.principal = principal;
    let served = tokio::spawn(serve_with(server(), server_in, server_out, config));
    let requests = [
        json!({ "jsonrpc": "2.0", "id": 1, "method": "completion/complete", "params": {
            "_meta": meta(), "ref": { "type": "ref/prompt", "name": "summary" },
            "argument": { "name": "note", "value": "" } } }),
        json!({ "jsonrpc": "2.0", "id": 2, "method": "subscriptions/listen", "params": {
            "_meta": meta(), "notifications": { "resourceSubscriptions": ["notes://index"] } } }),
    ];
    for r in &requests {
        to_server
            .write_all(format!("{r}\n").as_bytes())
            .await
            .unwrap();
    }
    let mut lines = BufReader::new(from_server).lines();
    let mut refused = Vec::new();
    for _ in &requests {
        let line = lines.next_line().await.unwrap().expect("an answer");
        let m: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(m["error"]["code"], -31003, "{m}");
        assert_eq!(
            m["error"]["data"]["requiredScopes"],
            json!(["notes:read"]),
            "{m}"
        );
        refused.push(m["id"].as_i64().unwrap());
    }
    refused.sort_unstable();
    assert_eq!(refused, [1, 2]);
    drop(to_server);
    served.await.unwrap().unwrap();
}
