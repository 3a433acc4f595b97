//! Exactly the fixtures the official conformance suite (`@modelcontextprotocol/conformance`
//! 0.2.0-alpha.12) calls. Texts follow the suite's fixture list.
//!
//! Order matters: the suite's header-validation scenario calls the first listed tool with
//! `{}`, and the custom-header scenario uses the first tool with an `x-mcp-header`.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use wharf::{
    ChangeEvent, Context, Elicited, FormSchema, HandlerError, NoArgs, RpcError, ServerBuilder,
    StringFormat, prompt, resource, template, tool,
};
use wharf_protocol::{
    CallToolResult, ClientCapabilities, Completion, Content, CreateMessageParams, GetPromptResult,
    JsonObject, LoggingLevel, PromptMessage, ResourceContents, SamplingCapability,
};

/// The scopes of the suite's scope-challenge scenario (SEP-2350, `sep-2350-server-scope-challenge`):
/// a token with only `mcp:conformance:baseline` is refused these four fixtures (HTTP 403 and a
/// challenge naming both of their scopes); anonymous runs and API keys are not limited by
/// scopes, so the other scenarios are unaffected.
pub const TOOLS_CALL: &str = "mcp:conformance:tools:call";
/// See [`TOOLS_CALL`].
pub const RESOURCES_READ: &str = "mcp:conformance:resources:read";
/// See [`TOOLS_CALL`].
pub const PROMPTS_GET: &str = "mcp:conformance:prompts:get";

/// A 1×1 transparent PNG.
pub const PNG_1X1: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";
/// A tiny silent WAV file.
pub const WAV_SILENCE: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEARKwAAIhYAQACABAAZGF0YQAAAAA=";

/// Arguments of the custom-header fixture.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RegionArgs {
    /// Mirrored into the `Mcp-Param-Region` header.
    #[schemars(extend("x-mcp-header" = "Region"))]
    pub region: String,
}

#[derive(Deserialize)]
struct NameAnswer {
    name: String,
}

#[derive(Deserialize)]
struct ColorAnswer {
    color: String,
}

#[derive(Deserialize)]
struct ConfirmAnswer {
    ok: bool,
}

#[derive(Deserialize)]
struct ContextAnswer {
    context: String,
}

/// Arguments of `test_sampling`.
#[derive(Deserialize, JsonSchema)]
struct PromptArgs {
    /// What to ask the client's model.
    prompt: String,
}

/// Arguments of `test_elicitation`.
#[derive(Deserialize, JsonSchema)]
struct MessageArgs {
    /// What to tell the user.
    message: String,
}

/// Asks the client's model (`sampling/createMessage`; a server request in a legacy session).
async fn sample_prompt(cx: Context, a: PromptArgs) -> Result<CallToolResult, HandlerError> {
    match cx.sampled("answer") {
        Some(r) => Ok(CallToolResult::text(format!(
            "LLM response: {}",
            answer_text(&r)
        ))),
        None => Err(cx.ask().sample("answer", question(&a.prompt)?).into()),
    }
}

/// What the user answered `form`, as text.
fn elicited_text(cx: &Context, key: &str, form: &FormSchema) -> Option<String> {
    cx.elicited::<JsonObject>(key, form)
        .map(|answer| match answer {
            Elicited::Accepted(content) => {
                format!("User accepted: {}", serde_json::Value::Object(content))
            }
            other => format!("User did not accept: {other:?}"),
        })
}

async fn elicitation(cx: Context, a: MessageArgs) -> Result<CallToolResult, HandlerError> {
    let form = FormSchema::new()
        .string("username", "Your username", true)
        .formatted("email", "Your email address", StringFormat::Email, true);
    if let Some(text) = elicited_text(&cx, "info", &form) {
        return Ok(CallToolResult::text(text));
    }
    Err(cx.ask().elicit("info", a.message, form).into())
}

/// A form whose every field has a default (SEP-1034).
async fn elicitation_defaults(cx: Context, _a: NoArgs) -> Result<CallToolResult, HandlerError> {
    let form = FormSchema::new()
        .string("name", "User name", false)
        .with_default("name", "John Doe")
        .integer("age", "User age", (None, None), false)
        .with_default("age", 30)
        .number("score", "User score", (None, None), false)
        .with_default("score", 95.5)
        .choice(
            "status",
            "User status",
            &["active", "inactive", "pending"],
            false,
        )
        .with_default("status", "active")
        .boolean("verified", "Verification status", false)
        .with_default("verified", true);
    if let Some(text) = elicited_text(&cx, "form", &form) {
        return Ok(CallToolResult::text(text));
    }
    let message = "Please review and update the form fields with defaults";
    Err(cx.ask().elicit("form", message, form).into())
}

/// A form of every kind of choice (SEP-1330).
async fn elicitation_enums(cx: Context, _a: NoArgs) -> Result<CallToolResult, HandlerError> {
    let options = ["option1", "option2", "option3"];
    let titled = [
        ("value1", "First Option"),
        ("value2", "Second Option"),
        ("value3", "Third Option"),
    ];
    let form = FormSchema::new()
        .choice("untitledSingle", "Select one option", &options, false)
        .titled_choice(
            "titledSingle",
            "Select one option with titles",
            &titled,
            false,
        )
        .named_choice(
            "legacyEnum",
            "Select one option (legacy)",
            &["opt1", "opt2", "opt3"],
            &["Option One", "Option Two", "Option Three"],
            false,
        )
        .multi_choice(
            "untitledMulti",
            "Select multiple options",
            &options,
            (Some(1), Some(3)),
            false,
        )
        .titled_multi_choice(
            "titledMulti",
            "Select multiple options with titles",
            &titled,
            (Some(1), Some(3)),
            false,
        );
    if let Some(text) = elicited_text(&cx, "form", &form) {
        return Ok(CallToolResult::text(text));
    }
    let message = "Please select options from the enum fields";
    Err(cx.ask().elicit("form", message, form).into())
}

fn confirm_form() -> FormSchema {
    FormSchema::new().boolean("ok", "Confirm", true)
}

fn color_form() -> FormSchema {
    FormSchema::new().string("color", "A colour", true)
}

fn name_form() -> FormSchema {
    FormSchema::new().string("name", "Your name", true)
}

fn question(text: &str) -> Result<CreateMessageParams, HandlerError> {
    serde_json::from_value(json!({
        "messages": [{ "role": "user", "content": { "type": "text", "text": text } }],
        "maxTokens": 100
    }))
    .map_err(HandlerError::internal)
}

/// The text of a sampled answer, as far as it is text.
fn answer_text(result: &wharf_protocol::CreateMessageResult) -> String {
    serde_json::to_value(&result.content)
        .ok()
        .and_then(|c| c.get("text").and_then(|t| t.as_str()).map(str::to_owned))
        .unwrap_or_else(|| "(no text)".to_owned())
}

async fn mrtr_elicitation(cx: Context, _a: JsonObject) -> Result<CallToolResult, HandlerError> {
    match cx.elicited::<NameAnswer>("user_name", &name_form()) {
        Some(Elicited::Accepted(a)) => Ok(CallToolResult::text(format!("Hello, {}!", a.name))),
        Some(_) => Ok(CallToolResult::text("The user did not give a name.")),
        None => Err(cx
            .ask()
            .elicit("user_name", "What is your name?", name_form())
            .into()),
    }
}

async fn mrtr_sampling(cx: Context, _a: JsonObject) -> Result<CallToolResult, HandlerError> {
    match cx.sampled("capital") {
        Some(r) => Ok(CallToolResult::text(format!(
            "The model answered: {}",
            answer_text(&r)
        ))),
        None => Err(cx
            .ask()
            .sample("capital", question("What is the capital of France?")?)
            .into()),
    }
}

async fn mrtr_roots(cx: Context, _a: JsonObject) -> Result<CallToolResult, HandlerError> {
    match cx.roots("roots") {
        Some(r) => {
            let uris: Vec<_> = r.roots.iter().map(|root| root.uri.as_str()).collect();
            Ok(CallToolResult::text(format!(
                "The client has {} roots: {}",
                uris.len(),
                uris.join(", ")
            )))
        }
        None => Err(cx.ask().list_roots("roots").into()),
    }
}

#[derive(serde::Serialize, Deserialize)]
struct Step {
    step: String,
}

async fn mrtr_request_state(cx: Context, _a: JsonObject) -> Result<CallToolResult, HandlerError> {
    let state = cx.round_state::<Step>();
    match (
        cx.elicited::<ConfirmAnswer>("confirm", &confirm_form()),
        state,
    ) {
        (Some(Elicited::Accepted(a)), Some(s)) if s.step == "confirm" => Ok(CallToolResult::text(
            format!("state-ok: the state came back intact; confirmed: {}", a.ok),
        )),
        (Some(Elicited::Declined | Elicited::Cancelled), Some(_)) => {
            Ok(CallToolResult::text("state-ok: not confirmed"))
        }
        _ => Err(cx
            .ask()
            .elicit("confirm", "Do you confirm?", confirm_form())
            .state(&Step {
                step: "confirm".into(),
            })
            .into()),
    }
}

async fn mrtr_multiple(cx: Context, _a: JsonObject) -> Result<CallToolResult, HandlerError> {
    let name = cx.elicited::<NameAnswer>("user_name", &name_form());
    let sampled = cx.sampled("capital");
    let roots = cx.roots("roots");
    if let (Some(name), Some(sampled), Some(roots)) = (name, sampled, roots) {
        let name = match name {
            Elicited::Accepted(a) => a.name,
            _ => "(declined)".into(),
        };
        return Ok(CallToolResult::text(format!(
            "All inputs received: name {name}; the model said {}; {} roots",
            answer_text(&sampled),
            roots.roots.len()
        )));
    }
    Err(cx
        .ask()
        .elicit("user_name", "What is your name?", name_form())
        .sample("capital", question("What is the capital of France?")?)
        .list_roots("roots")
        .state(&Step { step: "all".into() })
        .into())
}

async fn mrtr_multi_round(cx: Context, _a: JsonObject) -> Result<CallToolResult, HandlerError> {
    let step = cx.round_state::<Step>().map(|s| s.step);
    match step.as_deref() {
        Some("color") => {
            let name = cx
                .round_state::<serde_json::Value>()
                .and_then(|s| s.get("name").and_then(|n| n.as_str()).map(str::to_owned))
                .unwrap_or_default();
            match cx.elicited::<ColorAnswer>("color", &color_form()) {
                Some(Elicited::Accepted(c)) => {
                    Ok(CallToolResult::text(format!("{name} likes {}", c.color)))
                }
                Some(_) => Ok(CallToolResult::text(format!("{name} gave no colour"))),
                None => Err(ask_color(&cx, &name).into()),
            }
        }
        _ => match cx.elicited::<NameAnswer>("name", &name_form()) {
            Some(Elicited::Accepted(a)) => Err(ask_color(&cx, &a.name).into()),
            Some(_) => Ok(CallToolResult::text("The user did not give a name.")),
            None => Err(cx
                .ask()
                .elicit("name", "Step 1: what is your name?", name_form())
                .state(&Step {
                    step: "name".into(),
                })
                .into()),
        },
    }
}

fn ask_color(cx: &Context, name: &str) -> wharf::Ask {
    cx.ask()
        .elicit(
            "color",
            "Step 2: what is your favourite colour?",
            color_form(),
        )
        .state(&json!({ "step": "color", "name": name }))
}

async fn mrtr_capabilities(cx: Context, _a: JsonObject) -> Result<CallToolResult, HandlerError> {
    if cx.round() > 0 {
        return Ok(CallToolResult::text("Inputs received"));
    }
    Err(cx
        .ask()
        .elicit("user_name", "What is your name?", name_form())
        .sample("capital", question("What is the capital of France?")?)
        .into())
}

fn json_schema_2020_12() -> JsonObject {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {
            "address": {
                "$anchor": "addressDef",
                "type": "object",
                "properties": { "street": { "type": "string" }, "city": { "type": "string" } }
            }
        },
        "properties": {
            "name": { "type": "string" },
            "address": { "$ref": "#/$defs/address" },
            "contactMethod": { "type": "string", "enum": ["phone", "email"] },
            "phone": { "type": "string" },
            "email": { "type": "string" }
        },
        "allOf": [ { "anyOf": [ { "required": ["phone"] }, { "required": ["email"] } ] } ],
        "if": { "properties": { "contactMethod": { "const": "phone" } }, "required": ["contactMethod"] },
        "then": { "required": ["phone"] },
        "else": { "required": ["email"] },
        "additionalProperties": false
    });
    schema.as_object().cloned().unwrap_or_default()
}

/// Registers the conformance fixtures.
pub fn register(builder: ServerBuilder) -> ServerBuilder {
    let sampling = ClientCapabilities {
        sampling: Some(SamplingCapability::default()),
        ..Default::default()
    };
    builder
        .tool(tool("test_simple_text").description("Returns a simple text response.").scopes(&[TOOLS_CALL, "mcp:conformance:tools:test_simple_text"]).handler(
            |_cx: Context, _a: NoArgs| async move { "This is a simple text response for testing." },
        ))
        .tool(tool("test_header_param").description("Echoes its region argument, mirrored in the Mcp-Param-Region header.").handler(
            |_cx: Context, a: RegionArgs| async move { format!("region: {}", a.region) },
        ))
        .tool(tool("test_image_content").description("Returns an image.").handler(|_cx: Context, _a: NoArgs| async move {
            Content::image(PNG_1X1, "image/png")
        }))
        .tool(tool("test_audio_content").description("Returns audio.").handler(|_cx: Context, _a: NoArgs| async move {
            Content::audio(WAV_SILENCE, "audio/wav")
        }))
        .tool(tool("test_embedded_resource").description("Returns an embedded resource.").handler(
            |_cx: Context, _a: NoArgs| async move {
                Content::resource(ResourceContents::text(
                    "test://embedded-resource",
                    "text/plain",
                    "This is an embedded resource content.",
                ))
            },
        ))
        .tool(tool("test_multiple_content_types").description("Returns text, an image and a resource.").handler(
            |_cx: Context, _a: NoArgs| async move {
                vec![
                    Content::text("Multiple content types test:"),
                    Content::image(PNG_1X1, "image/png"),
                    Content::resource(ResourceContents::text(
                        "test://mixed-content-resource",
                        "application/json",
                        r#"{"test":"data","value":123}"#,
                    )),
                ]
            },
        ))
        .tool(tool("test_error_handling").description("Always fails with a tool execution error.").handler(
            |_cx: Context, _a: NoArgs| async move {
                Err::<CallToolResult, _>(HandlerError::execution("This tool intentionally returns an error for testing"))
            },
        ))
        .tool(tool("test_tool_with_progress").description("Reports progress 0, 50, 100 of 100, about 50 ms apart.").handler(
            |cx: Context, _a: NoArgs| async move {
                for (i, p) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    cx.progress(p, Some(100.0), Some(&format!("{p} of 100"))).await;
                }
                "Progress test completed"
            },
        ))
        .tool(tool("test_logging_tool").description("Logs three messages (only when the request asks for logs).").handler(
            |cx: Context, _a: NoArgs| async move {
                for i in 1..=3 {
                    cx.log(LoggingLevel::Info, Some("conformance"), json!(format!("log message {i}"))).await;
                }
                "Logging test completed"
            },
        ))
        .tool(tool("test_tool_with_logging").description("Logs three messages about 50 ms apart (at the session's or the request's log level).").handler(
            |cx: Context, _a: NoArgs| async move {
                for (i, text) in ["Tool execution started", "Tool processing data", "Tool execution completed"].into_iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    cx.log(LoggingLevel::Info, Some("conformance"), json!(text)).await;
                }
                "Logging test completed"
            },
        ))
        .tool(tool("test_sampling").description("Asks the client's model the given prompt (sampling).").handler(sample_prompt))
        .tool(tool("test_elicitation").description("Asks the user for a username and an email (elicitation).").handler(elicitation))
        .tool(tool("test_elicitation_sep1034_defaults").description("Asks for a form whose fields all have defaults.").handler(elicitation_defaults))
        .tool(tool("test_elicitation_sep1330_enums").description("Asks for a form of single and multiple choices, titled and untitled.").handler(elicitation_enums))
        .tool(tool("test_missing_capability").description("Needs the client's sampling capability.").requires(sampling).handler(
            |_cx: Context, _a: NoArgs| async move { "The client declared sampling." },
        ))
        .tool(tool("test_streaming_elicitation").description("Answers without sending any request to the client.").handler(
            |_cx: Context, _a: NoArgs| async move { "No server-to-client request was needed." },
        ))
        .tool(tool("test_trigger_tool_change").description("Announces that the tool list changed.").handler(
            |cx: Context, _a: NoArgs| async move {
                cx.announce(ChangeEvent::ToolsListChanged).await;
                "tools/list_changed announced"
            },
        ))
        .tool(tool("test_trigger_prompt_change").description("Announces that the prompt list changed.").handler(
            |cx: Context, _a: NoArgs| async move {
                cx.announce(ChangeEvent::PromptsListChanged).await;
                "prompts/list_changed announced"
            },
        ))
        .tool(
            tool("json_schema_2020_12_tool")
                .description("Tool with JSON Schema 2020-12 features")
                .raw_handler(json_schema_2020_12(), |_cx: Context, _a: JsonObject| async move { "ok" }),
        )
        .tool(tool("test_input_required_result_elicitation").description("Asks the user's name (elicitation), then greets them.").handler(mrtr_elicitation))
        .tool(tool("test_input_required_result_sampling").description("Asks the client's model a question (sampling), then reports the answer.").handler(mrtr_sampling))
        .tool(tool("test_input_required_result_list_roots").description("Asks the client for its roots, then lists them.").handler(mrtr_roots))
        .tool(tool("test_input_required_result_request_state").description("Asks for a confirmation and keeps state between the rounds.").handler(mrtr_request_state))
        .tool(tool("test_input_required_result_multiple_inputs").description("Asks for a form, a completion and the roots in one round.").handler(mrtr_multiple))
        .tool(tool("test_input_required_result_multi_round").description("Asks a name, then a colour, in two rounds.").handler(mrtr_multi_round))
        .tool(tool("test_input_required_result_tampered_state").description("Keeps integrity-protected state between rounds; altered state is refused.").handler(mrtr_request_state))
        .tool(tool("test_input_required_result_capabilities").description("Asks only for what the client declared: a form and a completion.").handler(mrtr_capabilities))
        .resource(resource("test://static-text", "static-text").description("A static text resource.").mime_type("text/plain").scopes(&[RESOURCES_READ, "mcp:conformance:resources:static"]).handler(
            |_cx, req| async move {
                Ok(vec![ResourceContents::text(req.uri, "text/plain", "This is the content of the static text resource.")])
            },
        ))
        .resource(resource("test://watched-resource", "watched-resource").description("A resource clients subscribe to.").mime_type("text/plain").handler(
            |_cx, req| async move { Ok(vec![ResourceContents::text(req.uri, "text/plain", "Watched resource content.")]) },
        ))
        .resource(resource("test://static-binary", "static-binary").description("A static PNG.").mime_type("image/png").handler(
            |_cx, req| async move { Ok(vec![ResourceContents::blob(req.uri, "image/png", PNG_1X1)]) },
        ))
        .template(
            template("test://template/{id}/data", "template-data")
                .description("JSON data for an id.")
                .mime_type("application/json")
                // One scope per item: `…:template:123` for test://template/123/data.
                .scopes(&[RESOURCES_READ, "mcp:conformance:resources:template:{id}"])
                .handler(|_cx, req| async move {
                    let id = req.vars.get("id").cloned().unwrap_or_default();
                    let text = json!({ "id": id, "templateTest": true, "data": format!("Data for ID: {id}") }).to_string();
                    Ok(vec![ResourceContents::text(req.uri, "application/json", text)])
                }),
        )
        .prompt(prompt("test_simple_prompt").description("A simple prompt without arguments.").scopes(&[PROMPTS_GET, "mcp:conformance:prompts:test_simple_prompt"]).handler(|_cx, _args| async move {
            Ok(user(Content::text("This is a simple prompt for testing.")))
        }))
        .prompt(
            prompt("test_prompt_with_arguments")
                .description("A prompt with two required arguments.")
                // Its completer lists values of the prompt: it needs the prompt's scope too.
                .scopes(&[PROMPTS_GET])
                .argument("arg1", "First argument", true)
                .argument("arg2", "Second argument", true)
                .completer(|_cx, arg, _ctx| async move {
                    let values = ["paris", "park", "party"].iter().filter(|v| v.starts_with(&arg.value)).map(|v| (*v).to_owned()).collect();
                    Ok::<_, HandlerError>(Completion { values, ..Default::default() })
                })
                .handler(|_cx, args| async move {
                    let (a1, a2) = (args.get("arg1").cloned().unwrap_or_default(), args.get("arg2").cloned().unwrap_or_default());
                    Ok(user(Content::text(format!("Prompt with arguments: arg1='{a1}', arg2='{a2}'"))))
                }),
        )
        .prompt(
            prompt("test_prompt_with_embedded_resource")
                .description("A prompt that embeds a resource.")
                .argument("resourceUri", "URI of the resource to embed", true)
                .handler(|_cx, args| async move {
                    let uri = args.get("resourceUri").cloned().unwrap_or_default();
                    // The client's URI goes into the answer: one that is no URI is its mistake.
                    if !wharf::is_uri(&uri) {
                        return Err(RpcError::invalid_params(format!(
                            "Invalid params: resourceUri {uri:?} is not a URI"
                        ))
                        .into());
                    }
                    Ok(GetPromptResult {
                        messages: vec![
                            PromptMessage::user(Content::resource(ResourceContents::text(
                                uri,
                                "text/plain",
                                "Embedded resource content for testing.",
                            ))),
                            PromptMessage::user(Content::text("Please process the embedded resource above.")),
                        ],
                        ..Default::default()
                    })
                }),
        )
        .prompt(prompt("test_prompt_with_image").description("A prompt with an image.").handler(|_cx, _args| async move {
            Ok(GetPromptResult {
                messages: vec![
                    PromptMessage::user(Content::image(PNG_1X1, "image/png")),
                    PromptMessage::user(Content::text("Please analyze the image above.")),
                ],
                ..Default::default()
            })
        }))
        .prompt(prompt("test_input_required_result_prompt").description("Asks the user for context (elicitation), then builds the prompt with it.").handler(
            |cx, _args| async move {
                match cx.elicited::<ContextAnswer>("user_context", &FormSchema::new().string("context", "The context", true)) {
                    Some(Elicited::Accepted(a)) => Ok(user(Content::text(format!("Context: {}", a.context)))),
                    Some(_) => Ok(user(Content::text("No context was given."))),
                    None => Err(cx
                        .ask()
                        .elicit("user_context", "What context should the prompt use?", FormSchema::new().string("context", "The context", true))
                        .into()),
                }
            },
        ))
}

fn user(content: Content) -> GetPromptResult {
    GetPromptResult {
        messages: vec![PromptMessage::user(content)],
        ..Default::default()
    }
}
