//! What a session of a revision before 2025-11-25 cannot read, rewritten where the older
//! revision has an equivalent and refused where it has none. Handlers are written against
//! the newest revision; a session keeps the version its `initialize` settled on.
//!
//! - 2025-03-26 has no resource links among content blocks (2025-06-18 added them): a link
//!   is sent as text naming it.
//! - Before 2025-11-25, a form's choices are `enum` with `enumNames` (SEP-1330 added titled
//!   `oneOf` choices and multiple choices): titled choices are rewritten so, and a multiple
//!   choice, which an older client cannot show, refuses the round.

use std::borrow::Cow;

use serde_json::{Map, Value, json};
use wharf_protocol::methods;

/// The first revision whose content blocks include resource links.
const LINKS_SINCE: &str = "2025-06-18";
/// The first revision whose forms have titled and multiple choices.
const CHOICES_SINCE: &str = "2025-11-25";

/// Member `key` of a result (its JSON text) as a session of `version` can read it. Only a
/// result that holds a resource link, for a 2025-03-26 session, is parsed and rewritten.
pub(super) fn result_member<'a>(version: &str, key: &str, raw: &'a str) -> Cow<'a, str> {
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

/// The params of input request `method` as a session of `version` can read them, or the
/// name of the form field it cannot show.
pub(super) fn input_params<'a>(
    version: &str,
    method: &str,
    params: Option<&'a Value>,
) -> Result<Option<Cow<'a, Value>>, String> {
    let fields = params
        .and_then(|p| p.get("requestedSchema"))
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    let (Some(params), Some(fields)) = (params, fields) else {
        return Ok(params.map(Cow::Borrowed));
    };
    if method != methods::ELICITATION_CREATE || version >= CHOICES_SINCE {
        return Ok(Some(Cow::Borrowed(params)));
    }
    if let Some((name, _)) = fields.iter().find(|(_, f)| f["type"] == "array") {
        return Err(name.clone());
    }
    if !fields.values().any(|f| f.get("oneOf").is_some()) {
        return Ok(Some(Cow::Borrowed(params)));
    }
    let mut params = params.clone();
    if let Some(fields) = params["requestedSchema"]["properties"].as_object_mut() {
        fields.values_mut().for_each(titled_as_named);
    }
    Ok(Some(Cow::Owned(params)))
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
        schema["$ref"] = json!(format!("#/definitions/{def}"));
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
            "tags"
        );
        assert!(input_params("2025-11-25", method, Some(&multiple)).is_ok());
    }
}
