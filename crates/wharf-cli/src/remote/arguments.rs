//! Tool arguments from the command line: `key=value` words typed by the tool's input schema.

use serde_json::{Map, Value};

/// Builds the arguments object from `--json` (if any) and `key=value` words, each value
/// typed by the property's schema: numbers, booleans, arrays (`a,b,c` or JSON), objects
/// (JSON); strings as written. An error names the word and what was expected.
pub(crate) fn parse(
    schema: &Value,
    json: Option<&str>,
    words: &[String],
) -> Result<Map<String, Value>, String> {
    let mut args = match json {
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err("--json must be a JSON object".to_owned()),
            Err(e) => return Err(format!("--json is not JSON: {e}")),
        },
        None => Map::new(),
    };
    for word in words {
        // JSON here is a slip for --json (`'{"q":"a=b"}'` would split at its '=').
        if word.trim_start().starts_with('{') {
            return Err(format!(
                "{word:?} is not key=value: give a JSON object of arguments with --json"
            ));
        }
        let Some((key, raw)) = word.split_once('=') else {
            return Err(format!("{word:?} is not key=value"));
        };
        if key.is_empty() {
            return Err(format!("{word:?} has no name before '='"));
        }
        let property = &schema["properties"][key];
        if schema["properties"].is_object()
            && property.is_null()
            && schema["additionalProperties"] == false
        {
            let known: Vec<&str> = schema["properties"]
                .as_object()
                .map(|p| p.keys().map(String::as_str).collect())
                .unwrap_or_default();
            return Err(format!(
                "the tool takes no argument {key:?}; it takes {}",
                known.join(", ")
            ));
        }
        let value = typed(property, raw).map_err(|e| format!("{key}={raw}: {e}"))?;
        args.insert(key.to_owned(), value);
    }
    Ok(args)
}

/// `raw` as the JSON type `schema` says.
fn typed(schema: &Value, raw: &str) -> Result<Value, String> {
    match type_of(schema) {
        Some("string") => Ok(Value::String(raw.to_owned())),
        Some("integer") => raw
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| "expected an integer".to_owned()),
        Some("number") => raw
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| "expected a number".to_owned()),
        Some("boolean") => match raw {
            "true" | "yes" | "1" => Ok(Value::Bool(true)),
            "false" | "no" | "0" => Ok(Value::Bool(false)),
            _ => Err("expected true or false".to_owned()),
        },
        Some("array") if !raw.trim_start().starts_with('[') => {
            let items = &schema["items"];
            if raw.is_empty() {
                return Ok(Value::Array(Vec::new()));
            }
            raw.split(',')
                .map(|item| typed(items, item.trim()))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array)
        }
        Some("array" | "object") => {
            serde_json::from_str(raw).map_err(|e| format!("expected JSON: {e}"))
        }
        // No type (or a union): JSON when it parses, else the text.
        _ => Ok(serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))),
    }
}

/// The single JSON type of `schema`, ignoring `null` in a `["T", "null"]` union.
fn type_of(schema: &Value) -> Option<&str> {
    match &schema["type"] {
        Value::String(t) => Some(t),
        Value::Array(types) => {
            let mut named = types
                .iter()
                .filter_map(Value::as_str)
                .filter(|t| *t != "null");
            match (named.next(), named.next()) {
                (Some(t), None) => Some(t),
                _ => None,
            }
        }
        _ => None,
    }
}

/// A one-line signature of a tool's arguments: `text:string [interval_ms:integer]`.
pub(crate) fn signature(schema: &Value) -> String {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema["properties"].as_object() else {
        return String::new();
    };
    // Required arguments first, each group in the schema's order.
    let (mut first, rest): (Vec<_>, Vec<_>) = properties
        .iter()
        .partition(|(name, _)| required.contains(&name.as_str()));
    first.extend(rest);
    first
        .into_iter()
        .map(|(name, p)| {
            let t = type_of(p).unwrap_or("json");
            if required.contains(&name.as_str()) {
                format!("{name}:{t}")
            } else {
                format!("[{name}:{t}]")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "text": { "type": "string" },
                "steps": { "type": "integer" },
                "ratio": { "type": "number" },
                "dry": { "type": "boolean" },
                "tags": { "type": "array", "items": { "type": "string" } },
                "ids": { "type": "array", "items": { "type": "integer" } },
                "opts": { "type": "object" },
                "maybe": { "type": ["integer", "null"] },
                "free": {}
            },
            "required": ["text"],
        })
    }

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn values_take_the_type_their_schema_gives() {
        let args = parse(
            &schema(),
            None,
            &words(&[
                "text=42",
                "steps=3",
                "ratio=0.5",
                "dry=true",
                "tags=a, b",
                "ids=1,2",
                "opts={\"x\":1}",
                "maybe=7",
                "free=[1]",
                "extra=x=y",
            ]),
        )
        .unwrap();
        assert_eq!(
            Value::Object(args),
            json!({
                "text": "42", "steps": 3, "ratio": 0.5, "dry": true, "tags": ["a", "b"],
                "ids": [1, 2], "opts": { "x": 1 }, "maybe": 7, "free": [1], "extra": "x=y",
            })
        );
    }

    #[test]
    fn words_override_json_and_bad_values_are_named() {
        let args = parse(
            &schema(),
            Some(r#"{"text":"a","steps":1}"#),
            &words(&["steps=2"]),
        )
        .unwrap();
        assert_eq!(Value::Object(args), json!({ "text": "a", "steps": 2 }));
        assert_eq!(
            parse(&schema(), None, &words(&["steps=many"])).unwrap_err(),
            "steps=many: expected an integer"
        );
        assert_eq!(
            parse(&schema(), None, &words(&["ids=1,x"])).unwrap_err(),
            "ids=1,x: expected an integer"
        );
        assert!(
            parse(&schema(), None, &words(&["text"]))
                .unwrap_err()
                .contains("key=value")
        );
        assert!(
            parse(&schema(), Some("[1]"), &[])
                .unwrap_err()
                .contains("object")
        );
        // JSON where a word goes points at --json, with or without an '=' inside.
        for word in [r#"{"text":"a"}"#, r#"{"text":"a=b"}"#] {
            let e = parse(&schema(), None, &words(&[word])).unwrap_err();
            assert!(e.contains("--json"), "{e}");
        }
        let closed = json!({ "properties": { "a": {} }, "additionalProperties": false });
        assert!(
            parse(&closed, None, &words(&["b=1"]))
                .unwrap_err()
                .contains("takes a")
        );
    }

    #[test]
    fn a_signature_marks_the_optional_arguments() {
        assert_eq!(
            signature(&json!({
                "properties": { "text": { "type": "string" }, "n": { "type": "integer" } },
                "required": ["text"],
            })),
            "text:string [n:integer]"
        );
    }
}
