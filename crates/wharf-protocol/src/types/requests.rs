//! Params of the requests a client sends.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    CompletionArgument, CompletionContext, CompletionReference, InputResponses, JsonObject,
    SubscriptionFilter, unique,
};
use crate::meta::{RequestMeta, object, object_only};

/// Params with only `_meta` (`server/discover`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestParams {
    #[serde(
        rename = "_meta",
        default,
        deserialize_with = "object_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub meta: Option<RequestMeta>,
}

/// Params of the list requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PaginatedParams {
    #[serde(
        rename = "_meta",
        default,
        deserialize_with = "object_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub meta: Option<RequestMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// Params of `tools/call`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallToolParams {
    #[serde(
        rename = "_meta",
        default,
        deserialize_with = "object_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub meta: Option<RequestMeta>,
    pub name: String,
    #[serde(
        default,
        deserialize_with = "unique::object",
        skip_serializing_if = "Option::is_none"
    )]
    pub arguments: Option<JsonObject>,
    #[serde(
        default,
        deserialize_with = "unique::values",
        skip_serializing_if = "Option::is_none"
    )]
    pub input_responses: Option<InputResponses>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_state: Option<String>,
}

/// Params of `resources/read`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadResourceParams {
    #[serde(
        rename = "_meta",
        default,
        deserialize_with = "object_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub meta: Option<RequestMeta>,
    pub uri: String,
    #[serde(
        default,
        deserialize_with = "unique::values",
        skip_serializing_if = "Option::is_none"
    )]
    pub input_responses: Option<InputResponses>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_state: Option<String>,
}

/// Params of `prompts/get`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetPromptParams {
    #[serde(
        rename = "_meta",
        default,
        deserialize_with = "object_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub meta: Option<RequestMeta>,
    pub name: String,
    #[serde(
        default,
        deserialize_with = "unique::strings",
        skip_serializing_if = "Option::is_none"
    )]
    pub arguments: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        deserialize_with = "unique::values",
        skip_serializing_if = "Option::is_none"
    )]
    pub input_responses: Option<InputResponses>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_state: Option<String>,
}

/// Params of `completion/complete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompleteParams {
    #[serde(
        rename = "_meta",
        default,
        deserialize_with = "object_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub meta: Option<RequestMeta>,
    #[serde(rename = "ref")]
    pub reference: CompletionReference,
    #[serde(deserialize_with = "object")]
    pub argument: CompletionArgument,
    #[serde(
        default,
        deserialize_with = "object_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub context: Option<CompletionContext>,
}

/// Params of `subscriptions/listen`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListenParams {
    #[serde(
        rename = "_meta",
        default,
        deserialize_with = "object_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub meta: Option<RequestMeta>,
    #[serde(deserialize_with = "object")]
    pub notifications: SubscriptionFilter,
}
