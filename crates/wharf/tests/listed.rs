//! What the lists say of each definition: what its author described (a title, icons,
//! annotations, a size) is listed as described, in a result the 2026-07-28 schema accepts,
//! and an icon that is no URI fails the build instead of the list.

use serde_json::{Value, json};
use wharf::protocol::{Annotations, GetPromptResult, Icon, Implementation, Role};
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
    for (method, def, member) in [
        ("prompts/list", "ListPromptsResult", "prompts"),
        ("resources/list", "ListResourcesResult", "resources"),
        (
            "resources/templates/list",
            "ListResourceTemplatesResult",
            "resourceTemplates",
        ),
    ] {
        let listed = harness.call(method, json!({})).await.unwrap();
        let errors = violations(def, &listed);
        assert!(errors.is_empty(), "{method}: {errors:?}\n{listed}");
        let item = &listed[member][0];
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
