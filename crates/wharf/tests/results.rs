//! What the methods answer, in-process: arguments the model got wrong come back as a tool
//! execution error it can read and correct, a prompt's result is complete whatever its
//! handler left in `resultType`, and a tools/list cursor filtered for one grant is no
//! position in another grant's list.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use wharf::protocol::{GetPromptResult, Implementation, ResultType};
use wharf::testing::{Harness, oauth_user};
use wharf::{Context, ErrorKind, Principal, Server, ServerConfig, prompt, tool};

#[derive(serde::Deserialize, wharf::schemars::JsonSchema)]
struct Greet {
    /// Who to greet.
    name: String,
    /// How many times.
    times: u8,
}

#[tokio::test]
async fn arguments_that_break_the_schema_are_an_error_the_model_reads() {
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&ran);
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("greet").handler(move |_cx: Context, args: Greet| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move { format!("hello {} x{}", args.name, args.times) }
        }))
        .build()
        .unwrap();
    let harness = Harness::new(server);
    let call = |arguments: Value| {
        harness.call(
            "tools/call",
            json!({ "name": "greet", "arguments": arguments }),
        )
    };
    for (arguments, place) in [
        (json!({ "name": "ada", "times": "twice" }), "/times"),
        (json!({ "name": "ada", "times": 300 }), "/times"),
        (json!({ "times": 1 }), "name"),
    ] {
        let result = call(arguments.clone()).await.unwrap();
        assert_eq!(result["isError"], true, "{arguments}: {result}");
        assert_eq!(result["resultType"], "complete");
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(
            text.starts_with("Invalid arguments for tool greet: ") && text.contains(place),
            "{arguments}: {text}"
        );
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never ran");
    let fine = call(json!({ "name": "ada", "times": 2 })).await.unwrap();
    assert_eq!(fine["content"][0]["text"], "hello ada x2");
    // An unknown tool is still a protocol error: nothing the model sent names a tool.
    let unknown = harness
        .call("tools/call", json!({ "name": "nope", "arguments": {} }))
        .await
        .unwrap_err();
    assert_eq!(unknown.error().kind, ErrorKind::InvalidParams);
}

#[tokio::test]
async fn a_handler_sends_only_the_codes_it_may() {
    use wharf::protocol::ClientCapabilities;
    use wharf::{HandlerError, RpcError};
    let answers = || -> Vec<RpcError> {
        vec![
            RpcError::new(ErrorKind::Application(-32042), "a code MCP reserves"),
            RpcError::new(ErrorKind::Application(-32050), "undefined in MCP's range"),
            RpcError::new(ErrorKind::Application(-32000), "JSON-RPC's server range"),
            RpcError::header_mismatch("not the handler's to say"),
            RpcError::unsupported_version("2099-01-01", &["2026-07-28"]),
            RpcError::new(ErrorKind::MissingCapability, "without the data it needs"),
            RpcError::new(ErrorKind::Parse, "the request reached the handler whole"),
            RpcError::new(
                ErrorKind::InvalidRequest,
                "the request reached the handler whole",
            ),
            RpcError::method_not_found("tools/call"),
            RpcError::new(
                ErrorKind::MalformedMeta,
                "_meta was read before the handler ran",
            ),
            RpcError::new(ErrorKind::Application(-31999), "the application's own"),
            RpcError::new(ErrorKind::Application(7), "the application's own"),
            RpcError::missing_capability(&ClientCapabilities::default(), "this tool"),
            RpcError::invalid_params("bad input"),
        ]
    };
    let count = answers().len();
    let mut builder = Server::builder(Implementation::new("t", "1"));
    for i in 0..count {
        builder = builder.tool(tool(format!("t{i}")).handler(
            move |_cx: Context, _args: serde_json::Map<String, Value>| async move {
                Err::<String, _>(HandlerError::from(answers().swap_remove(i)))
            },
        ));
    }
    let harness = Harness::new(builder.build().unwrap());
    for (i, sent) in answers().into_iter().enumerate() {
        let got = harness
            .call(
                "tools/call",
                json!({ "name": format!("t{i}"), "arguments": {} }),
            )
            .await
            .unwrap_err();
        let got = got.error();
        let reserved = i < 10;
        if reserved {
            assert_eq!(got.kind, ErrorKind::Internal, "{sent:?} became {got:?}");
            assert_eq!(got.message, "Internal error");
            assert_eq!(got.data, None);
        } else {
            assert_eq!(got, &sent, "sent as it was");
        }
    }
}

/// What a handler or the server's author makes is sent only if every URI in it is one
/// (the schemas hold each to `format: uri`): a handler's is a -32603, an author's fails the
/// build.
#[tokio::test]
async fn every_uri_the_server_sends_is_a_uri() {
    use wharf::protocol::{Content, Icon, ResourceContents};
    use wharf::{BuildError, resource};
    fn link(uri: &str) -> Content {
        let (uri, icon) = uri
            .split_once(' ')
            .unwrap_or((uri, "https://x.example/i.png"));
        serde_json::from_value(json!({ "type": "resource_link", "uri": uri, "name": "n",
            "icons": [{ "src": icon }] }))
        .unwrap()
    }
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(
            tool("links").handler(|_cx: Context, args: serde_json::Map<String, Value>| {
                let uri = args["uri"].as_str().unwrap_or_default().to_owned();
                async move { vec![link(&uri)] }
            }),
        )
        .tool(
            tool("embeds").handler(|_cx: Context, _: wharf::NoArgs| async {
                Content::resource(ResourceContents::text("no uri at all", "text/plain", "x"))
            }),
        )
        .resource(resource("notes://a", "a").handler(|_cx, _req| async {
            Ok(vec![ResourceContents::text(
                "notes://a b",
                "text/plain",
                "x",
            )])
        }))
        .build()
        .unwrap();
    let harness = Harness::new(server);
    let fine = harness
        .call(
            "tools/call",
            json!({ "name": "links", "arguments": { "uri": "notes://a%20b" } }),
        )
        .await
        .unwrap();
    assert_eq!(fine["content"][0]["uri"], "notes://a%20b");
    for (method, params) in [
        (
            "tools/call",
            json!({ "name": "links", "arguments": { "uri": "echo://a:b" } }),
        ),
        // A link whose icon is no URI.
        (
            "tools/call",
            json!({ "name": "links", "arguments": { "uri": "notes://a icon.png" } }),
        ),
        ("tools/call", json!({ "name": "embeds", "arguments": {} })),
        ("resources/read", json!({ "uri": "notes://a" })),
    ] {
        let e = harness.call(method, params.clone()).await.unwrap_err();
        assert_eq!(e.error().kind, ErrorKind::Internal, "{params}");
    }

    let icon: Icon = serde_json::from_value(json!({ "src": "a picture.png" })).unwrap();
    let mut info = Implementation::new("t", "1");
    info.website_url = Some("example.com".into());
    let e = Server::builder(info).build().unwrap_err();
    assert!(
        matches!(&e, BuildError::NotAUri { uri, .. } if uri == "example.com"),
        "{e}"
    );
    let mut info = Implementation::new("t", "1");
    info.icons = Some(vec![icon.clone()]);
    assert!(Server::builder(info).build().is_err());
    let e = Server::builder(Implementation::new("t", "1"))
        .tool(
            tool("t")
                .icons(vec![icon])
                .handler(|_cx: Context, _: wharf::NoArgs| async { "x" }),
        )
        .build()
        .unwrap_err();
    assert!(
        e.to_string().contains("\"a picture.png\" is not a URI"),
        "{e}"
    );
}

#[tokio::test]
async fn a_prompts_result_is_complete_whatever_its_handler_set() {
    let server = Server::builder(Implementation::new("t", "1"))
        .prompt(prompt("odd").handler(|_cx, _args| async {
            Ok(GetPromptResult {
                result_type: ResultType::InputRequired,
                ..Default::default()
            })
        }))
        .build()
        .unwrap();
    let got = Harness::new(server)
        .call("prompts/get", json!({ "name": "odd" }))
        .await
        .unwrap();
    assert_eq!(got["resultType"], "complete", "{got}");
}

#[tokio::test]
async fn a_filtered_tools_list_cursor_belongs_to_its_grant() {
    let mut config = ServerConfig::default();
    config.page_size = 1;
    config.list_permitted_tools_only = true;
    let mut builder = Server::builder(Implementation::new("t", "1")).config(config);
    for (name, scope) in [("a", "x"), ("b", "y"), ("c", "x")] {
        builder = builder.tool(
            tool(name)
                .scopes(&[scope])
                .handler(|_cx: Context, _: wharf::NoArgs| async { "ok" }),
        );
    }
    let server = builder.build().unwrap();
    let list = |who: Principal, cursor: Option<Value>| {
        let harness = Harness::new(server.clone()).principal(who);
        let params = cursor.map_or_else(|| json!({}), |c| json!({ "cursor": c }));
        async move { harness.call("tools/list", params).await }
    };
    let first = list(oauth_user(&["x"]), None).await.unwrap();
    assert_eq!(first["tools"][0]["name"], "a");
    let cursor = first["nextCursor"].clone();
    let second = list(oauth_user(&["x"]), Some(cursor.clone()))
        .await
        .unwrap();
    assert_eq!(second["tools"][0]["name"], "c");
    // The same cursor under another grant would skip or repeat tools: refused as stale.
    let other = list(oauth_user(&["x", "y"]), Some(cursor))
        .await
        .unwrap_err();
    assert_eq!(other.error().kind, ErrorKind::InvalidParams, "{other:?}");
}
