//! Asking the person at the terminal what the server wants to know: elicitation forms
//! rendered from their schema, URL visits, a model's reply, roots.

use std::io::IsTerminal as _;

use dialoguer::theme::ColorfulTheme;
use dialoguer::{Confirm, Input, MultiSelect, Select};
use serde_json::{Map, Value, json};
use wharf_client::{Unanswered, describe};
use wharf_protocol::{ElicitParams, InputRequest};

/// Whether there is a person to ask: standard input and error are terminals.
pub(crate) fn is_interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// A sampling answer whose text is `reply`.
pub(crate) fn sampled(reply: &str) -> Value {
    json!({
        "role": "assistant",
        "content": { "type": "text", "text": reply },
        "model": "a person at wharf call",
        "stopReason": "endTurn",
    })
}

/// Asks for the answer to `request` (filed under `key`); blocks on the terminal.
pub(crate) fn ask(key: &str, request: &InputRequest) -> Result<Value, Unanswered> {
    let failed =
        |e: dialoguer::Error| Unanswered::new(key, request, format!("the prompt failed: {e}"));
    let theme = ColorfulTheme::default();
    eprintln!(
        "{} {}",
        console::style("The server asks").bold(),
        console::style(format!("({key}):")).dim()
    );
    match request {
        InputRequest::Elicit(ElicitParams::Form(form)) => {
            eprintln!("  {}", form.message);
            let choice = Select::with_theme(&theme)
                .items(["Answer", "Decline", "Cancel"])
                .default(0)
                .interact()
                .map_err(failed)?;
            match choice {
                0 => {
                    let content = fill(&theme, &Value::Object(form.requested_schema.clone()))
                        .map_err(failed)?;
                    Ok(json!({ "action": "accept", "content": content }))
                }
                1 => Ok(json!({ "action": "decline" })),
                _ => Ok(json!({ "action": "cancel" })),
            }
        }
        InputRequest::Elicit(ElicitParams::Url(visit)) => {
            eprintln!(
                "  {}\n  Open: {}",
                visit.message,
                console::style(&visit.url).underlined()
            );
            let done = Confirm::with_theme(&theme)
                .with_prompt("Done there? (no declines)")
                .default(true)
                .interact()
                .map_err(failed)?;
            Ok(json!({ "action": if done { "accept" } else { "decline" } }))
        }
        InputRequest::CreateMessage(params) => {
            eprintln!("  {}; the conversation:", describe(request));
            for message in &params.messages {
                let m = serde_json::to_value(message).unwrap_or(Value::Null);
                let text = m["content"]["text"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| m["content"].to_string());
                eprintln!("  {}: {text}", m["role"].as_str().unwrap_or("?"));
            }
            let reply: String = Input::with_theme(&theme)
                .with_prompt("Reply as the model")
                .interact_text()
                .map_err(failed)?;
            Ok(sampled(&reply))
        }
        InputRequest::ListRoots(_) => {
            let roots: String = Input::with_theme(&theme)
                .with_prompt("Roots (URIs, comma-separated)")
                .allow_empty(true)
                .interact_text()
                .map_err(failed)?;
            let roots: Vec<Value> = roots
                .split(',')
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(|uri| json!({ "uri": uri }))
                .collect();
            Ok(json!({ "roots": roots }))
        }
    }
}

/// Fills a form: one prompt per property of `schema`, typed by it.
fn fill(theme: &ColorfulTheme, schema: &Value) -> Result<Map<String, Value>, dialoguer::Error> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut content = Map::new();
    for (name, field) in schema["properties"].as_object().into_iter().flatten() {
        let optional = !required.contains(&name.as_str());
        let mut label = field["title"].as_str().unwrap_or(name).to_owned();
        if let Some(d) = field["description"].as_str() {
            label = format!("{label} ({d})");
        }
        if optional {
            label.push_str(" [optional]");
        }
        if let Some(value) = field_value(theme, &label, field, optional)? {
            content.insert(name.clone(), value);
        }
    }
    Ok(content)
}

/// One field's answer; `None` when an optional field is left empty.
fn field_value(
    theme: &ColorfulTheme,
    label: &str,
    field: &Value,
    optional: bool,
) -> Result<Option<Value>, dialoguer::Error> {
    if let Some((values, titles)) = choices(field) {
        let default = values
            .iter()
            .position(|v| *v == field["default"])
            .unwrap_or(0);
        let i = Select::with_theme(theme)
            .with_prompt(label)
            .items(&titles)
            .default(default)
            .interact()?;
        return Ok(Some(values[i].clone()));
    }
    if field["type"] == "array"
        && let Some((values, titles)) = choices(&field["items"])
    {
        let defaults: Vec<bool> = values
            .iter()
            .map(|v| field["default"].as_array().is_some_and(|d| d.contains(v)))
            .collect();
        let picked = MultiSelect::with_theme(theme)
            .with_prompt(format!("{label} (space to pick, enter to confirm)"))
            .items(&titles)
            .defaults(&defaults)
            .interact()?;
        return Ok(Some(Value::Array(
            picked.into_iter().map(|i| values[i].clone()).collect(),
        )));
    }
    if field["type"] == "boolean" {
        let answer = Confirm::with_theme(theme)
            .with_prompt(label)
            .default(field["default"].as_bool().unwrap_or(false))
            .interact()?;
        return Ok(Some(Value::Bool(answer)));
    }
    let mut input = Input::<String>::with_theme(theme)
        .with_prompt(label)
        .allow_empty(optional);
    if let Some(d) = field["default"].as_str() {
        input = input.default(d.to_owned());
    } else if let Some(n) = field["default"].as_number() {
        input = input.default(n.to_string());
    }
    let checked = field.clone();
    let text = input
        .validate_with(move |text: &String| -> Result<(), String> {
            if text.is_empty() {
                return Ok(());
            }
            typed(&checked, text).map(|_| ())
        })
        .interact_text()?;
    if text.is_empty() && optional {
        return Ok(None);
    }
    // The validator already accepted the text as the field's type.
    Ok(Some(typed(field, &text).unwrap_or(Value::String(text))))
}

/// `text` as the field's type, with the schema's bounds checked.
fn typed(field: &Value, text: &str) -> Result<Value, String> {
    let number = |n: f64| -> Result<(), String> {
        if let Some(min) = field["minimum"].as_f64().filter(|m| n < *m) {
            return Err(format!("at least {min}"));
        }
        if let Some(max) = field["maximum"].as_f64().filter(|m| n > *m) {
            return Err(format!("at most {max}"));
        }
        Ok(())
    };
    match field["type"].as_str() {
        Some("integer") => {
            let n: i64 = text.parse().map_err(|_| "a whole number".to_owned())?;
            number(n as f64)?;
            Ok(Value::from(n))
        }
        Some("number") => {
            let n: f64 = text.parse().map_err(|_| "a number".to_owned())?;
            number(n)?;
            Ok(json!(n))
        }
        _ => {
            let len = text.chars().count() as u64;
            if let Some(min) = field["minLength"].as_u64().filter(|m| len < *m) {
                return Err(format!("at least {min} characters"));
            }
            if let Some(max) = field["maxLength"].as_u64().filter(|m| len > *m) {
                return Err(format!("at most {max} characters"));
            }
            Ok(Value::String(text.to_owned()))
        }
    }
}

/// The values of a single-choice field and what to show for each: `enum` (with legacy
/// `enumNames`), or `oneOf`/`anyOf` of `{const, title}`.
fn choices(field: &Value) -> Option<(Vec<Value>, Vec<String>)> {
    if let Some(values) = field["enum"].as_array() {
        let titles = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                field["enumNames"][i]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.as_str().map(str::to_owned).unwrap_or(v.to_string()))
            })
            .collect();
        return Some((values.clone(), titles));
    }
    let options = field["oneOf"].as_array().or(field["anyOf"].as_array())?;
    let values: Vec<Value> = options.iter().map(|o| o["const"].clone()).collect();
    if values.iter().any(Value::is_null) {
        return None;
    }
    let titles = options
        .iter()
        .map(|o| {
            o["title"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| o["const"].to_string())
        })
        .collect();
    Some((values, titles))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_come_from_enums_and_titled_options() {
        let (values, titles) =
            choices(&json!({ "enum": ["r", "g"], "enumNames": ["Red", "Green"] })).unwrap();
        assert_eq!(
            (values, titles),
            (
                vec![json!("r"), json!("g")],
                vec!["Red".to_owned(), "Green".to_owned()]
            )
        );
        let (values, titles) =
            choices(&json!({ "oneOf": [{ "const": "a", "title": "A" }, { "const": "b" }] }))
                .unwrap();
        assert_eq!(
            (values, titles),
            (
                vec![json!("a"), json!("b")],
                vec!["A".to_owned(), "\"b\"".to_owned()]
            )
        );
        assert!(choices(&json!({ "type": "string" })).is_none());
    }

    #[test]
    fn typed_answers_respect_the_schema_bounds() {
        let age = json!({ "type": "integer", "minimum": 0, "maximum": 150 });
        assert_eq!(typed(&age, "42"), Ok(json!(42)));
        assert_eq!(typed(&age, "200"), Err("at most 150".to_owned()));
        assert_eq!(typed(&age, "x"), Err("a whole number".to_owned()));
        let name = json!({ "type": "string", "minLength": 2 });
        assert_eq!(typed(&name, "A"), Err("at least 2 characters".to_owned()));
    }
}
