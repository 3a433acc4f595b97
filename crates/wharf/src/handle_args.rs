//! Where a tool's arguments carry handles: every place its input schema puts the handle
//! marker (top-level properties, nested objects, array items, optional values, `$defs`), and
//! the ids found there in a call's arguments. The core checks each one before the handler runs.

use serde_json::{Map, Value};
use wharf_protocol::JsonObject;

use crate::store::SCHEMA_KEYWORD;

/// One step from the arguments object towards a handle.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// The property of that name.
    Property(String),
    /// Every item of an array.
    Items,
}

/// A place in a tool's arguments where a handle goes, found through its schema marker.
#[derive(Debug, Clone)]
pub(crate) struct HandleParam {
    path: Vec<Step>,
    /// The place as the model reads it (`import`, `sources[]`, `target.import`).
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) created_by: String,
}

impl HandleParam {
    /// Whether the handle is a property of the arguments themselves.
    pub(crate) fn is_top_level(&self) -> bool {
        self.path.len() == 1
    }

    /// The ids `args` carries at this place (none where it is absent or null).
    pub(crate) fn ids<'a>(&self, args: &'a Map<String, Value>) -> Vec<&'a str> {
        let mut at: Vec<&Value> = Vec::new();
        let mut steps = self.path.iter();
        match steps.next() {
            Some(Step::Property(name)) => at.extend(args.get(name)),
            _ => return Vec::new(),
        }
        for step in steps {
            at = match step {
                Step::Property(name) => at.iter().filter_map(|v| v.get(name)).collect(),
                Step::Items => at.iter().filter_map(|v| v.as_array()).flatten().collect(),
            };
        }
        at.into_iter().filter_map(Value::as_str).collect()
    }
}

/// Every place `input` (a tool's input schema) marks as a handle. A handle whose places
/// cannot all be named is refused, since it could not be checked on every call: one inside a
/// recursive type (no bounded set of places), or one the schema puts where the walk does not
/// follow (a map's values, a tuple's items, a conditional).
pub(crate) fn find(input: &JsonObject) -> Result<Vec<HandleParam>, String> {
    let root = Value::Object(input.clone());
    let mut found = Vec::new();
    let mut refused = None;
    walk(
        &root,
        &root,
        &mut Vec::new(),
        &mut Vec::new(),
        &mut found,
        &mut refused,
    );
    match refused {
        Some(Refused::Recursive(at)) => Err(format!(
            "a handle inside the recursive type at {at:?} could not be checked on every call; \
             take handles in a non-recursive argument"
        )),
        Some(Refused::Unfollowed { at, keyword }) => Err(format!(
            "a handle under {keyword:?} at {at:?} could not be checked on every call; take \
             handles as properties, array items or optional values (a struct's field, not a \
             map's value or a tuple's item)"
        )),
        None => Ok(found),
    }
}

/// Why a schema's handles cannot all be checked (the first reason found).
enum Refused {
    /// A handle lies along a type that contains itself, at this place.
    Recursive(String),
    /// A handle lies under a keyword the walk does not follow, at this place.
    Unfollowed { at: String, keyword: String },
}

/// Keywords the walk follows to a handle's place, or that only matter through a `$ref`.
const FOLLOWED: [&str; 8] = [
    "properties",
    "items",
    "$ref",
    "anyOf",
    "oneOf",
    "allOf",
    "$defs",
    "definitions",
];

fn walk(
    root: &Value,
    schema: &Value,
    path: &mut Vec<Step>,
    refs: &mut Vec<String>,
    found: &mut Vec<HandleParam>,
    refused: &mut Option<Refused>,
) {
    if let Some(marker) = schema.get(SCHEMA_KEYWORD) {
        if !path.is_empty() {
            let text = |k: &str| marker.get(k).and_then(Value::as_str).unwrap_or_default();
            found.push(HandleParam {
                name: display(path),
                path: path.clone(),
                kind: text("kind").to_owned(),
                created_by: text("createdBy").to_owned(),
            });
        }
        return;
    }
    if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
        if let Some(resolved) = resolve(root, target) {
            if refs.iter().any(|r| r == target) {
                // A type that contains itself: fine unless a handle lies along the loop.
                if refused.is_none() && reaches_marker(root, resolved, &mut Vec::new()) {
                    *refused = Some(Refused::Recursive(display(path)));
                }
            } else {
                refs.push(target.to_owned());
                walk(root, resolved, path, refs, found, refused);
                refs.pop();
            }
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            path.push(Step::Property(name.clone()));
            walk(root, sub, path, refs, found, refused);
            path.pop();
        }
    }
    if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
        path.push(Step::Items);
        walk(root, items, path, refs, found, refused);
        path.pop();
    }
    // Alternatives (`Option<T>`, enums) and combinations put the value at the same place.
    for key in ["anyOf", "oneOf", "allOf"] {
        for sub in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            walk(root, sub, path, refs, found, refused);
        }
    }
    // Anything else that leads to a handle (`additionalProperties`, `prefixItems`, `if`,
    // an `items` array, ...) puts it where no path names it.
    let Some(map) = schema.as_object() else {
        return;
    };
    for (keyword, sub) in map {
        let followed =
            FOLLOWED.contains(&keyword.as_str()) && (keyword != "items" || sub.is_object());
        if refused.is_none() && !followed && reaches_marker(root, sub, &mut Vec::new()) {
            *refused = Some(Refused::Unfollowed {
                at: display(path),
                keyword: keyword.clone(),
            });
        }
    }
}

/// Whether `schema` holds the handle marker anywhere, following references.
fn reaches_marker(root: &Value, schema: &Value, seen: &mut Vec<String>) -> bool {
    match schema {
        Value::Object(map) => {
            if map.contains_key(SCHEMA_KEYWORD) {
                return true;
            }
            if let Some(target) = map.get("$ref").and_then(Value::as_str) {
                if !seen.iter().any(|s| s == target) {
                    seen.push(target.to_owned());
                    if resolve(root, target).is_some_and(|r| reaches_marker(root, r, seen)) {
                        return true;
                    }
                }
            }
            map.values().any(|v| reaches_marker(root, v, seen))
        }
        Value::Array(items) => items.iter().any(|v| reaches_marker(root, v, seen)),
        _ => false,
    }
}

/// A local reference (`#/$defs/Name`).
fn resolve<'a>(root: &'a Value, target: &str) -> Option<&'a Value> {
    root.pointer(target.strip_prefix('#')?)
}

fn display(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Property(name) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(name);
            }
            Step::Items => out.push_str("[]"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn marker(kind: &str) -> Value {
        json!({ "type": "string", SCHEMA_KEYWORD: { "kind": kind, "createdBy": "make" } })
    }

    #[test]
    fn handles_are_found_wherever_the_schema_puts_them() {
        let schema = json!({
            "type": "object",
            "properties": {
                "top": marker("a"),
                "maybe": { "anyOf": [marker("b"), { "type": "null" }] },
                "many": { "type": "array", "items": marker("c") },
                "nested": { "$ref": "#/$defs/Inner" },
                "plain": { "type": "string" }
            },
            "$defs": {
                "Inner": { "type": "object", "properties": {
                    "deep": marker("d"),
                    "tree": { "$ref": "#/$defs/Tree" }
                } },
                "Tree": { "type": "object", "properties": {
                    "children": { "type": "array", "items": { "$ref": "#/$defs/Tree" } }
                } }
            }
        });
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        let found = find(&schema).unwrap();
        let names: Vec<_> = found.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["many[]", "maybe", "nested.deep", "top"]);
        assert!(
            found
                .iter()
                .find(|p| p.name == "top")
                .unwrap()
                .is_top_level()
        );
        assert!(
            !found
                .iter()
                .find(|p| p.name == "many[]")
                .unwrap()
                .is_top_level()
        );

        let args = json!({
            "top": "a_1", "maybe": null, "many": ["c_1", "c_2"],
            "nested": { "deep": "d_1", "tree": { "children": [] } }
        });
        let Value::Object(args) = args else {
            unreachable!()
        };
        let ids = |name: &str| found.iter().find(|p| p.name == name).unwrap().ids(&args);
        assert_eq!(ids("top"), ["a_1"]);
        assert!(ids("maybe").is_empty());
        assert_eq!(ids("many[]"), ["c_1", "c_2"]);
        assert_eq!(ids("nested.deep"), ["d_1"]);
    }

    #[test]
    fn a_handle_where_no_path_names_it_is_refused() {
        // What schemars writes for `HashMap<String, Handle<K>>` and `(Handle<K>, u32)`.
        let map = json!({ "type": "object", "additionalProperties": marker("a") });
        let tuple = json!({ "type": "array", "prefixItems": [marker("a"), { "type": "integer" }] });
        let nested_map = json!({ "type": "object", "properties": {
            "outer": { "$ref": "#/$defs/Holder" }
        } });
        for (arg, keyword, at) in [
            (map, "additionalProperties", "by_name"),
            (tuple, "prefixItems", "pair"),
        ] {
            let schema = json!({ "type": "object", "properties": { at: arg } });
            let Value::Object(schema) = schema else {
                unreachable!()
            };
            let e = find(&schema).unwrap_err();
            assert!(e.contains(&format!("under {keyword:?} at {at:?}")), "{e}");
        }
        let mut schema = nested_map;
        schema["$defs"] = json!({ "Holder": { "type": "object",
            "patternProperties": { "^h": marker("a") } } });
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        let e = find(&schema).unwrap_err();
        assert!(
            e.contains("under \"patternProperties\" at \"outer\""),
            "{e}"
        );

        // A map of plain values beside a handle is fine.
        let fine = json!({ "type": "object", "properties": {
            "import": marker("a"),
            "labels": { "type": "object", "additionalProperties": { "type": "string" } }
        } });
        let Value::Object(fine) = fine else {
            unreachable!()
        };
        assert_eq!(find(&fine).unwrap().len(), 1);
    }

    #[test]
    fn a_handle_inside_a_recursive_type_is_refused() {
        let schema = json!({
            "type": "object",
            "properties": { "root": { "$ref": "#/$defs/Node" } },
            "$defs": { "Node": { "type": "object", "properties": {
                "handle": marker("a"),
                "next": { "anyOf": [{ "$ref": "#/$defs/Node" }, { "type": "null" }] }
            } } }
        });
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        let e = find(&schema).unwrap_err();
        assert!(e.contains("recursive type at \"root.next\""), "{e}");
    }
}
