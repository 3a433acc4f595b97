//! Where a tool's arguments carry handles: every place its input schema puts the handle
//! marker (top-level properties, nested objects, array items, optional values, `$defs`), and
//! the ids found there in a call's arguments. The core checks each one before the handler runs.

use serde_json::{Map, Value};
use wharf_protocol::JsonObject;

use crate::store::SCHEMA_KEYWORD;
use crate::uri_template::percent_decode;

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
    if reaches_marker(&root, &root, &mut Vec::new()) {
        if let Some(what) = unfollowable(&root, &root, true) {
            return Err(format!(
                "the input schema marks handles but holds {what}, which the handle check \
                 cannot follow as the argument validator does, so a handle behind it would go \
                 unchecked; use local references of the form \"#/$defs/Name\""
            ));
        }
    }
    let mut found = Vec::new();
    let mut refused = None;
    walk(
        &root,
        &root,
        &mut Walk {
            path: Vec::new(),
            refs: Vec::new(),
            alternative: false,
        },
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
        None => one_kind_per_place(found),
    }
}

/// The handles found, each place once. A place reached by alternatives of two kinds (an
/// untagged `Handle<A> | Handle<B>`) is refused: a handle there would have to be both kinds
/// at once, so every call would be refused. So is a place where one alternative takes a
/// handle and another a plain string (`enum Source { Import { id: Handle<Import> }, Url {
/// id: String } }`): whatever string sits there is checked as a handle, so the plain one
/// would always be refused as an unknown handle.
fn one_kind_per_place(found: Vec<HandleParam>) -> Result<Vec<HandleParam>, String> {
    let mut places: Vec<HandleParam> = Vec::with_capacity(found.len());
    for param in found {
        match places.iter().find(|p| p.path == param.path) {
            Some(p) if p.kind != param.kind && (p.kind.is_empty() || param.kind.is_empty()) => {
                let kind = if p.kind.is_empty() {
                    &param.kind
                } else {
                    &p.kind
                };
                return Err(format!(
                    "the argument at {:?} may be a {kind:?} handle or a plain string; whatever \
                     string is there is checked as a handle, so a plain one would always be \
                     refused: give the handle a field name of its own",
                    param.name
                ));
            }
            Some(p) if p.kind != param.kind => {
                return Err(format!(
                    "the argument at {:?} may be a {:?} or a {:?} handle; a handle is checked \
                     against one kind per place: take each kind in an argument of its own",
                    param.name, p.kind, param.kind
                ));
            }
            Some(_) => {}
            None => places.push(param),
        }
    }
    // Plain strings were noted only to be told apart from handles.
    places.retain(|p| !p.kind.is_empty());
    Ok(places)
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

/// Where the walk stands: the place it is at, the references it followed to get there, and
/// whether it came through an alternative (`anyOf`, `oneOf`).
struct Walk {
    path: Vec<Step>,
    refs: Vec<String>,
    alternative: bool,
}

fn walk(
    root: &Value,
    schema: &Value,
    at: &mut Walk,
    found: &mut Vec<HandleParam>,
    refused: &mut Option<Refused>,
) {
    if let Some(marker) = schema.get(SCHEMA_KEYWORD) {
        if !at.path.is_empty() {
            let text = |k: &str| marker.get(k).and_then(Value::as_str).unwrap_or_default();
            found.push(HandleParam {
                name: display(&at.path),
                path: at.path.clone(),
                kind: text("kind").to_owned(),
                created_by: text("createdBy").to_owned(),
            });
        }
        return;
    }
    // A plain string (no marker) reached through an alternative may go where another
    // alternative puts a handle: noted, under no kind, for `one_kind_per_place` to refuse.
    // (Beside a marker in `allOf`, or at a place no alternative leads to, it is the
    // handle's own schema, or no rival.)
    let string_type = match schema.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(types)) => types.iter().any(|t| t == "string"),
        _ => false,
    };
    if string_type
        && at.alternative
        && !at.path.is_empty()
        && !reaches_marker(root, schema, &mut Vec::new())
    {
        found.push(HandleParam {
            name: display(&at.path),
            path: at.path.clone(),
            kind: String::new(),
            created_by: String::new(),
        });
    }
    if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
        if let Some(resolved) = resolve(root, target) {
            if at.refs.iter().any(|r| r == target) {
                // A type that contains itself: fine unless a handle lies along the loop.
                if refused.is_none() && reaches_marker(root, resolved, &mut Vec::new()) {
                    *refused = Some(Refused::Recursive(display(&at.path)));
                }
            } else {
                at.refs.push(target.to_owned());
                walk(root, resolved, at, found, refused);
                at.refs.pop();
            }
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            at.path.push(Step::Property(name.clone()));
            walk(root, sub, at, found, refused);
            at.path.pop();
        }
    }
    if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
        at.path.push(Step::Items);
        walk(root, items, at, found, refused);
        at.path.pop();
    }
    // Alternatives (`Option<T>`, enums) and combinations put the value at the same place.
    for key in ["anyOf", "oneOf", "allOf"] {
        let alternative = at.alternative;
        at.alternative |= key != "allOf";
        for sub in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            walk(root, sub, at, found, refused);
        }
        at.alternative = alternative;
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
                at: display(&at.path),
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

/// A local reference: a JSON pointer (`#/$defs/Name`, percent-encoded as URI fragments
/// are) or a plain-name fragment naming an `$anchor` (`#name`).
fn resolve<'a>(root: &'a Value, target: &str) -> Option<&'a Value> {
    let fragment = target.strip_prefix('#')?;
    if fragment.is_empty() || fragment.starts_with('/') {
        root.pointer(&percent_decode(fragment)?)
    } else {
        anchor(root, fragment)
    }
}

/// The subschema that declares `$anchor` `name`.
fn anchor<'a>(schema: &'a Value, name: &str) -> Option<&'a Value> {
    if schema.get("$anchor").and_then(Value::as_str) == Some(name) {
        return Some(schema);
    }
    subschemas(schema).find_map(|s| anchor(s, name))
}

/// The schemas directly inside `schema`: every keyword's value but those that hold data
/// (`const`, `enum`, `default`, `examples`) and the marker itself; the values of keywords
/// that map names to schemas (`properties`, `$defs`, ...); the items of arrays of schemas.
fn subschemas(schema: &Value) -> impl Iterator<Item = &Value> {
    const DATA: [&str; 5] = ["const", "enum", "default", "examples", SCHEMA_KEYWORD];
    const NAMED: [&str; 6] = [
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "dependentSchemas",
        "dependencies",
    ];
    schema
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(keyword, _)| !DATA.contains(&keyword.as_str()))
        .flat_map(
            |(keyword, value)| -> Box<dyn Iterator<Item = &Value> + '_> {
                match value {
                    Value::Object(map) if NAMED.contains(&keyword.as_str()) => {
                        Box::new(map.values())
                    }
                    Value::Object(_) => Box::new(std::iter::once(value)),
                    Value::Array(items) => Box::new(items.iter().filter(|i| i.is_object())),
                    _ => Box::new(std::iter::empty()),
                }
            },
        )
}

/// The first thing in `schema` that makes the validator and this walk disagree on where a
/// value's schema lies: a `$ref` that does not resolve here (a remote document, a base
/// changed by an `$id`), a dynamic reference, or an `$id` below the root, against which the
/// validator resolves the references beneath it.
fn unfollowable(root: &Value, schema: &Value, is_root: bool) -> Option<String> {
    if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
        if resolve(root, target).is_none() {
            return Some(format!("the reference {target:?}"));
        }
    }
    for keyword in ["$dynamicRef", "$recursiveRef"] {
        if schema.get(keyword).is_some() {
            return Some(format!("a {keyword:?}"));
        }
    }
    // Draft-04 spells it `id`; no later draft gives a string `id` a meaning.
    let id = schema
        .get("$id")
        .or_else(|| schema.get("id").filter(|v| v.is_string()));
    if !is_root && id.is_some() {
        return Some("an \"$id\" below the root".to_owned());
    }
    subschemas(schema).find_map(|s| unfollowable(root, s, false))
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

        // A handle in one alternative and a plain string in another, at one place.
        let either = json!({ "type": "object", "properties": { "source": { "oneOf": [
            { "type": "object", "properties": {
                "type": { "type": "string", "const": "Import" }, "id": marker("import") } },
            { "type": "object", "properties": {
                "type": { "type": "string", "const": "Url" }, "id": { "type": "string" } } }
        ] } } });
        let Value::Object(either) = either else {
            unreachable!()
        };
        let e = find(&either).unwrap_err();
        assert!(
            e.contains(r#"at "source.id" may be a "import" handle or a plain string"#),
            "{e}"
        );
        // A string schema that also applies to the handle (`allOf`, or beside its `$ref`,
        // in an alternative or not) is the handle's own.
        let both = json!({ "type": "object", "properties": {
            "a": { "allOf": [marker("import"), { "type": "string", "maxLength": 64 }] },
            "b": { "$ref": "#/$defs/Import", "type": "string" },
            "c": { "anyOf": [{ "$ref": "#/$defs/Import", "type": "string" }, { "type": "null" }] }
        }, "$defs": { "Import": marker("import") } });
        let Value::Object(both) = both else {
            unreachable!()
        };
        let names: Vec<_> = find(&both).unwrap().into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["a", "b", "c"]);

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
    fn a_place_of_two_handle_kinds_is_refused_and_one_kind_twice_counts_once() {
        let either = json!({ "type": "object", "properties": {
            "target": { "anyOf": [marker("a"), marker("b")] }
        } });
        let Value::Object(either) = either else {
            unreachable!()
        };
        let e = find(&either).unwrap_err();
        assert!(e.contains("\"target\"") && e.contains("\"b\""), "{e}");
        let twice = json!({ "type": "object", "properties": {
            "target": { "oneOf": [marker("a"), marker("a"), { "type": "null" }] }
        } });
        let Value::Object(twice) = twice else {
            unreachable!()
        };
        assert_eq!(find(&twice).unwrap().len(), 1);
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

    fn object(schema: Value) -> JsonObject {
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        schema
    }

    #[test]
    fn references_resolve_as_the_validator_resolves_them() {
        // A plain-name anchor and a percent-encoded pointer both lead to a handle.
        let schema = object(json!({
            "type": "object",
            "properties": {
                "by_anchor": { "$ref": "#imp" },
                "by_pointer": { "$ref": "#/$defs/Import%20Target" }
            },
            "$defs": {
                "imp": { "$anchor": "imp", "type": "string",
                         SCHEMA_KEYWORD: { "kind": "import", "createdBy": "make" } },
                "Import Target": marker("target")
            }
        }));
        let found = find(&schema).unwrap();
        let names: Vec<_> = found.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["by_anchor", "by_pointer"]);
    }

    #[test]
    fn a_reference_the_walk_cannot_follow_is_refused_where_handles_are_marked() {
        let unfollowable = [
            (json!({ "$ref": "#nowhere" }), "the reference \"#nowhere\""),
            (
                json!({ "$ref": "other.json#/$defs/X" }),
                "the reference \"other.json",
            ),
            (json!({ "$dynamicRef": "#node" }), "a \"$dynamicRef\""),
            (
                json!({ "$id": "https://example.com/inner", "type": "object" }),
                "an \"$id\" below the root",
            ),
            (
                json!({ "id": "https://example.com/inner", "type": "object" }),
                "an \"$id\" below the root",
            ),
        ];
        for (odd, what) in unfollowable {
            let with_handle = object(json!({ "type": "object", "properties": {
                "import": marker("a"), "other": odd.clone()
            } }));
            let e = find(&with_handle).unwrap_err();
            assert!(e.contains(what), "{e}");
            // Without a marked handle there is nothing such a schema could hide.
            let plain = object(json!({ "type": "object", "properties": { "other": odd } }));
            assert!(find(&plain).unwrap().is_empty());
        }
        // Data that looks like a reference is not one.
        let data = object(json!({ "type": "object", "properties": {
            "import": marker("a"),
            "doc": { "type": "object", "default": { "$ref": "#nowhere" } }
        } }));
        assert_eq!(find(&data).unwrap().len(), 1);
    }
}
