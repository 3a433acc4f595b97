//! What a session of a revision before 2025-11-25 cannot read, rewritten where the older
//! revision has an equivalent and refused where it has none. Handlers are written against
//! the newest revision; a session keeps the version its `initialize` settled on.
//!
//! - 2025-03-26 has no resource links among content blocks (2025-06-18 added them): a link
//!   is sent as text naming it.
//! - Before 2025-11-25, a form's choices are `enum` with `enumNames` (SEP-1330 added titled
//!   `oneOf` choices and multiple choices): titled choices are rewritten so, and a multiple
//!   choice, which an older client cannot show, refuses the round. A sampling message holds
//!   one text, image or audio block: a list of one is unwrapped, more (or tool use) refuses
//!   the round; and including context needs only the `sampling` capability.
//! - Before 2026-07-28 a tool's `outputSchema` and `structuredContent` are objects (2026-07-28
//!   took any JSON value): a tool whose output is not one keeps its text content only.
//! - 2025-03-26 has no elicitation, 2025-06-18 no URL elicitation: a capability a client
//!   declares for them anyway is not taken, so no handler asks for what the session cannot
//!   carry.

use std::borrow::Cow;

use serde_json::{Map, Value, json};
use wharf_protocol::{ClientCapabilities, meta, methods};

/// The first revision whose content blocks include resource links, and which has
/// elicitation.
const LINKS_SINCE: &str = "2025-06-18";
/// The first revision whose forms have titled and multiple choices, and whose sampling
/// messages may hold several blocks and tool use.
const SHAPES_SINCE: &str = "2025-11-25";

/// Whether a result's member `key` (its JSON text) is left out for a session: a tool's
/// `structuredContent` that is not an object, which no revision before 2026-07-28 reads (its
/// text content carries the same JSON).
pub(super) fn drops_member(key: &str, raw: &str) -> bool {
    key == "structuredContent" && !raw.trim_start().starts_with('{')
}

/// A result's `_meta` (its JSON text) less the server's info, which 2026-07-28 puts in
/// every result and no earlier revision defines (its key is in MCP's reserved prefix);
/// `None` when nothing else was in it.
pub(super) fn result_meta(raw: &str) -> Option<Cow<'_, str>> {
    if !raw.contains(meta::SERVER_INFO) {
        return Some(Cow::Borrowed(raw));
    }
    let mut members: Map<String, Value> = serde_json::from_str(raw).ok()?;
    members.remove(meta::SERVER_INFO);
    (!members.is_empty()).then(|| Cow::Owned(Value::Object(members).to_string()))
}

/// The capabilities a client of `version` declared, less what its revision cannot carry.
pub(super) fn capabilities(version: &str, mut declared: ClientCapabilities) -> ClientCapabilities {
    if version < LINKS_SINCE {
        declared.elicitation = None;
    } else if version < SHAPES_SINCE {
        if let Some(elicitation) = &mut declared.elicitation {
            elicitation.url = None;
        }
    }
    declared
}

/// Member `key` of a result (its JSON text) as a session of `version` can read it. Only a
/// result that holds a resource link, for a 2025-03-26 session, and a tool list with an
/// output schema that is not an object, are parsed and rewritten.
pub(super) fn result_member<'a>(version: &str, key: &str, raw: &'a str) -> Cow<'a, str> {
    if key == "tools" && raw.contains("\"outputSchema\"") {
        return object_outputs_only(raw);
    }
    // Revisions are dates: their text orders as they do.
    if version >= LINKS_SINCE
        || !matches!(key, "content" | "messages")
        || !raw.contains("\"resource_link\"")
    {
        return Cow::Borrowed(raw);
    }
    let Ok(mut value) = serde_json::from_str::<Value>(raw) else {
        return Cow::Borrowed(raw);
    };
    let blocks: Vec<&mut Value> = match (key, &mut value) {
        // A tool's result: its content blocks.
        ("content", Value::Array(blocks)) => blocks.iter_mut().collect(),
        // A prompt's messages: one block each.
        ("messages", Value::Array(messages)) => messages
            .iter_mut()
            .filter_map(|m| m.get_mut("content"))
            .collect(),
        _ => Vec::new(),
    };
    for block in blocks {
        link_as_text(block);
    }
    serde_json::to_string(&value).map_or(Cow::Borrowed(raw), Cow::Owned)
}

/// A tool list whose tools' output schemas are all objects: one that is not is left out
/// (the tool's results then carry text content only, [`drops_member`]).
fn object_outputs_only(raw: &str) -> Cow<'_, str> {
    let Ok(mut tools) = serde_json::from_str::<Vec<Map<String, Value>>>(raw) else {
        return Cow::Borrowed(raw);
    };
    let mut dropped = false;
    for tool in &mut tools {
        if tool
            .get("outputSchema")
            .is_some_and(|s| s.get("type").and_then(Value::as_str) != Some("object"))
        {
            tool.remove("outputSchema");
            dropped = true;
        }
    }
    match dropped {
        true => serde_json::to_string(&tools).map_or(Cow::Borrowed(raw), Cow::Owned),
        false => Cow::Borrowed(raw),
    }
}

/// A resource-link block as a text block naming the link (its annotations and `_meta`
/// kept); any other block as it is.
fn link_as_text(block: &mut Value) {
    let Some(link) = block.as_object().filter(|b| b["type"] == "resource_link") else {
        return;
    };
    let field = |name: &str| link.get(name).and_then(Value::as_str);
    let uri = field("uri").unwrap_or_default();
    let name = field("title").or(field("name")).unwrap_or(uri);
    let mut text = format!("{name} ({uri})");
    if let Some(description) = field("description") {
        text = format!("{text}: {description}");
    }
    let mut rewritten = Map::new();
    rewritten.insert("type".into(), json!("text"));
    rewritten.insert("text".into(), json!(text));
    for kept in ["annotations", "_meta"] {
        if let Some(v) = link.get(kept) {
            rewritten.insert(kept.into(), v.clone());
        }
    }
    *block = Value::Object(rewritten);
}

/// The params of input request `method` as a session of `version` can read them, or what
/// in them it cannot (`field "tags" as a multiple choice`).
pub(super) fn input_params<'a>(
    version: &str,
    method: &str,
    params: Option<&'a Value>,
) -> Result<Option<Cow<'a, Value>>, String> {
    let Some(params) = params.filter(|_| version < SHAPES_SINCE) else {
        return Ok(params.map(Cow::Borrowed));
    };
    match method {
        methods::ELICITATION_CREATE => form(params),
        methods::SAMPLING_CREATE_MESSAGE => sampling(params),
        _ => Ok(Cow::Borrowed(params)),
    }
    .map(Some)
}

/// A form before 2025-11-25: titled choices as `enumNames`; a multiple choice refused.
fn form(params: &Value) -> Result<Cow<'_, Value>, String> {
    let fields = params
        .get("requestedSchema")
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    let Some(fields) = fields else {
        return Ok(Cow::Borrowed(params));
    };
    if let Some((name, _)) = fields.iter().find(|(_, f)| f["type"] == "array") {
        return Err(format!("field {name:?} as a multiple choice"));
    }
    if !fields.values().any(|f| f.get("oneOf").is_some()) {
        return Ok(Cow::Borrowed(params));
    }
    let mut params = params.clone();
    if let Some(fields) = params["requestedSchema"]["properties"].as_object_mut() {
        fields.values_mut().for_each(titled_as_named);
    }
    Ok(Cow::Owned(params))
}

/// A sampling request before 2025-11-25: each message holds one text, image or audio block
/// (2025-11-25 allowed several, and tool use): a one-block list is unwrapped, anything
/// else refused.
fn sampling(params: &Value) -> Result<Cow<'_, Value>, String> {
    let Some(messages) = params.get("messages").and_then(Value::as_array) else {
        return Ok(Cow::Borrowed(params));
    };
    let mut unwrap = false;
    for (i, message) in messages.iter().enumerate() {
        let block = match &message["content"] {
            Value::Array(blocks) if blocks.len() == 1 => {
                unwrap = true;
                &blocks[0]
            }
            Value::Array(blocks) => {
                return Err(format!("message {i} with {} content blocks", blocks.len()));
            }
            block => block,
        };
        let kind = block["type"].as_str().unwrap_or_default();
        if !matches!(kind, "text" | "image" | "audio") {
            return Err(format!("message {i} with {kind:?} content"));
        }
    }
    if !unwrap {
        return Ok(Cow::Borrowed(params));
    }
    let mut params = params.clone();
    if let Some(messages) = params["messages"].as_array_mut() {
        for message in messages {
            if let Some(Value::Array(blocks)) = message.get_mut("content") {
                let block = blocks.pop().unwrap_or_default();
                message["content"] = block;
            }
        }
    }
    Ok(Cow::Owned(params))
}

/// What input request `method` needs of a client of `version`: before 2025-11-25 the
/// `sampling` capability covered including context, which that revision made a capability
/// of its own (`sampling.context`).
pub(super) fn required(version: &str, mut caps: ClientCapabilities) -> ClientCapabilities {
    if version < SHAPES_SINCE {
        if let Some(sampling) = caps.sampling.as_mut() {
            sampling.context = None;
        }
    }
    caps
}

/// A titled single choice (`oneOf` of `const` and `title`) as `enum` and `enumNames`.
fn titled_as_named(field: &mut Value) {
    let Some(field) = field.as_object_mut() else {
        return;
    };
    let Some(Value::Array(choices)) = field.remove("oneOf") else {
        return;
    };
    let (values, names): (Vec<Value>, Vec<Value>) = choices
        .into_iter()
        .map(|c| {
            let value = c.get("const").cloned().unwrap_or(Value::Null);
            let name = c.get("title").cloned().unwrap_or_else(|| value.clone());
            (value, name)
        })
        .unzip();
    field.insert("enum".into(), Value::Array(values));
    field.insert("enumNames".into(), Value::Array(names));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What breaks definition `def` of revision `rev`'s vendored schema in `message`.
    fn violations(rev: &str, def: &str, message: &Value) -> Vec<String> {
        let path = format!(
            "{}/../../spec/{rev}/schema.structural.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut schema: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        // Revisions from 2025-11-25 keep their definitions under `$defs`.
        let defs = if schema.get("$defs").is_some() {
            "$defs"
        } else {
            "definitions"
        };
        schema["$ref"] = json!(format!("#/{defs}/{def}"));
        let validator = jsonschema::validator_for(&schema).unwrap();
        validator
            .iter_errors(message)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect()
    }

    fn assert_valid(rev: &str, def: &str, message: &Value) {
        let errors = violations(rev, def, message);
        assert!(errors.is_empty(), "{def} ({rev}): {errors:?}\n{message}");
    }

    /// A tool whose output is a list: 2026-07-28 takes its schema and its result, the
    /// 2025 revisions (which want objects) get neither, and keep the tool and its text.
    #[test]
    fn output_that_is_no_object_is_left_to_the_text_before_2026() {
        let tools = json!([
            { "name": "ids", "inputSchema": { "type": "object" },
              "outputSchema": { "type": "array", "items": { "type": "integer" } } },
            { "name": "sum", "inputSchema": { "type": "object" },
              "outputSchema": { "type": "object", "properties": { "sum": { "type": "number" } } } },
        ]);
        assert!(
            !violations("2025-11-25", "ListToolsResult", &json!({ "tools": tools })).is_empty()
        );
        let raw = tools.to_string();
        let listed: Value =
            serde_json::from_str(&result_member("2025-11-25", "tools", &raw)).unwrap();
        assert_valid("2025-11-25", "ListToolsResult", &json!({ "tools": listed }));
        assert!(listed[0].get("outputSchema").is_none());
        assert_eq!(listed[1]["outputSchema"], tools[1]["outputSchema"]);

        let result = json!({ "content": [{ "type": "text", "text": "[1,2]" }],
            "structuredContent": [1, 2] });
        assert!(!violations("2025-11-25", "CallToolResult", &result).is_empty());
        assert!(drops_member("structuredContent", "[1,2]"));
        assert!(drops_member("structuredContent", "null"));
        assert!(!drops_member("structuredContent", r#"{"sum":3}"#));
        assert!(!drops_member("content", "[]"));
    }

    /// A capability a client declares that its revision does not have is not taken.
    #[test]
    fn capabilities_a_revision_lacks_are_not_taken() {
        let declared: ClientCapabilities =
            serde_json::from_value(json!({ "elicitation": { "form": {}, "url": {} },
                "sampling": {} }))
            .unwrap();
        let old = capabilities("2025-03-26", declared.clone());
        assert!(old.elicitation.is_none());
        assert!(old.sampling.is_some());
        let middle = capabilities("2025-06-18", declared.clone());
        let elicitation = middle.elicitation.expect("form elicitation kept");
        assert!(elicitation.form.is_some() && elicitation.url.is_none());
        assert_eq!(capabilities("2025-11-25", declared.clone()), declared);
    }

    fn link() -> Value {
        json!({ "type": "resource_link", "uri": "file:///r.txt", "name": "r.txt",
            "description": "the report", "annotations": { "priority": 1 } })
    }

    #[test]
    fn a_2025_03_26_session_gets_resource_links_as_text() {
        let content = json!([{ "type": "text", "text": "see" }, link()]);
        let unread = json!({ "content": content });
        assert!(!violations("2025-03-26", "CallToolResult", &unread).is_empty());
        let content = content.to_string();
        let result = result_member("2025-03-26", "content", &content);
        let blocks: Value = serde_json::from_str(&result).unwrap();
        assert_eq!(
            blocks[1],
            json!({ "type": "text", "text": "r.txt (file:///r.txt): the report",
                "annotations": { "priority": 1 } })
        );
        assert_valid(
            "2025-03-26",
            "CallToolResult",
            &json!({ "content": blocks }),
        );
        let messages = json!([{ "role": "user", "content": link() }]).to_string();
        let messages: Value =
            serde_json::from_str(&result_member("2025-03-26", "messages", &messages)).unwrap();
        assert_valid(
            "2025-03-26",
            "GetPromptResult",
            &json!({ "messages": messages }),
        );
        // Later sessions, and members that are no content, keep their text as it is.
        for (version, key) in [
            ("2025-06-18", "content"),
            ("2025-03-26", "structuredContent"),
        ] {
            assert!(matches!(
                result_member(version, key, &content),
                Cow::Borrowed(_)
            ));
        }
    }

    fn form(fields: Value) -> Value {
        json!({ "mode": "form", "message": "Choose",
            "requestedSchema": { "type": "object", "properties": fields } })
    }

    #[test]
    fn before_2025_11_25_a_titled_choice_is_named_and_a_multiple_one_refused() {
        let titled = form(json!({
            "size": { "type": "string", "title": "Size", "oneOf": [
                { "const": "s", "title": "Small" }, { "const": "l", "title": "Large" } ] },
            "plain": { "type": "string", "enum": ["a", "b"] },
        }));
        let method = methods::ELICITATION_CREATE;
        let older = input_params("2025-06-18", method, Some(&titled))
            .unwrap()
            .unwrap();
        assert_eq!(
            older["requestedSchema"]["properties"]["size"],
            json!({ "type": "string", "title": "Size", "enum": ["s", "l"],
                "enumNames": ["Small", "Large"] })
        );
        let request =
            json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": older.as_ref() });
        assert_valid("2025-06-18", "ElicitRequest", &request);
        assert!(matches!(
            input_params("2025-11-25", method, Some(&titled)),
            Ok(Some(Cow::Borrowed(_)))
        ));

        let multiple = form(json!({ "tags": { "type": "array",
            "items": { "type": "string", "enum": ["x", "y"] } } }));
        let request = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": multiple });
        assert!(!violations("2025-06-18", "ElicitRequest", &request).is_empty());
        assert_eq!(
            input_params("2025-06-18", method, Some(&multiple)).unwrap_err(),
            r#"field "tags" as a multiple choice"#
        );
        assert!(input_params("2025-11-25", method, Some(&multiple)).is_ok());
    }

    #[test]
    fn before_2025_11_25_a_sampling_message_holds_one_plain_block() {
        let method = methods::SAMPLING_CREATE_MESSAGE;
        let asking = |content: Value| {
            json!({ "messages": [
                { "role": "user", "content": { "type": "text", "text": "first" } },
                { "role": "user", "content": content },
            ], "maxTokens": 10, "includeContext": "thisServer" })
        };
        let one = asking(json!([{ "type": "text", "text": "hi" }]));
        let older = input_params("2025-06-18", method, Some(&one))
            .unwrap()
            .unwrap();
        assert_eq!(
            older["messages"][1]["content"],
            json!({ "type": "text", "text": "hi" })
        );
        let request =
            json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": older.as_ref() });
        assert!(
            !violations(
                "2025-06-18",
                "CreateMessageRequest",
                &json!({
            "jsonrpc": "2.0", "id": 1, "method": method, "params": one })
            )
            .is_empty()
        );
        assert_valid("2025-06-18", "CreateMessageRequest", &request);
        assert_valid("2025-03-26", "CreateMessageRequest", &request);
        assert!(matches!(
            input_params("2025-11-25", method, Some(&one)),
            Ok(Some(Cow::Borrowed(_)))
        ));

        let two = asking(json!([{ "type": "text", "text": "a" }, { "type": "text", "text": "b" }]));
        assert_eq!(
            input_params("2025-06-18", method, Some(&two)).unwrap_err(),
            "message 1 with 2 content blocks"
        );
        let tool = asking(json!({ "type": "tool_result", "toolUseId": "t", "content": [] }));
        assert_eq!(
            input_params("2025-03-26", method, Some(&tool)).unwrap_err(),
            r#"message 1 with "tool_result" content"#
        );

        // Including context was the `sampling` capability's own before 2025-11-25.
        let needs = |version: &str| {
            let caps = ClientCapabilities {
                sampling: Some(wharf_protocol::SamplingCapability {
                    context: Some(Map::new()),
                    tools: None,
                }),
                ..Default::default()
            };
            required(version, caps).sampling.unwrap().context
        };
        assert_eq!(needs("2025-06-18"), None);
        assert_eq!(needs("2025-11-25"), Some(Map::new()));
    }
}
