//! Every example message of the specification reads into its Rust type and writes back as
//! the same JSON.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use wharf_protocol::*;

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../spec/2026-07-28/examples")
}

fn round_trip<T: DeserializeOwned + Serialize>(dir: &str) -> usize {
    let path = examples_dir().join(dir);
    let mut n = 0;
    for entry in std::fs::read_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
        let file = entry.unwrap().path();
        let text = std::fs::read_to_string(&file).unwrap();
        let original: Value = serde_json::from_str(&text).unwrap();
        let typed: T = serde_json::from_value(original.clone())
            .unwrap_or_else(|e| panic!("{} does not read as {dir}: {e}", file.display()));
        let back = serde_json::to_value(&typed).unwrap();
        assert!(
            same_json(&back, &original),
            "{} changed in a round trip:\n{back}\n{original}",
            file.display()
        );
        n += 1;
    }
    n
}

/// The `ListRootsRequest` example is an id and a method without the `jsonrpc` member.
#[derive(serde::Deserialize, Serialize)]
struct BareRequest {
    id: RequestId,
    method: String,
}

/// JSON equality where numbers compare by value (`50.0` is `50`).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

type Req<P> = Request<P>;
type Res<R> = Response<R>;
type Note<P> = Notification<P>;

macro_rules! examples {
    ($($dir:literal => $ty:ty,)*) => {
        #[test]
        fn every_example_round_trips() {
            let mut covered = std::collections::BTreeSet::new();
            let mut total = 0;
            $( total += round_trip::<$ty>($dir); covered.insert($dir.to_string()); )*
            let on_disk: std::collections::BTreeSet<String> = std::fs::read_dir(examples_dir())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            let missing: Vec<_> = on_disk.difference(&covered).collect();
            assert!(missing.is_empty(), "examples without a Rust type: {missing:?}");
            assert!(total >= 88, "only {total} examples read");
        }
    };
}

examples! {
    "AudioContent" => Content,
    "BlobResourceContents" => BlobResourceContents,
    "BooleanSchema" => JsonObject,
    "CallToolRequest" => Req<CallToolParams>,
    "CallToolRequestParams" => CallToolParams,
    "CallToolResult" => CallToolResult,
    "CallToolResultResponse" => Res<CallToolResult>,
    "CancelledNotification" => Note<CancelledParams>,
    "CancelledNotificationParams" => CancelledParams,
    "ClientCapabilities" => ClientCapabilities,
    "CompleteRequest" => Req<CompleteParams>,
    "CompleteRequestParams" => CompleteParams,
    "CompleteResult" => CompleteResult,
    "CompleteResultResponse" => Res<CompleteResult>,
    "CreateMessageRequest" => InputRequest,
    "CreateMessageRequestParams" => CreateMessageParams,
    "CreateMessageResult" => CreateMessageResult,
    "DiscoverRequest" => Req<RequestParams>,
    "DiscoverResult" => DiscoverResult,
    "DiscoverResultResponse" => Res<DiscoverResult>,
    "ElicitRequest" => InputRequest,
    "ElicitRequestFormParams" => ElicitParams,
    "ElicitRequestURLParams" => ElicitParams,
    "ElicitResult" => ElicitResult,
    "EmbeddedResource" => Content,
    "GetPromptRequest" => Req<GetPromptParams>,
    "GetPromptRequestParams" => GetPromptParams,
    "GetPromptResult" => GetPromptResult,
    "GetPromptResultResponse" => Res<GetPromptResult>,
    "HeaderMismatchError" => ErrorResponse,
    "ImageContent" => Content,
    "InputRequests" => InputRequests,
    "InputRequiredResult" => InputRequiredResult,
    "InputResponses" => std::collections::BTreeMap<String, InputResponse>,
    "InternalError" => ErrorObject,
    "InvalidParamsError" => ErrorObject,
    "ListPromptsRequest" => Req<PaginatedParams>,
    "ListPromptsResult" => ListPromptsResult,
    "ListPromptsResultResponse" => Res<ListPromptsResult>,
    "ListResourceTemplatesRequest" => Req<PaginatedParams>,
    "ListResourceTemplatesResult" => ListResourceTemplatesResult,
    "ListResourceTemplatesResultResponse" => Res<ListResourceTemplatesResult>,
    "ListResourcesRequest" => Req<PaginatedParams>,
    "ListResourcesResult" => ListResourcesResult,
    "ListResourcesResultResponse" => Res<ListResourcesResult>,
    "ListRootsRequest" => BareRequest,
    "ListRootsResult" => ListRootsResult,
    "ListToolsRequest" => Req<PaginatedParams>,
    "ListToolsResult" => ListToolsResult,
    "ListToolsResultResponse" => Res<ListToolsResult>,
    "LoggingMessageNotification" => Note<LoggingMessageParams>,
    "LoggingMessageNotificationParams" => LoggingMessageParams,
    "MethodNotFoundError" => ErrorObject,
    "MissingRequiredClientCapabilityError" => ErrorResponse,
    "ModelPreferences" => ModelPreferences,
    "NumberSchema" => JsonObject,
    "PaginatedRequestParams" => PaginatedParams,
    "ParseError" => ErrorObject,
    "ProgressNotification" => Note<ProgressParams>,
    "ProgressNotificationParams" => ProgressParams,
    "PromptListChangedNotification" => Note<NotificationParams>,
    "ReadResourceRequest" => Req<ReadResourceParams>,
    "ReadResourceResult" => ReadResourceResult,
    "ReadResourceResultResponse" => Res<ReadResourceResult>,
    "Resource" => Resource,
    "ResourceLink" => Content,
    "ResourceListChangedNotification" => Note<NotificationParams>,
    "ResourceUpdatedNotification" => Note<ResourceUpdatedParams>,
    "ResourceUpdatedNotificationParams" => ResourceUpdatedParams,
    "Root" => Root,
    "SamplingMessage" => SamplingMessage,
    "ServerCapabilities" => ServerCapabilities,
    "StringSchema" => JsonObject,
    "SubscriptionsAcknowledgedNotification" => Note<SubscriptionsAcknowledgedParams>,
    "SubscriptionsListenRequest" => Req<ListenParams>,
    "SubscriptionsListenResult" => SubscriptionsListenResult,
    "SubscriptionsListenResultResponse" => Res<SubscriptionsListenResult>,
    "TextContent" => Content,
    "TextResourceContents" => TextResourceContents,
    "TitledMultiSelectEnumSchema" => JsonObject,
    "TitledSingleSelectEnumSchema" => JsonObject,
    "Tool" => Tool,
    "ToolListChangedNotification" => Note<NotificationParams>,
    "ToolResultContent" => ToolResultContent,
    "ToolUseContent" => ToolUseContent,
    "UnsupportedProtocolVersionError" => ErrorResponse,
    "UntitledMultiSelectEnumSchema" => JsonObject,
    "UntitledSingleSelectEnumSchema" => JsonObject,
}
