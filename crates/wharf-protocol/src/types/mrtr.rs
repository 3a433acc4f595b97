//! Multi-round-trip requests: `input_required` results and the client's answers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::methods;

use super::{
    CreateMessageParams, CreateMessageResult, ElicitParams, ElicitResult, JsonObject,
    ListRootsResult, ResultMeta, ResultType,
};

/// A request the server asks the client to fulfil before retrying.
#[derive(Debug, Clone, PartialEq)]
pub enum InputRequest {
    /// `elicitation/create`.
    Elicit(ElicitParams),
    /// `sampling/createMessage`.
    CreateMessage(CreateMessageParams),
    /// `roots/list`; its params are optional on the wire.
    ListRoots(Option<RootsListParams>),
}

#[derive(Serialize, Deserialize)]
struct WireInputRequest {
    method: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    params: Option<serde_json::Value>,
}

impl Serialize for InputRequest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let (method, params) = match self {
            InputRequest::Elicit(p) => (
                methods::ELICITATION_CREATE,
                Some(serde_json::to_value(p).map_err(S::Error::custom)?),
            ),
            InputRequest::CreateMessage(p) => (
                methods::SAMPLING_CREATE_MESSAGE,
                Some(serde_json::to_value(p).map_err(S::Error::custom)?),
            ),
            InputRequest::ListRoots(p) => (
                methods::ROOTS_LIST,
                p.as_ref()
                    .map(serde_json::to_value)
                    .transpose()
                    .map_err(S::Error::custom)?,
            ),
        };
        WireInputRequest {
            method: method.to_owned(),
            params,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for InputRequest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let wire = WireInputRequest::deserialize(deserializer)?;
        let params = || {
            wire.params
                .clone()
                .ok_or_else(|| D::Error::missing_field("params"))
        };
        match wire.method.as_str() {
            methods::ELICITATION_CREATE => {
                serde_json::from_value(params()?).map(InputRequest::Elicit)
            }
            methods::SAMPLING_CREATE_MESSAGE => {
                serde_json::from_value(params()?).map(InputRequest::CreateMessage)
            }
            methods::ROOTS_LIST => wire
                .params
                .clone()
                .map(serde_json::from_value)
                .transpose()
                .map(InputRequest::ListRoots),
            other => {
                return Err(D::Error::custom(format!(
                    "unknown input request method {other:?}"
                )));
            }
        }
        .map_err(D::Error::custom)
    }
}

/// Params of `roots/list` (only `_meta`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RootsListParams {
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
}

/// Input requests keyed by a server-chosen name.
pub type InputRequests = BTreeMap<String, InputRequest>;

/// The client's answer to one input request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum InputResponse {
    CreateMessage(Box<CreateMessageResult>),
    ListRoots(ListRootsResult),
    Elicit(ElicitResult),
}

/// Answers keyed like the input requests they answer. Values stay raw JSON so that a
/// malformed answer can be asked again rather than failing the whole request.
pub type InputResponses = BTreeMap<String, serde_json::Value>;

/// Result of a request that needs input from the client first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InputRequiredResult {
    pub result_type: ResultType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_requests: Option<InputRequests>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_state: Option<String>,
    #[serde(
        rename = "_meta",
        default,
        skip_serializing_if = "ResultMeta::is_empty"
    )]
    pub meta: ResultMeta,
}
