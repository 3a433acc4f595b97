//! What the lists say of each definition: what its author described (a title, icons,
//! annotations, a size) is listed as described, in a result the 2026-07-28 schema accepts,
//! and an icon that is no URI fails the build instead of the list.

use serde_json::{Value, json};
use wharf::protocol::{Annotations, GetPromptResult, Icon, Implementation, PromptArgument, Role};
use wharf::testing::Harness;
use wharf::{BuildError, Context, NoArgs, ServerBuilder};
use wharf::{Server, prompt, resource, template, tool};

/// What breaks definition `def` of the vendored 2026-07-28 schema in `message`.
fn violations(def: &str, message: &Value) -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../spec/2026-07-28/schema.structural.json"
    );
    let mut schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    schema["$ref"] = json!(format!("#/$defs/{def}"));
    let validator = jsonschema::validator_for(&schema).unwrap();
    validator
        .iter_errors(message)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

/// The lists: each method, the schema's definition of its result, and the member holding
/// its items.
const LISTS: [(&str, &str, &str); 4] = [
    ("tools/list", "ListToolsResult", "tools"),
    ("prompts/list", "ListPromptsResult", "prompts"),
    ("resources/list", "ListResourcesResult", "resources"),
    (
        "resources/templates/list",
        "ListResourceTemplatesResult",
        "resourceTemplates",
    ),
];

/// The first item `method` lists, its whole result checked against the schema.
async fn first_listed(harness: &Harness, method: &str) -> Value {
    let (_, def, member) = LISTS.iter().find(|l| l.0 == method).unwrap();
    let listed = harness.call(method, json!({})).await.unwrap();
    let errors = violations(def, &listed);
    assert!(errors.is_empty(), "{method}: {errors:?}\n{listed}");
    listed[member][0].clone()
}

fn icon(src: &str) -> Icon {
    serde_json::from_value(json!({ "src": src, "mimeType": "image/png", "sizes": ["48x48"] }))
        .unwrap()
}

fn described(icons: Vec<Icon>) -> ServerBuilder {
    let annotations = Annotations {
        audience: Some(vec![Role::User]),
        priority: Some(0.25),
        last_modified: Some("2026-12-01T10:00:00Z".into()),
    };
    Server::builder(Implementation::new("t", "1"))
        .prompt(
            prompt("review")
                .title("Review a change")
                .argument_with(PromptArgument {
                    name: "pr".into(),
                    title: Some("Pull request".into()),
                    description: None,
                    required: Some(true),
                })
                .icons(icons.clone())
                .handler(|_cx, _args| async { Ok(GetPromptResult::default()) }),
        )
        .resource(
            resource("docs://readme", "readme")
                .title("The README")
                .size(1234)
                .annotations(annotations.clone())
                .icons(icons.clone())
                .handler(|_cx, _req| async { Ok(Vec::new()) }),
        )
        .template(
            template("docs://{name}", "doc")
                .title("A document")
                .annotations(annotations)
                .icons(icons)
                .handler(|_cx, _req| async { Ok(Vec::new()) }),
        )
}

#[tokio::test]
async fn a_definition_is_listed_as_its_author_described_it() {
    let server = described(vec![icon("https://example.com/a.png")])
        .build()
        .unwrap();
    let harness = Harness::new(server);
    // Tools have had these setters all along; the other three are checked here.
    for (method, _, _) in &LISTS[1..] {
        let item = first_listed(&harness, method).await;
        assert!(item["title"].is_string(), "{method}: {item}");
        assert_eq!(
            item["icons"],
            json!([{ "src": "https://example.com/a.png", "mimeType": "image/png", "sizes": ["48x48"] }]),
            "{method}"
        );
    }
    let resources = harness.call("resources/list", json!({})).await.unwrap();
    let readme = &resources["resources"][0];
    assert_eq!(readme["title"], "The README");
    assert_eq!(readme["size"], 1234);
    assert_eq!(
        readme["annotations"],
        json!({ "audience": ["user"], "priority": 0.25, "lastModified": "2026-12-01T10:00:00Z" })
    );
    let templates = harness
        .call("resources/templates/list", json!({}))
        .await
        .unwrap();
    assert_eq!(
        templates["resourceTemplates"][0]["annotations"]["audience"],
        json!(["user"])
    );
    let prompts = harness.call("prompts/list", json!({})).await.unwrap();
    assert_eq!(prompts["prompts"][0]["title"], "Review a change");
    assert_eq!(
        prompts["prompts"][0]["arguments"],
        json!([{ "name": "pr", "title": "Pull request", "required": true }])
    );
}

#[test]
fn an_icon_that_is_no_uri_fails_the_build() {
    // Each kind alone, so that the error names the one at fault.
    let bad = || vec![icon("https://example.com/a.png"), icon("a picture.png")];
    let builder = || Server::builder(Implementation::new("t", "1"));
    let kinds = [
        (
            "tool \"t\"",
            builder().tool(
                tool("t")
                    .icons(bad())
                    .handler(|_cx: Context, _: NoArgs| async { "x" }),
            ),
        ),
        (
            "prompt \"p\"",
            builder().prompt(
                prompt("p")
                    .icons(bad())
                    .handler(|_cx, _args| async { Ok(GetPromptResult::default()) }),
            ),
        ),
        (
            "resource \"docs://r\"",
            builder().resource(
                resource("docs://r", "r")
                    .icons(bad())
                    .handler(|_cx, _req| async { Ok(Vec::new()) }),
            ),
        ),
        (
            "resource template \"docs://{n}\"",
            builder().template(
                template("docs://{n}", "n")
                    .icons(bad())
                    .handler(|_cx, _req| async { Ok(Vec::new()) }),
            ),
        ),
    ];
    for (whose, builder) in kinds {
        match builder.build() {
            Err(e @ BuildError::NotAUri { .. }) => {
                let said = e.to_string();
                assert!(
                    said.starts_with(whose) && said.contains("\"a picture.png\" is not a URI"),
                    "{said}"
                );
            }
            Err(e) => panic!("{whose}: {e}"),
            Ok(_) => panic!("{whose}: built with an icon that is no URI"),
        }
    }
}

fn object(value: Value) -> wharf::protocol::JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

#[tokio::test]
async fn meta_and_extensions_are_declared_as_given() {
    let meta = || object(json!({ "com.example/ui": { "resourceUri": "ui://orders" } }));
    let server = Server::builder(Implementation::new("t", "1"))
        .extension("com.example/orders-ui", object(json!({ "version": 2 })))
        .tool(
            tool("t")
                .meta(meta())
                .handler(|_cx: Context, _: NoArgs| async { "x" }),
        )
        .prompt(
            prompt("p")
                .meta(meta())
                .handler(|_cx, _args| async { Ok(GetPromptResult::default()) }),
        )
        .resource(
            resource("docs://r", "r")
                .meta(meta())
                .handler(|_cx, _req| async { Ok(Vec::new()) }),
        )
        .template(
            template("docs://{n}", "n")
                .meta(meta())
                .handler(|_cx, _req| async { Ok(Vec::new()) }),
        )
        .build()
        .unwrap();
    let harness = Harness::new(server);
    for (method, _, _) in LISTS {
        let item = first_listed(&harness, method).await;
        assert_eq!(item["_meta"], Value::Object(meta()), "{method}");
    }
    let discovered = harness.call("server/discover", json!({})).await.unwrap();
    let errors = violations("DiscoverResult", &discovered);
    assert!(errors.is_empty(), "{errors:?}\n{discovered}");
    assert_eq!(
        discovered["capabilities"]["extensions"],
        json!({ "com.example/orders-ui": { "version": 2 } })
    );
}

#[test]
fn a_meta_key_or_extension_name_the_specification_does_not_allow_fails_the_build() {
    let builder = || Server::builder(Implementation::new("t", "1"));
    let with_meta = |key: &str| {
        builder()
            .tool(
                tool("t")
                    .meta(object(json!({ key: 1 })))
                    .handler(|_cx: Context, _: NoArgs| async { "x" }),
            )
            .build()
    };
    for bad in [
        "example.com/-x",
        "9lives/x",
        "a b",
        "com..example/x",
        "x-",
        "",
    ] {
        match with_meta(bad) {
            Err(BuildError::MetaKey { whose, key }) => {
                assert_eq!((whose.as_str(), key.as_str()), ("tool \"t\"", bad));
            }
            other => panic!("{bad}: {:?}", other.err()),
        }
    }
    for good in ["com.example/ui", "progressToken", "com.example/", "x.y-z_1"] {
        assert!(with_meta(good).is_ok(), "{good}");
    }
    // An extension's name needs a prefix.
    for (name, ok) in [("com.example/x", true), ("orders", false), ("a b/x", false)] {
        let built = builder().extension(name, object(json!({}))).build();
        assert_eq!(built.is_ok(), ok, "{name}: {:?}", built.err());
    }
}

#[tokio::test]
async fn a_declared_output_schema_holds_a_handler_that_makes_its_own_results() {
    use wharf::protocol::{CallToolResult, Content};

    let schema = object(json!({
        "type": "object",
        "properties": { "total": { "type": "integer" } },
        "required": ["total"]
    }));
    // Gives back as structuredContent what its arguments hold under "give", if anything.
    let handler = |_cx, args: wharf::protocol::JsonObject| async move {
        let mut result = CallToolResult::success(vec![Content::text("done")]);
        result.structured_content = args.get("give").cloned();
        result
    };
    let anything = object(json!({ "type": "object" }));
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(
            tool("sum")
                .output_schema(schema.clone())
                .raw_handler(anything.clone(), handler),
        )
        .tool(
            tool("any")
                .output_schema(anything.clone())
                .raw_handler(anything, handler),
        )
        .build()
        .unwrap();
    let harness = Harness::new(server);
    let listed = harness.call("tools/list", json!({})).await.unwrap();
    assert_eq!(listed["tools"][0]["outputSchema"], Value::Object(schema));
    let call = |arguments: Value| {
        harness.call(
            "tools/call",
            json!({ "name": "sum", "arguments": arguments }),
        )
    };
    let fine = call(json!({ "give": { "total": 3 } })).await.unwrap();
    assert_eq!(fine["structuredContent"], json!({ "total": 3 }));
    // The detail goes to the log; the client learns only that the call failed. A schema
    // that accepts any object still wants one.
    for (tool, arguments) in [
        ("sum", json!({ "give": { "total": "three" } })),
        ("sum", json!({})),
        ("any", json!({ "give": "x" })),
        ("any", json!({})),
    ] {
        let e = harness
            .call(
                "tools/call",
                json!({ "name": tool, "arguments": arguments }),
            )
            .await
            .unwrap_err();
        assert_eq!(
            e.error().kind,
            wharf::ErrorKind::Internal,
            "{tool} {arguments}"
        );
        assert_eq!(e.error().message, "Internal error", "{tool} {arguments}");
    }
    let any = harness
        .call(
            "tools/call",
            json!({ "name": "any", "arguments": { "give": {} } }),
        )
        .await
        .unwrap();
    assert_eq!(any["structuredContent"], json!({}));
}
