//! Handles: server-minted, unguessable ids of cross-call state, owned by a principal and
//! bounded in time (SEP-2567).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Millis, after, millis};
use crate::principal::Principal;

/// The schema keyword that marks a tool argument as a handle; the core finds handle
/// arguments through it and checks them before the handler runs.
pub(crate) const SCHEMA_KEYWORD: &str = "x-wharf-handle";

/// A kind of handle: what it names and how long it lives.
pub trait HandleKind: Send + Sync + 'static {
    /// The kind as stored, and as the model reads it ("import").
    const KIND: &'static str;
    /// The id prefix (`"imp"` gives `imp_…`), so a person can tell handles apart: 1 to 95
    /// ASCII letters and digits, or minting does not compile (an id of any other shape
    /// would be refused on its first use).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use wharf::{HandleKind, Principal, store::HandleRecord};
    /// struct Good;
    /// impl HandleKind for Good {
    ///     const KIND: &'static str = "good";
    ///     const PREFIX: &'static str = "gd2";
    ///     const CREATED_BY: &'static str = "make";
    ///     const TTL: Duration = Duration::from_secs(60);
    /// }
    /// let minted = HandleRecord::mint::<Good>(&Principal::new("u").unwrap(), 0);
    /// assert!(minted.id.starts_with("gd2_") && wharf::store::is_handle_id(&minted.id));
    /// ```
    ///
    /// ```compile_fail
    /// # use std::time::Duration;
    /// # use wharf::{HandleKind, Principal, store::HandleRecord};
    /// struct Bad;
    /// impl HandleKind for Bad {
    ///     const KIND: &'static str = "bad";
    ///     const PREFIX: &'static str = "my_kind";
    ///     const CREATED_BY: &'static str = "make";
    ///     const TTL: Duration = Duration::from_secs(60);
    /// }
    /// HandleRecord::mint::<Bad>(&Principal::new("u").unwrap(), 0);
    /// ```
    const PREFIX: &'static str;
    /// The tool that creates handles of this kind, named in errors so the model can recover.
    const CREATED_BY: &'static str;
    /// Lifetime from creation.
    const TTL: Duration;
    /// Lifetime after the last use, if unused handles should die sooner.
    const IDLE_TTL: Option<Duration> = None;
    /// Most live handles of this kind one principal may hold at once, if capped: minting one
    /// more is refused with an `isError` result naming the cap, so one tenant cannot fill
    /// the store with state nobody finishes. (Two mints at once may both pass the count: the
    /// cap is off by at most the calls in flight.)
    const MAX_PER_OWNER: Option<u64> = None;
}

/// A handle as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleRecord {
    /// The handle's id (what the client holds).
    pub id: String,
    /// Its kind ([`HandleKind::KIND`]).
    pub kind: String,
    /// [`Principal::id`] of the owner.
    pub owner: String,
    /// When it was minted.
    pub created_at: Millis,
    /// Absolute expiry.
    pub expires_at: Millis,
    /// Idle lifetime in milliseconds, if any.
    pub idle_ms: Option<i64>,
    /// When it was last used (pushes the idle expiry).
    pub last_used_at: Millis,
    /// What the handle names, as its creator described it (read with the ownership check,
    /// so a handler needs no second lookup).
    pub data: Option<serde_json::Value>,
}

/// Why a handle is no longer usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Expiry {
    /// Its absolute lifetime ran out.
    Lifetime,
    /// It went unused for its idle lifetime.
    Idle,
}

/// Whether `id` has the shape of a minted handle (`prefix_` and 32 lowercase hex digits,
/// 128 characters at most): what a store files app data under, and what a call may name.
pub fn is_handle_id(id: &str) -> bool {
    id.len() <= 128
        && id.split_once('_').is_some_and(|(prefix, hex)| {
            !prefix.is_empty()
                && prefix.bytes().all(|b| b.is_ascii_alphanumeric())
                && hex.len() == 32
                && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

/// Whether `prefix` makes ids [`is_handle_id`] accepts (with its `_` and 32 hex digits,
/// 128 characters at most).
const fn is_handle_prefix(prefix: &str) -> bool {
    let bytes = prefix.as_bytes();
    if bytes.is_empty() || bytes.len() > 128 - 33 {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_alphanumeric() {
            return false;
        }
        i += 1;
    }
    true
}

impl HandleRecord {
    /// Mints a new handle of kind `K` for `owner`: 128 bits from the operating system's
    /// CSPRNG, hex-encoded behind the kind's prefix.
    pub fn mint<K: HandleKind>(owner: &Principal, now: Millis) -> Self {
        const {
            assert!(
                is_handle_prefix(K::PREFIX),
                "HandleKind::PREFIX must be 1 to 95 ASCII letters and digits"
            );
        }
        let bytes: [u8; 16] = rand::random();
        let mut id = String::with_capacity(K::PREFIX.len() + 33);
        id.push_str(K::PREFIX);
        id.push('_');
        for b in bytes {
            id.push(char::from(HEX[usize::from(b >> 4)]));
            id.push(char::from(HEX[usize::from(b & 15)]));
        }
        HandleRecord {
            id,
            kind: K::KIND.to_owned(),
            owner: owner.id().to_owned(),
            created_at: now,
            expires_at: after(now, K::TTL),
            idle_ms: K::IDLE_TTL.map(millis),
            last_used_at: now,
            data: None,
        }
    }

    /// Whether (and why) the handle has expired at `now`.
    pub fn expired(&self, now: Millis) -> Option<Expiry> {
        if now >= self.expires_at {
            Some(Expiry::Lifetime)
        } else if self
            .idle_ms
            .is_some_and(|idle| now >= self.last_used_at.saturating_add(idle))
        {
            Some(Expiry::Idle)
        } else {
            None
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A handle argument of kind `K`. Its JSON Schema is a string that says what the handle
/// names and how long it lives; the core checks owner and expiry before the handler runs,
/// so a handler only ever sees handles its caller may use.
pub struct Handle<K> {
    id: String,
    _kind: PhantomData<fn() -> K>,
}

impl<K: HandleKind> Handle<K> {
    /// Wraps a handle id (one the server minted).
    pub fn new(id: impl Into<String>) -> Self {
        Handle {
            id: id.into(),
            _kind: PhantomData,
        }
    }

    /// The id, as the client sends it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A collection name filed under this handle: removed when the handle is retired or
    /// swept.
    pub fn collection(&self, name: &str) -> String {
        format!("{}/{name}", self.id)
    }
}

impl<K> Clone for Handle<K> {
    fn clone(&self) -> Self {
        Handle {
            id: self.id.clone(),
            _kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Handle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Handle({})", self.id)
    }
}

impl<K> PartialEq for Handle<K> {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl<K> Serialize for Handle<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.id)
    }
}

impl<'de, K: HandleKind> Deserialize<'de> for Handle<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Any string: a malformed handle must get the same answer as an unknown one, which
        // the core gives before the handler runs.
        let id = String::deserialize(deserializer)?;
        if CHECKED.with(|checked| {
            checked.borrow().as_ref().is_some_and(|checked| {
                !checked
                    .iter()
                    .any(|(checked, kind)| *checked == id && *kind == K::KIND)
            })
        }) {
            // Never the id: it is a credential in anonymous mode.
            return Err(serde::de::Error::custom(format_args!(
                "a {} handle sits where the tool's input schema marks none (a serde alias, \
                 or a field read by a deserializer of its own), so it was not checked; send \
                 it under the name the input schema gives",
                K::KIND
            )));
        }
        Ok(Handle {
            id,
            _kind: PhantomData,
        })
    }
}

thread_local! {
    /// While a call's input is read into the handler's types: the handles (id and kind)
    /// the core checked for the call. A handle read then that is not among them came from
    /// a place the input schema does not mark (a `#[serde(alias)]`, which schemars leaves
    /// out of the schema; a field with a deserializer of its own), from what the client
    /// answered to an input request, or from a round's state (retired or expired since it
    /// was sealed, perhaps), and would reach the handler unchecked.
    static CHECKED: std::cell::RefCell<Option<Vec<(String, String)>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `read`, which reads a call's input (its arguments, the answers to its input
/// requests, its round's state) into its handler's types, accepting as handles only
/// `checked` (the records the core checked for the call).
pub(crate) fn reading_input<'a, T>(
    checked: impl Iterator<Item = &'a HandleRecord>,
    read: impl FnOnce() -> T,
) -> T {
    /// Puts back what was there before, however `read` ends.
    struct Restore(Option<Vec<(String, String)>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CHECKED.with(|checked| *checked.borrow_mut() = self.0.take());
        }
    }
    let ids = checked
        .map(|record| (record.id.clone(), record.kind.clone()))
        .collect();
    let _restore = Restore(CHECKED.with(|checked| checked.borrow_mut().replace(ids)));
    read()
}

impl<K: HandleKind> JsonSchema for Handle<K> {
    fn inline_schema() -> bool {
        // Inline, so the core finds the marker among the tool's top-level properties.
        true
    }

    fn schema_name() -> Cow<'static, str> {
        Cow::Owned(format!("{}Handle", K::KIND))
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let idle = match K::IDLE_TTL {
            Some(idle) => format!(", or after {} without use", human(idle)),
            None => String::new(),
        };
        json_schema!({
            "type": "string",
            "description": format!(
                "An {} handle ({}_…) as returned by {}. It expires {} after creation{}; after that, start again with {}.",
                K::KIND, K::PREFIX, K::CREATED_BY, human(K::TTL), idle, K::CREATED_BY
            ),
            SCHEMA_KEYWORD: { "kind": K::KIND, "createdBy": K::CREATED_BY },
        })
    }
}

/// A duration as a person writes it: "24 h", "90 min", "30 s", "1500 ms".
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 && d.subsec_nanos() != 0 {
        format!("{} ms", d.as_millis())
    } else if s >= 3600 && s % 3600 == 0 {
        format!("{} h", s / 3600)
    } else if s >= 60 && s % 60 == 0 {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_person_writes_them() {
        let cases = [
            (Duration::from_secs(86_400), "24 h"),
            (Duration::from_secs(5_400), "90 min"),
            (Duration::from_secs(90), "90 s"),
            (Duration::from_secs(2), "2 s"),
            (Duration::from_millis(1_500), "1500 ms"),
            (Duration::from_millis(500), "500 ms"),
        ];
        for (d, said) in cases {
            assert_eq!(human(d), said, "{d:?}");
        }
    }

    struct Thing;
    impl HandleKind for Thing {
        const KIND: &'static str = "thing";
        const PREFIX: &'static str = "thg";
        const CREATED_BY: &'static str = "thing_new";
        const TTL: Duration = Duration::from_secs(3600);
        const IDLE_TTL: Option<Duration> = Some(Duration::from_secs(60));
    }

    #[test]
    fn minted_ids_are_prefixed_128_bit_and_distinct() {
        let owner = Principal::new("u").unwrap();
        let a = HandleRecord::mint::<Thing>(&owner, 0);
        let b = HandleRecord::mint::<Thing>(&owner, 0);
        assert!(a.id.starts_with("thg_"));
        assert_eq!(a.id.len(), 4 + 32);
        assert_ne!(a.id, b.id);
        assert_eq!(a.expires_at, 3_600_000);
        assert_eq!(a.idle_ms, Some(60_000));
    }

    #[test]
    fn expiry_distinguishes_lifetime_and_idleness() {
        let mut h = HandleRecord::mint::<Thing>(&Principal::new("u").unwrap(), 0);
        assert_eq!(h.expired(59_999), None);
        assert_eq!(h.expired(60_000), Some(Expiry::Idle));
        h.last_used_at = 3_590_000;
        assert_eq!(h.expired(3_599_999), None);
        assert_eq!(h.expired(3_600_000), Some(Expiry::Lifetime));
    }

    #[test]
    fn schema_is_a_marked_string_that_states_the_lifetime() {
        let schema = schemars::schema_for!(Handle<Thing>);
        let v = schema.as_value();
        assert_eq!(v["type"], "string");
        assert_eq!(v[SCHEMA_KEYWORD]["kind"], "thing");
        let text = v["description"].as_str().unwrap();
        assert!(text.contains("1 h after creation"), "{text}");
        assert!(text.contains("1 min without use"), "{text}");
    }
}
