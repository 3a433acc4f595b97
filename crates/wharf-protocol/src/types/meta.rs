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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
