use std::sync::Arc;
use std::time::Duration;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::{Implementation, JsonObject};
use crate::meta;

/// `resultType` of a result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultType {
    /// The request is answered.
    #[default]
    Complete,
    /// The client must answer `inputRequests` and retry (MRTR).
    InputRequired,
}

/// Who may cache a result. `Private` by default: a result is shared between users only
/// where its server says it may be.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    /// Any client or intermediary may reuse the result, for any user.
    Public,
    /// Only the same authorization context (the same token, the same user) may reuse it.
    #[default]
    Private,
}

/// Caching hints carried by cacheable results. The default is private and stale at once.
///
/// ```
/// use std::time::Duration;
/// use wharf_protocol::{CacheHints, CacheScope};
///
/// let shared = CacheHints::public(Duration::from_secs(60));
/// assert_eq!((shared.ttl_ms, shared.cache_scope), (60_000, CacheScope::Public));
/// assert_eq!(CacheHints::default(), CacheHints::private(Duration::ZERO));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheHints {
    pub ttl_ms: u64,
    pub cache_scope: CacheScope,
}

impl CacheHints {
    /// Fresh for `ttl`, for anyone: a result that holds nothing of the user's.
    pub fn public(ttl: Duration) -> Self {
        Self::for_scope(ttl, CacheScope::Public)
    }

    /// Fresh for `ttl`, for the same authorization context only.
    pub fn private(ttl: Duration) -> Self {
        Self::for_scope(ttl, CacheScope::Private)
    }

    fn for_scope(ttl: Duration, cache_scope: CacheScope) -> Self {
        CacheHints {
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            cache_scope,
        }
    }
}

impl Default for CacheHints {
    fn default() -> Self {
        Self::private(Duration::ZERO)
    }
}

/// A server's identity together with its JSON, written once: stamping it on every result
/// then costs a reference count and a copy of bytes, not a serialization.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    info: Arc<Implementation>,
    json: Arc<RawValue>,
}

impl ServerInfo {
    /// Wraps `info`.
    pub fn new(info: Implementation) -> Self {
        // Serializing a struct of strings into memory cannot fail.
        let json =
            serde_json::value::to_raw_value(&info).unwrap_or_else(|_| RawValue::NULL.to_owned());
        let json = Arc::from(json);
        ServerInfo {
            info: Arc::new(info),
            json,
        }
    }

    /// The identity.
    pub fn get(&self) -> &Implementation {
        &self.info
    }
}

impl Serialize for ServerInfo {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(serializer)
    }
}

impl PartialEq for ServerInfo {
    fn eq(&self, other: &Self) -> bool {
        self.info == other.info
    }
}

impl std::ops::Deref for ServerInfo {
    type Target = Implementation;
    fn deref(&self) -> &Implementation {
        &self.info
    }
}

/// The `_meta` of a result: the server's identity first, then anything else.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResultMeta {
    pub server_info: Option<ServerInfo>,
    pub extra: JsonObject,
}

impl ResultMeta {
    /// Meta holding only the server's identity.
    pub fn server(info: ServerInfo) -> Self {
        ResultMeta {
            server_info: Some(info),
            extra: JsonObject::new(),
        }
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.server_info.is_none() && self.extra.is_empty()
    }
}

impl Serialize for ResultMeta {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if let Some(info) = &self.server_info {
            map.serialize_entry(meta::SERVER_INFO, info)?;
        }
        for (k, v) in &self.extra {
            if k != meta::SERVER_INFO || self.server_info.is_none() {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for ResultMeta {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ResultMeta;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a _meta object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<ResultMeta, A::Error> {
                let mut out = ResultMeta::default();
                while let Some(key) = access.next_key::<String>()? {
                    if key == meta::SERVER_INFO {
                        out.server_info = Some(ServerInfo::new(access.next_value()?));
                    } else {
                        out.extra.insert(key, access.next_value()?);
                    }
                }
                Ok(out)
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// A result with no members of its own (`EmptyResult`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmptyResult {
    pub result_type: ResultType,
    #[serde(
        rename = "_meta",
        default,
        skip_serializing_if = "ResultMeta::is_empty"
    )]
    pub meta: ResultMeta,
}
