use serde::{Deserialize, Serialize};

use super::{CacheHints, ResultMeta, ResultType, ServerCapabilities};

/// Result of `server/discover`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoverResult {
    pub result_type: ResultType,
    pub supported_versions: Vec<String>,
    pub capabilities: ServerCapabilities,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Caching hints: always set by this server; absent from older servers (read as `ttlMs: 0`).
    #[serde(flatten)]
    pub cache: Option<CacheHints>,
    #[serde(
        rename = "_meta",
        default,
        skip_serializing_if = "ResultMeta::is_empty"
    )]
    pub meta: ResultMeta,
}
