use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use super::JsonObject;
use crate::jsonrpc::RequestId;

/// A progress token: a string or an integer chosen by the client, echoed exactly. Integers
/// are taken up to 64 bits, signed or not (a client drawing random `u64` tokens is served);
/// beyond that, or with a fraction, a token is refused rather than echoed changed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub enum ProgressToken {
    /// An integer that fits in an `i64`.
    Number(i64),
    /// An integer above `i64::MAX`.
    Unsigned(u64),
    /// A string.
    String(String),
}

impl<'de> Deserialize<'de> for ProgressToken {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Token;

        impl Visitor<'_> for Token {
            type Value = ProgressToken;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an integer of at most 64 bits")
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<ProgressToken, E> {
                Ok(ProgressToken::Number(n))
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> Result<ProgressToken, E> {
                Ok(i64::try_from(n).map_or(ProgressToken::Unsigned(n), ProgressToken::Number))
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<ProgressToken, E> {
                Ok(ProgressToken::String(s.to_owned()))
            }

            fn visit_string<E: de::Error>(self, s: String) -> Result<ProgressToken, E> {
                Ok(ProgressToken::String(s))
            }
        }

        deserializer.deserialize_any(Token)
    }
}

/// Params of `notifications/progress`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressParams {
    pub progress_token: ProgressToken,
    pub progress: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
}

/// Params of `notifications/cancelled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelledParams {
    pub request_id: RequestId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
}

/// Params of `notifications/resources/updated`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceUpdatedParams {
    pub uri: String,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
}

/// Params that carry only `_meta` (the list-changed notifications).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NotificationParams {
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
}

#[cfg(test)]
mod tests {
    use super::ProgressToken;
    use serde_json::{Value, json};

    fn read(v: Value) -> Result<ProgressToken, String> {
        serde_json::from_value(v.clone())
            .and_then(|t| {
                // From text too: the request body is read from bytes.
                let from_text: ProgressToken = serde_json::from_str(&v.to_string())?;
                assert_eq!(t, from_text);
                Ok(t)
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn integers_of_64_bits_signed_or_not_are_echoed_exactly() {
        for v in [
            json!(0),
            json!(-1),
            json!(i64::MIN),
            json!(i64::MAX),
            json!(1u64 << 63),
            json!(u64::MAX),
        ] {
            let token = read(v.clone()).unwrap();
            assert_eq!(serde_json::to_value(&token).unwrap(), v);
        }
        assert_eq!(read(json!(u64::MAX)), Ok(ProgressToken::Unsigned(u64::MAX)));
        assert_eq!(
            read(json!(7)),
            Ok(ProgressToken::Number(7)),
            "one form per value"
        );
        assert_eq!(read(json!("t")), Ok(ProgressToken::String("t".into())));
    }

    #[test]
    fn fractions_and_other_types_are_refused_naming_what_a_token_is() {
        for v in [
            json!(1.5),
            json!(1e20),
            json!(null),
            json!(true),
            json!([1]),
            json!({}),
        ] {
            let e = read(v.clone()).unwrap_err();
            assert!(
                e.contains("a string or an integer of at most 64 bits"),
                "{v}: {e}"
            );
        }
    }
}
