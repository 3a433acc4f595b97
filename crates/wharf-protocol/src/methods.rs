//! Method names of 2026-07-28.

pub const DISCOVER: &str = "server/discover";
pub const TOOLS_LIST: &str = "tools/list";
pub const TOOLS_CALL: &str = "tools/call";
pub const RESOURCES_LIST: &str = "resources/list";
pub const RESOURCES_TEMPLATES_LIST: &str = "resources/templates/list";
pub const RESOURCES_READ: &str = "resources/read";
pub const PROMPTS_LIST: &str = "prompts/list";
pub const PROMPTS_GET: &str = "prompts/get";
pub const COMPLETION_COMPLETE: &str = "completion/complete";
pub const SUBSCRIPTIONS_LISTEN: &str = "subscriptions/listen";

pub const ELICITATION_CREATE: &str = "elicitation/create";
pub const SAMPLING_CREATE_MESSAGE: &str = "sampling/createMessage";
pub const ROOTS_LIST: &str = "roots/list";

pub const NOTIFICATION_CANCELLED: &str = "notifications/cancelled";
pub const NOTIFICATION_PROGRESS: &str = "notifications/progress";
pub const NOTIFICATION_MESSAGE: &str = "notifications/message";
pub const NOTIFICATION_TOOLS_LIST_CHANGED: &str = "notifications/tools/list_changed";
pub const NOTIFICATION_PROMPTS_LIST_CHANGED: &str = "notifications/prompts/list_changed";
pub const NOTIFICATION_RESOURCES_LIST_CHANGED: &str = "notifications/resources/list_changed";
pub const NOTIFICATION_RESOURCE_UPDATED: &str = "notifications/resources/updated";
pub const NOTIFICATION_SUBSCRIPTIONS_ACKNOWLEDGED: &str =
    "notifications/subscriptions/acknowledged";

// The initialization-based era (2025-11-25 and earlier); a dual-era server serves these in
// legacy sessions only.
pub const INITIALIZE: &str = "initialize";
pub const PING: &str = "ping";
pub const LOGGING_SET_LEVEL: &str = "logging/setLevel";
pub const RESOURCES_SUBSCRIBE: &str = "resources/subscribe";
pub const RESOURCES_UNSUBSCRIBE: &str = "resources/unsubscribe";
pub const NOTIFICATION_INITIALIZED: &str = "notifications/initialized";
pub const NOTIFICATION_ROOTS_LIST_CHANGED: &str = "notifications/roots/list_changed";
