//! Messages of the initialization-based era (2025-11-25, 2025-06-18, 2025-03-26) that a
//! dual-era server answers: the lifecycle, `logging/setLevel` and resource subscriptions.

use serde::{Deserialize, Serialize};

use super::{ClientCapabilities, Implementation, JsonObject, LoggingLevel, ServerCapabilities};

/// Params of `initialize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    pub protocol_version: String,
    pub capabilities: ClientCapabilities,
    pub client_info: Implementation,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
}

/// The result of `initialize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    pub protocol_version: String,
    pub capabilities: ServerCapabilities,
    pub server_info: Implementation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

/// Params of `logging/setLevel`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetLevelParams {
    pub level: LoggingLevel,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
}

/// Params of `resources/subscribe` and `resources/unsubscribe`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubscribeParams {
    pub uri: String,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
}
