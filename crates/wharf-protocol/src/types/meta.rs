//! The `_meta` object of a stateless request, and the reserved keys.

use serde::{Deserialize, Serialize};

use crate::types::{ClientCapabilities, Implementation, LoggingLevel, ProgressToken};

/// `_meta` key: the protocol revision of this request (required).
pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: the client's capabilities for this request (required).
pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key: who the client is (optional).
pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key: the lowest log level the client wants as `notifications/message`.
pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// `_meta` key on results: who the server is.
pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// `_meta` key on listen-stream messages: the listen request's id.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
/// `_meta` key: progress token.
pub const PROGRESS_TOKEN: &str = "progressToken";

/// Whether `key` is written as the specification says `_meta` keys are (and not empty): an
/// optional prefix of dot-separated labels and a `/` (each label a letter first, a letter
/// or digit last, letters, digits and hyphens between), then a name that, unless empty,
/// begins and ends with a letter or digit and holds only those, hyphens, underscores and
/// dots.
///
/// ```
/// use wharf_protocol::meta::is_meta_key;
///
/// assert!(is_meta_key("com.example/ui-hint") && is_meta_key("progressToken"));
/// assert!(!is_meta_key("example.com/-x") && !is_meta_key("9lives/x") && !is_meta_key("a b"));
/// ```
pub fn is_meta_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let label = |l: &str| {
        let b = l.as_bytes();
        b.first().is_some_and(u8::is_ascii_alphabetic)
            && b.last().is_some_and(u8::is_ascii_alphanumeric)
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
    };
    let name_ok = name.is_empty()
        || (name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric())
            && name
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c)));
    !key.is_empty() && name_ok && prefix.is_none_or(|p| p.split('.').all(label))
}

/// The `_meta` of a request, as sent by the client.
///
/// Required fields are `Option` here so that their absence is reported by the server with a
/// message naming the field, rather than by a generic deserialization error.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RequestMeta {
    #[serde(
        rename = "io.modelcontextprotocol/protocolVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub protocol_version: Option<String>,
    #[serde(
        rename = "io.modelcontextprotocol/clientCapabilities",
        default,
        deserialize_with = "object_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub client_capabilities: Option<ClientCapabilities>,
    #[serde(
        rename = "io.modelcontextprotocol/clientInfo",
        default,
        deserialize_with = "object_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub client_info: Option<Implementation>,
    #[serde(
        rename = "io.modelcontextprotocol/logLevel",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub log_level: Option<LoggingLevel>,
    #[serde(
        rename = "progressToken",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub progress_token: Option<ProgressToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<String>,
    /// Every other member: what a client or an extension sends under its own prefix
    /// (`com.example/tenant`), for the application to read. Each object in it names every
    /// member once.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// A member of a request's `_meta`, told apart by its name without a copy of names the
/// protocol defines.
enum MetaKey {
    ProtocolVersion,
    ClientCapabilities,
    ClientInfo,
    LogLevel,
    ProgressToken,
    Traceparent,
    Tracestate,
    Baggage,
    Other(String),
}

impl<'de> Deserialize<'de> for MetaKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = MetaKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<MetaKey, E> {
                Ok(match name {
                    PROTOCOL_VERSION => MetaKey::ProtocolVersion,
                    CLIENT_CAPABILITIES => MetaKey::ClientCapabilities,
                    CLIENT_INFO => MetaKey::ClientInfo,
                    LOG_LEVEL => MetaKey::LogLevel,
                    PROGRESS_TOKEN => MetaKey::ProgressToken,
                    "traceparent" => MetaKey::Traceparent,
                    "tracestate" => MetaKey::Tracestate,
                    "baggage" => MetaKey::Baggage,
                    other => MetaKey::Other(other.to_owned()),
                })
            }
        }
        d.deserialize_identifier(Name)
    }
}

/// An object-only field's value ([`object_only`]).
struct ObjectOnly<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        object_only(d).map(ObjectOnly)
    }
}

/// Read by hand to keep the members the protocol does not define ([`RequestMeta::other`]):
/// serde's `flatten` would buffer the whole object first, on every request.
impl<'de> Deserialize<'de> for RequestMeta {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = RequestMeta;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RequestMeta, A::Error> {
                use super::unique::{Members as _, UniqueValue, twice};
                use serde::de::Error as _;
                let mut meta = RequestMeta::default();
                // The defined members read so far, `null` ones included: a second is refused,
                // as a derived reader refuses it.
                let mut seen = [false; 8];
                while let Some(key) = map.next_key::<MetaKey>()? {
                    let (at, name) = match &key {
                        MetaKey::ProtocolVersion => (0, PROTOCOL_VERSION),
                        MetaKey::ClientCapabilities => (1, CLIENT_CAPABILITIES),
                        MetaKey::ClientInfo => (2, CLIENT_INFO),
                        MetaKey::LogLevel => (3, LOG_LEVEL),
                        MetaKey::ProgressToken => (4, PROGRESS_TOKEN),
                        MetaKey::Traceparent => (5, "traceparent"),
                        MetaKey::Tracestate => (6, "tracestate"),
                        MetaKey::Baggage => (7, "baggage"),
                        MetaKey::Other(_) => (usize::MAX, ""),
                    };
                    if let Some(seen) = seen.get_mut(at) {
                        if std::mem::replace(seen, true) {
                            return Err(A::Error::duplicate_field(name));
                        }
                    }
                    match key {
                        MetaKey::ProtocolVersion => meta.protocol_version = map.next_value()?,
                        MetaKey::ClientCapabilities => {
                            meta.client_capabilities = map.next_value::<ObjectOnly<_>>()?.0
                        }
                        MetaKey::ClientInfo => {
                            meta.client_info = map.next_value::<ObjectOnly<_>>()?.0
                        }
                        MetaKey::LogLevel => meta.log_level = map.next_value()?,
                        MetaKey::ProgressToken => meta.progress_token = map.next_value()?,
                        MetaKey::Traceparent => meta.traceparent = map.next_value()?,
                        MetaKey::Tracestate => meta.tracestate = map.next_value()?,
                        MetaKey::Baggage => meta.baggage = map.next_value()?,
                        MetaKey::Other(name) => {
                            let value = map.next_value_seed(UniqueValue)?;
                            if let Err(name) = meta.other.insert_new(name, value) {
                                return Err(A::Error::custom(twice(&name)));
                            }
                        }
                    }
                }
                Ok(meta)
            }
        }
        d.deserialize_map(Members)
    }
}

/// Reads a struct only from a JSON object: serde's derived readers also take the positional
/// (array) form, which no MCP message uses. Costs nothing over the derived reader.
pub(crate) fn object<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ObjectOnly<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for ObjectOnly<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    deserializer.deserialize_map(ObjectOnly(std::marker::PhantomData))
}

/// [`object`] for an optional field (with `#[serde(default)]` for its absence): `null`
/// reads as absent, as it does for any `Option`.
pub(crate) fn object_only<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Optional<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Optional<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object or null")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            object(d).map(Some)
        }
    }
    deserializer.deserialize_option(Optional(std::marker::PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<RequestMeta, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn members_the_protocol_does_not_define_are_kept() {
        let meta = read(
            r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
                "com.example/tenant":"acme","com.example/hints":{"a":[1,{"b":null}]},
                "progressToken":7,"traceparent":null}"#,
        )
        .unwrap();
        assert_eq!(meta.protocol_version.as_deref(), Some("2026-07-28"));
        assert_eq!(meta.progress_token, Some(ProgressToken::Number(7)));
        assert_eq!(meta.traceparent, None);
        assert_eq!(
            serde_json::Value::Object(meta.other.clone()),
            serde_json::json!({ "com.example/tenant": "acme", "com.example/hints": {"a": [1, {"b": null}]} })
        );
        // Written back as one object, as read.
        let again: RequestMeta =
            serde_json::from_value(serde_json::to_value(&meta).unwrap()).unwrap();
        assert_eq!(again, meta);
    }

    #[test]
    fn a_member_twice_is_refused_at_any_depth() {
        for (text, refusal) in [
            (
                r#"{"com.example/x":1,"com.example/x":2}"#,
                r#"the member "com.example/x" is there twice"#,
            ),
            (
                r#"{"com.example/x":{"y":1,"y":2}}"#,
                r#"the member "y" is there twice"#,
            ),
            // A defined member counts once it is there, even as null.
            (
                r#"{"traceparent":null,"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}"#,
                "duplicate field `traceparent`",
            ),
            (
                r#"{"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientCapabilities":{}}"#,
                "duplicate field `io.modelcontextprotocol/clientCapabilities`",
            ),
        ] {
            let e = read(text).unwrap_err();
            assert!(e.contains(refusal), "{text}: {e}");
        }
    }

    #[test]
    fn defined_members_keep_their_rules() {
        // Capabilities and client info are objects, never the positional form.
        let e = read(r#"{"io.modelcontextprotocol/clientInfo":["n","1"]}"#).unwrap_err();
        assert!(e.contains("a JSON object"), "{e}");
        let e = read(r#"{"io.modelcontextprotocol/logLevel":"loud"}"#).unwrap_err();
        assert!(e.contains("unknown variant"), "{e}");
        let e = read(r#"["2026-07-28"]"#).unwrap_err();
        assert!(e.contains("a JSON object"), "{e}");
    }
}
