//! Idempotency keys: what a write is recorded under, and how its arguments are compared.

use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

use super::Millis;

/// The argument an idempotent tool gains.
pub(crate) const KEY_ARGUMENT: &str = "idempotency_key";

/// Longest key accepted, in characters.
pub const MAX_KEY_LEN: u64 = 200;

/// The `_meta` key that marks a replayed result (our vendor prefix).
pub(crate) const REPLAY_META: &str = "dev.wharf/idempotentReplay";

/// SHA-256 of a write's tool name and arguments (keys sorted, the idempotency key left
/// out), hex-encoded: two calls are "the same write" when their digests are equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest(String);

impl Digest {
    /// The digest of a call of `tool` with `args`.
    pub fn of(tool: &str, args: &Map<String, Value>) -> Self {
        Self::canonical(tool, args, Some(KEY_ARGUMENT))
    }

    /// The digest of `tool` with every one of `args`, the idempotency key included.
    pub fn of_all(tool: &str, args: &Map<String, Value>) -> Self {
        Self::canonical(tool, args, None)
    }

    fn canonical(tool: &str, args: &Map<String, Value>, skip: Option<&str>) -> Self {
        let mut h = Sha256::new();
        h.update(tool.as_bytes());
        h.update([0]);
        let mut buf = Vec::with_capacity(256);
        write_canonical_object(&mut buf, args, skip);
        h.update(&buf);
        let out = h.finalize();
        let mut hex = String::with_capacity(64);
        for b in out {
            hex.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            hex.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        Digest(hex)
    }

    /// Wraps a digest read back from a store.
    pub fn from_stored(hex: String) -> Self {
        Digest(hex)
    }

    /// The hex form stores keep.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Serializes with object keys sorted, so the digest does not depend on key order.
fn write_canonical(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Object(map) => write_canonical_object(buf, map, None),
        Value::Array(items) => {
            buf.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                write_canonical(buf, item);
            }
            buf.push(b']');
        }
        // Scalars have one serialization each; serde_json writing to a Vec cannot fail.
        other => {
            let _ = serde_json::to_writer(&mut *buf, other);
        }
    }
}

fn write_canonical_object(buf: &mut Vec<u8>, map: &Map<String, Value>, skip: Option<&str>) {
    let mut keys: Vec<&String> = map.keys().filter(|k| Some(k.as_str()) != skip).collect();
    keys.sort_unstable();
    buf.push(b'{');
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        let _ = serde_json::to_writer(&mut *buf, k);
        buf.push(b':');
        write_canonical(buf, &map[k]);
    }
    buf.push(b'}');
}

/// A claim on an idempotency key: where the record lives, what it is compared by, and how
/// long it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// `h:<handle>` for writes on a handle, `p:<principal>:<tool>` otherwise.
    pub scope: String,
    /// The caller's key.
    pub key: String,
    /// The digest of the call's arguments: the same key with other arguments is refused.
    pub digest: Digest,
    /// When the record may be forgotten.
    pub expires_at: Millis,
    /// [`Principal::id`](crate::Principal::id) of the caller: the record is theirs, and a
    /// replay after the record's handle was retired goes to them alone.
    pub owner: String,
}

impl Claim {
    /// The scope of a key of a tool that takes no handle: `p:<principal>:<tool>`, one per
    /// principal and tool. No two (principal, tool) pairs share a scope, whatever the
    /// principal's id holds: a tool name never contains `:` (the registry refuses any name
    /// outside `A-Za-z0-9_.-`), so the tool is what follows the last `:` and the principal
    /// is all between `p:` and it. (A length prefix would say the same, at the cost of
    /// reading every record kept under the current spelling twice for a retention period.)
    pub fn principal_scope(principal: &str, tool: &str) -> String {
        debug_assert!(
            !tool.contains(':'),
            "tool names are checked at registration"
        );
        format!("p:{principal}:{tool}")
    }

    /// A name of this write for effects outside the store: a digest of its scope and key
    /// (not of its owner's id or the key as sent), hex, behind `wharf-`.
    pub fn effect_key(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.scope.as_bytes());
        h.update([0]);
        h.update(self.key.as_bytes());
        let mut out = String::with_capacity(6 + 64);
        out.push_str("wharf-");
        for b in h.finalize() {
            out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        out
    }
}

/// The schema of the argument an idempotent tool gains.
pub(crate) fn key_schema() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_KEY_LEN,
        // No control characters: a key is printed in logs and stored as text everywhere
        // (PostgreSQL's text cannot hold a NUL).
        "pattern": "^[^\\u0000-\\u001F\\u007F]+$",
        "description": "A key you choose for this write, unique per write (a UUID works). If the call fails or you get no answer, retry it with the same key and the same arguments: the write is applied once and the retry returns the first result. Reusing a key with other arguments is an error."
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_effect_key_names_one_write_whoever_retries_it() {
        let claim = |scope: &str, key: &str| super::Claim {
            scope: scope.into(),
            key: key.into(),
            digest: super::Digest::from_stored(String::new()),
            expires_at: 0,
            owner: "ann".into(),
        };
        let first = claim("h:imp_1", "k").effect_key();
        assert_eq!(first, claim("h:imp_1", "k").effect_key());
        assert!(first.starts_with("wharf-") && first.len() == 70, "{first}");
        // The key and the scope both count, and their boundary too.
        assert_ne!(first, claim("h:imp_1", "k2").effect_key());
        assert_ne!(first, claim("h:imp_2", "k").effect_key());
        assert_ne!(claim("a", "bc").effect_key(), claim("ab", "c").effect_key());
    }

    use super::*;

    #[test]
    fn principal_scopes_never_collide() {
        // Principal ids may hold `:`; tool names never do (see `Registry::build`).
        let pairs = [
            ("a", "b.c"),
            ("a:b", "c"),
            ("a", "b_c"),
            ("a:b:c", "d"),
            ("a:b", "d"),
            ("", "x"),
            (":", "x"),
        ];
        let scopes: std::collections::HashSet<String> = pairs
            .iter()
            .map(|(p, t)| Claim::principal_scope(p, t))
            .collect();
        assert_eq!(scopes.len(), pairs.len(), "{scopes:?}");
        for (p, t) in pairs {
            let scope = Claim::principal_scope(p, t);
            let (principal, tool) = scope["p:".len()..].rsplit_once(':').unwrap_or_default();
            assert_eq!(
                (principal, tool),
                (p, t),
                "the scope reads back as its pair"
            );
        }
    }

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("test literal is an object"),
        }
    }

    #[test]
    fn digest_ignores_key_order_and_the_key_itself() {
        let a = Digest::of(
            "t",
            &obj(json!({"a": 1, "b": {"y": [1, 2], "x": "s"}, "idempotency_key": "k1"})),
        );
        let b = Digest::of(
            "t",
            &obj(json!({"b": {"x": "s", "y": [1, 2]}, "idempotency_key": "k2", "a": 1})),
        );
        assert_eq!(a, b);
    }

    #[test]
    fn digest_tells_apart_tools_values_and_order_of_arrays() {
        let base = Digest::of("t", &obj(json!({"a": [1, 2]})));
        assert_ne!(base, Digest::of("u", &obj(json!({"a": [1, 2]}))));
        assert_ne!(base, Digest::of("t", &obj(json!({"a": [2, 1]}))));
        assert_ne!(base, Digest::of("t", &obj(json!({"a": [1, 2], "b": null}))));
        assert_eq!(base.as_str().len(), 64);
    }
}
