//! JSON Schemas: generating them from Rust types, compiling validators once, and reading the
//! `x-mcp-header` annotations of a tool's input schema.

use std::collections::HashSet;

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::Value;
use wharf_protocol::JsonObject;
use wharf_protocol::headers::{HeaderParamType, X_MCP_HEADER, is_token};

/// Reads `value`, which passed a JSON Schema, into `T` as the schema read it: JSON Schema
/// counts a whole number written with a fraction (`2.0`) as an integer, serde does not. A
/// value read as it is keeps it as it is (a float field, a `Value`); only one that fails is
/// read again with its whole floats made integers.
pub(crate) fn read_validated<T: serde::de::DeserializeOwned>(
    mut value: Value,
) -> serde_json::Result<T> {
    if !has_whole_float(&value) {
        return serde_json::from_value(value);
    }
    if let Ok(read) = T::deserialize(&value) {
        return Ok(read);
    }
    whole_floats_as_integers(&mut value);
    serde_json::from_value(value)
}

/// Up to 2^53, every float is exactly the integer it shows.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// A float that is exactly an integer (`-0.0` aside: as `0` it would lose its sign).
fn is_whole_float(n: &serde_json::Number) -> bool {
    n.is_f64()
        && n.as_f64().is_some_and(|f| {
            f.fract() == 0.0 && f.abs() <= EXACT && !(f == 0.0 && f.is_sign_negative())
        })
}

fn has_whole_float(value: &Value) -> bool {
    match value {
        Value::Number(n) => is_whole_float(n),
        Value::Array(items) => items.iter().any(has_whole_float),
        Value::Object(members) => members.values().any(has_whole_float),
        Value::Null | Value::Bool(_) | Value::String(_) => false,
    }
}

fn whole_floats_as_integers(value: &mut Value) {
    match value {
        Value::Number(n) if is_whole_float(n) => {
            // Whole and within 2^53: the cast is exact.
            let whole = n.as_f64().map_or(0, |f| f as i64);
            *n = serde_json::Number::from(whole);
        }
        Value::Array(items) => items.iter_mut().for_each(whole_floats_as_integers),
        Value::Object(members) => members.values_mut().for_each(whole_floats_as_integers),
        _ => {}
    }
}

/// The JSON Schema 2020-12 of `T`, as an object.
pub(crate) fn schema_for<T: JsonSchema>() -> JsonObject {
    let schema = SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<T>();
    match schema.to_value() {
        Value::Object(mut map) => {
            // The type name says nothing to a model; the description stays.
            map.remove("title");
            map
        }
        // A boolean schema: `true` accepts any object.
        _ => JsonObject::from_iter([("type".to_owned(), Value::String("object".into()))]),
    }
}

/// `schema`'s properties with boolean subschemas written as the object schemas they mean
/// (`true` as `{}`, `false` as `{"not": {}}`): schemars writes `true` for a
/// `serde_json::Value` field, and before 2026-07-28 each property of a tool's input and
/// output schema must be an object.
pub(crate) fn objects_for_booleans(schema: &mut JsonObject) {
    let Some(Value::Object(properties)) = schema.get_mut("properties") else {
        return;
    };
    for property in properties.values_mut() {
        match property {
            Value::Bool(true) => *property = Value::Object(JsonObject::new()),
            Value::Bool(false) => {
                *property = serde_json::json!({ "not": {} });
            }
            _ => {}
        }
    }
}

/// A compiled validator of a tool's arguments, or `None` when the schema accepts any object
/// and validation can be skipped on the hot path (arguments are always an object).
pub(crate) fn compile_input(schema: &JsonObject) -> Result<Option<jsonschema::Validator>, String> {
    let trivial = schema.iter().all(|(k, v)| match k.as_str() {
        "$schema" | "description" => true,
        "type" => v == "object",
        _ => false,
    });
    if trivial {
        // Still refused if its dialect is one the validator does not know.
        return dialect(schema).map(|_| None);
    }
    compile(schema).map(Some)
}

/// A compiled validator of `schema`, in the dialect it declares.
pub(crate) fn compile(schema: &JsonObject) -> Result<jsonschema::Validator, String> {
    let draft = dialect(schema)?;
    jsonschema::options()
        .with_draft(draft)
        .build(&Value::Object(schema.clone()))
        .map_err(|e| e.to_string())
}

/// The dialect `schema` declares in `$schema` (2020-12 when it declares none): a schema is
/// validated by its own dialect's rules, where keywords differ (`dependencies`, an `items`
/// array). One the validator does not know is refused, not read as 2020-12.
fn dialect(schema: &JsonObject) -> Result<jsonschema::Draft, String> {
    use jsonschema::Draft;
    let Some(declared) = schema.get("$schema") else {
        return Ok(Draft::Draft202012);
    };
    let draft = Draft::from_schema_uri(declared.as_str().unwrap_or_default());
    let known = [
        Draft::Draft4,
        Draft::Draft6,
        Draft::Draft7,
        Draft::Draft201909,
        Draft::Draft202012,
    ];
    if !known.contains(&draft) {
        return Err(format!(
            "its $schema {declared} names a dialect this server does not support; declare \
             JSON Schema 2020-12 (or leave $schema out), 2019-09, draft-07, -06 or -04"
        ));
    }
    // Up to draft-07 a `$ref` hides every keyword beside it: at the root, those the server
    // reads or adds there (`type`, an idempotent tool's key) would go unchecked.
    if draft < Draft::Draft201909 && schema.contains_key("$ref") {
        return Err(format!(
            "its root is a $ref, beside which {declared} ignores every other keyword; write \
             the root object out, or declare JSON Schema 2020-12"
        ));
    }
    Ok(draft)
}

/// The first violation of `value` against `validator`, as "message at /path".
pub(crate) fn first_violation(
    validator: &jsonschema::Validator,
    value: &Value,
) -> Option<(String, String)> {
    // `is_valid` stops at the first failure and builds no error: the common case is cheap.
    if validator.is_valid(value) {
        return None;
    }
    validator.iter_errors(value).next().map(|e| {
        let path = e.instance_path().to_string();
        (
            e.to_string(),
            if path.is_empty() {
                "/".to_owned()
            } else {
                path
            },
        )
    })
}

/// An argument mirrored into an `Mcp-Param-{name}` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderParam {
    /// The header name after `Mcp-Param-`, as declared.
    pub name: String,
    /// The full header name, lower-cased, for lookups.
    pub header: String,
    /// The chain of `properties` keys leading to the argument.
    pub path: Vec<String>,
    /// The argument's type.
    pub kind: HeaderParamType,
}

impl HeaderParam {
    /// The argument's value in `args`, if present and not null.
    pub fn value_in<'a>(&self, args: &'a JsonObject) -> Option<&'a Value> {
        let (first, rest) = self.path.split_first()?;
        let mut v = args.get(first)?;
        for key in rest {
            v = v.as_object()?.get(key)?;
        }
        (!v.is_null()).then_some(v)
    }
}

/// Reads every `x-mcp-header` annotation of an input schema, refusing invalid ones.
pub(crate) fn header_params(schema: &JsonObject) -> Result<Vec<HeaderParam>, String> {
    let mut out = Vec::new();
    walk(schema, Some(Vec::new()), &mut out)?;
    let mut seen = HashSet::new();
    for p in &out {
        if !seen.insert(p.header.clone()) {
            return Err(format!(
                "x-mcp-header {:?} is declared twice (names are compared case-insensitively)",
                p.name
            ));
        }
    }
    Ok(out)
}

fn walk(
    schema: &JsonObject,
    chain: Option<Vec<String>>,
    out: &mut Vec<HeaderParam>,
) -> Result<(), String> {
    if let Some(name) = schema.get(X_MCP_HEADER) {
        let Some(path) = chain.clone().filter(|c| !c.is_empty()) else {
            return Err("x-mcp-header may only mark a property reached through `properties` from the schema root".into());
        };
        let name = name.as_str().ok_or("x-mcp-header must be a string")?;
        if !is_token(name) {
            return Err(format!(
                "x-mcp-header {name:?} is not a valid HTTP header name token"
            ));
        }
        // One primitive type, optionally with "null" (an `Option<T>` field): a null value
        // simply means no header.
        let declared = match schema.get("type") {
            Some(Value::String(t)) => Some(t.as_str()),
            Some(Value::Array(types)) => {
                let non_null: Vec<&str> = types
                    .iter()
                    .filter_map(Value::as_str)
                    .filter(|t| *t != "null")
                    .collect();
                (non_null.len() == 1 && types.len() <= 2).then(|| non_null[0])
            }
            _ => None,
        };
        let kind = match declared {
            Some("string") => HeaderParamType::String,
            Some("integer") => HeaderParamType::Integer,
            Some("boolean") => HeaderParamType::Boolean,
            other => {
                return Err(format!(
                    "x-mcp-header {name:?} marks a property of type {other:?}; only string, integer and boolean are allowed"
                ));
            }
        };
        out.push(HeaderParam {
            name: name.to_owned(),
            header: format!("mcp-param-{}", name.to_ascii_lowercase()),
            path,
            kind,
        });
    }
    for (key, value) in schema {
        match (key.as_str(), value) {
            ("properties", Value::Object(props)) => {
                for (prop, sub) in props {
                    if let Value::Object(sub) = sub {
                        let child = chain.as_ref().map(|c| {
                            let mut c = c.clone();
                            c.push(prop.clone());
                            c
                        });
                        walk(sub, child, out)?;
                    }
                }
            }
            ("const" | "default" | "enum" | "examples", _) => {}
            (_, Value::Object(sub)) => walk(sub, None, out)?,
            (_, Value::Array(items)) => {
                for item in items {
                    if let Value::Object(sub) = item {
                        walk(sub, None, out)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_exact_whole_floats_become_integers() {
        let mut v = json!([
            1.0,
            -0.0,
            2.5,
            9_007_199_254_740_992.0,
            1e300,
            7,
            "8.0",
            -3.0
        ]);
        whole_floats_as_integers(&mut v);
        assert_eq!(
            v,
            json!([1, -0.0, 2.5, 9_007_199_254_740_992_i64, 1e300, 7, "8.0", -3])
        );
        assert!(v[0].is_i64() && v[1].is_f64() && v[3].is_i64() && v[4].is_f64());
    }

    /// What reads as it is stays as it is (a float field, a `Value`, a float's sign); only
    /// what an integer field refuses is read with its whole floats made integers.
    #[test]
    fn a_value_is_rewritten_only_when_it_does_not_read_as_it_is() {
        #[derive(serde::Deserialize)]
        struct Mixed {
            count: i64,
            scale: f64,
            raw: Value,
        }
        let read: Mixed =
            read_validated(json!({ "count": 2.0, "scale": -0.0, "raw": [1.0] })).unwrap();
        assert_eq!(read.count, 2);
        assert!(read.scale == 0.0 && read.scale.is_sign_negative());
        assert!(
            read.raw[0].is_i64(),
            "rewritten with the rest: {}",
            read.raw
        );
        let kept: Value = read_validated(json!({ "raw": [1.0] })).unwrap();
        assert!(kept["raw"][0].is_f64(), "{kept}");
        let (scale, raw): (f64, Value) = read_validated(json!([2.0, 3.0])).unwrap();
        assert!(scale == 2.0 && raw.is_f64());
    }

    fn obj(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn finds_valid_annotations() {
        let s = obj(json!({"type":"object","properties":{
            "region":{"type":"string","x-mcp-header":"Region"},
            "opts":{"type":"object","properties":{"n":{"type":"integer","x-mcp-header":"N"}}}}}));
        let p = header_params(&s).unwrap();
        assert_eq!(p.len(), 2);
        let n = p.iter().find(|p| p.name == "N").unwrap();
        assert_eq!(n.path, vec!["opts".to_string(), "n".to_string()]);
        assert_eq!(n.kind, HeaderParamType::Integer);
        assert!(p.iter().any(|p| p.header == "mcp-param-region"));
    }

    #[test]
    fn accepts_optional_primitives() {
        let s = obj(
            json!({"type":"object","properties":{"r":{"type":["string","null"],"x-mcp-header":"R"}}}),
        );
        assert_eq!(header_params(&s).unwrap()[0].kind, HeaderParamType::String);
        let s = obj(
            json!({"type":"object","properties":{"r":{"type":["string","integer"],"x-mcp-header":"R"}}}),
        );
        assert!(header_params(&s).is_err());
    }

    #[test]
    fn refuses_invalid_annotations() {
        for bad in [
            json!({"type":"object","properties":{"a":{"type":"number","x-mcp-header":"A"}}}),
            json!({"type":"object","properties":{"a":{"type":"string","x-mcp-header":"A B"}}}),
            json!({"type":"object","properties":{"a":{"type":"string","x-mcp-header":""}}}),
            json!({"type":"object","properties":{"a":{"type":"string","x-mcp-header":"A"},"b":{"type":"string","x-mcp-header":"a"}}}),
            json!({"type":"object","properties":{"a":{"type":"array","items":{"type":"string","x-mcp-header":"A"}}}}),
            json!({"type":"object","anyOf":[{"properties":{"a":{"type":"string","x-mcp-header":"A"}}}]}),
            json!({"type":"object","$defs":{"x":{"type":"string","x-mcp-header":"A"}}}),
        ] {
            assert!(header_params(&obj(bad.clone())).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_schema_is_validated_by_the_dialect_it_declares() {
        // draft-07's tuple: `items` an array, the rest refused by `additionalItems`.
        let declared = obj(json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {
                "pair": { "type": "array", "items": [{ "type": "integer" }], "additionalItems": false }
            }
        }));
        let v = compile(&declared).unwrap();
        assert!(first_violation(&v, &json!({ "pair": [1] })).is_none());
        assert!(first_violation(&v, &json!({ "pair": [1, 2] })).is_some());
        assert!(first_violation(&v, &json!({ "pair": ["x"] })).is_some());
        // Without `$schema` the same schema is 2020-12's, where `items` must be one schema.
        let mut undeclared = declared.clone();
        undeclared.remove("$schema");
        assert!(compile(&undeclared).is_err());
        // A dialect the validator does not know is refused, even for a schema that
        // accepts any object.
        for unknown in ["https://example.com/my-dialect", "draft-07"] {
            let s = obj(json!({ "$schema": unknown, "type": "object" }));
            let e = compile_input(&s).unwrap_err();
            assert!(e.contains("does not support"), "{e}");
        }
        // Up to draft-07, a root `$ref` would hide what sits beside it.
        let hiding = obj(json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "$ref": "#/definitions/Args",
            "type": "object",
            "definitions": { "Args": { "type": "object" } }
        }));
        assert!(compile(&hiding).unwrap_err().contains("root is a $ref"));
        let mut later = hiding.clone();
        later.insert(
            "$schema".into(),
            "https://json-schema.org/draft/2020-12/schema".into(),
        );
        assert!(compile(&later).is_ok());
    }
}
