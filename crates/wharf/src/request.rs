//! A request as the core takes it: its method known, its params typed, its `_meta` read,
//! and who it comes from.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wharf_protocol::{
    CallToolParams, CompleteParams, GetPromptParams, ListenParams, PaginatedParams,
    ReadResourceParams, RequestId, RequestMeta, RequestParams, ServerCapabilities, methods,
};

use crate::error::{ErrorKind, RpcError};
use crate::meta::RequestInfo;
use crate::metrics::OutcomeCell;
use crate::principal::Principal;
use crate::session::Session;

/// Serialized JSON-RPC messages for the response stream of one request, in order.
pub type Outbox = mpsc::Sender<Vec<u8>>;

/// What a request asks for, with its params read into their types.
#[derive(Debug)]
#[non_exhaustive]
pub enum RequestBody {
    /// `server/discover`.
    Discover,
    /// `tools/list`, from `cursor`.
    ListTools {
        /// Where the previous page ended.
        cursor: Option<String>,
    },
    /// `tools/call`.
    CallTool(Box<CallToolParams>),
    /// `resources/list`, from `cursor`.
    ListResources {
        /// Where the previous page ended.
        cursor: Option<String>,
    },
    /// `resources/templates/list`, from `cursor`.
    ListResourceTemplates {
        /// Where the previous page ended.
        cursor: Option<String>,
    },
    /// `resources/read`.
    ReadResource(Box<ReadResourceParams>),
    /// `prompts/list`, from `cursor`.
    ListPrompts {
        /// Where the previous page ended.
        cursor: Option<String>,
    },
    /// `prompts/get`.
    GetPrompt(Box<GetPromptParams>),
    /// `completion/complete`.
    Complete(Box<CompleteParams>),
    /// `subscriptions/listen`.
    Listen(Box<ListenParams>),
}

impl RequestBody {
    /// The method name.
    pub fn method(&self) -> &'static str {
        match self {
            RequestBody::Discover => methods::DISCOVER,
            RequestBody::ListTools { .. } => methods::TOOLS_LIST,
            RequestBody::CallTool(_) => methods::TOOLS_CALL,
            RequestBody::ListResources { .. } => methods::RESOURCES_LIST,
            RequestBody::ListResourceTemplates { .. } => methods::RESOURCES_TEMPLATES_LIST,
            RequestBody::ReadResource(_) => methods::RESOURCES_READ,
            RequestBody::ListPrompts { .. } => methods::PROMPTS_LIST,
            RequestBody::GetPrompt(_) => methods::PROMPTS_GET,
            RequestBody::Complete(_) => methods::COMPLETION_COMPLETE,
            RequestBody::Listen(_) => methods::SUBSCRIPTIONS_LISTEN,
        }
    }

    /// The value `Mcp-Name` must mirror, for the methods that have one.
    pub fn name(&self) -> Option<&str> {
        match self {
            RequestBody::CallTool(p) => Some(&p.name),
            RequestBody::GetPrompt(p) => Some(&p.name),
            RequestBody::ReadResource(p) => Some(&p.uri),
            _ => None,
        }
    }
}

/// A request whose method is known, params typed and `_meta` complete.
#[derive(Debug)]
pub struct ParsedRequest {
    /// The JSON-RPC id, echoed by the response.
    pub id: RequestId,
    /// The validated `_meta`. Boxed: it is large, and moving it through every future layer
    /// costs copies.
    pub info: Box<RequestInfo>,
    /// The method and its params.
    pub body: RequestBody,
}

impl ParsedRequest {
    /// Whether this is a `subscriptions/listen` request.
    pub fn is_listen(&self) -> bool {
        matches!(self.body, RequestBody::Listen(_))
    }
}

/// Who a request acts for and how to reach them while it runs: what the core keeps of the
/// transport's side of one request.
pub struct Caller {
    /// Who the request acts for, resolved by the transport before anything else ran.
    pub(crate) principal: Principal,
    /// Cancelled when the client goes away or cancels; `None` when nothing can cancel the
    /// request (a plain JSON response), which spares the bookkeeping.
    pub(crate) cancel: Option<CancellationToken>,
    /// Where notifications for this request go; `None` when the response is not a stream.
    pub(crate) outbox: Option<Outbox>,
    /// Where the method says how it ended, when the request is counted or traced.
    pub(crate) outcome: Option<Arc<OutcomeCell>>,
}

impl Caller {
    /// Who the request acts for.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// Whether the request was cancelled (the client went away or cancelled it).
    pub fn is_cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
    }
}

trait HasMeta {
    fn take_meta(&mut self) -> Option<RequestMeta>;
}

macro_rules! has_meta {
    ($($t:ty),*) => {$(
        impl HasMeta for $t {
            fn take_meta(&mut self) -> Option<RequestMeta> { self.meta.take() }
        }
    )*};
}
has_meta!(
    RequestParams,
    PaginatedParams,
    CallToolParams,
    ReadResourceParams,
    GetPromptParams,
    CompleteParams,
    ListenParams
);

fn read_params<T: DeserializeOwned + HasMeta>(
    params: Option<&RawValue>,
) -> Result<(T, Option<RequestMeta>), RpcError> {
    let text = params.map_or("{}", RawValue::get);
    let mut value: T = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Err(params_error::<T>(text, e)),
    };
    let meta = value.take_meta();
    Ok((value, meta))
}

/// Names what is wrong with params that did not parse. Only the failure path pays for
/// tracking where the error is: a malformed `_meta` is refused before dispatch (HTTP 400),
/// anything else is an invalid param of the method.
fn params_error<T: DeserializeOwned>(text: &str, e: serde_json::Error) -> RpcError {
    let mut de = serde_json::Deserializer::from_str(text);
    let path = match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Err(err) => err.path().to_string(),
        Ok(_) => String::new(),
    };
    if path == "_meta" || path.starts_with("_meta.") {
        RpcError::new(
            ErrorKind::MalformedMeta,
            format!("Invalid params: malformed {path}: {e}"),
        )
    } else if path.is_empty() || path == "." {
        RpcError::invalid_params(format!("Invalid params: {e}"))
    } else {
        RpcError::invalid_params(format!("Invalid params: {path}: {e}"))
    }
}

/// Reads a request: the method must exist (and its capability be offered), the params must
/// have their type, and `_meta` its required fields. The version is checked in admission, so
/// a transport can first compare headers.
pub(crate) fn parse(
    caps: &ServerCapabilities,
    id: RequestId,
    method: &str,
    params: Option<&RawValue>,
) -> Result<ParsedRequest, (RpcError, RequestId)> {
    match read_request(caps, method, params, None) {
        Ok((info, body)) => Ok(ParsedRequest { id, info, body }),
        Err(e) => Err((e, id)),
    }
}

/// Reads a request of a legacy session: as [`parse`], except that what `_meta` must carry
/// in 2026-07-28 comes from the session, and the methods of that revision alone do not
/// exist here.
pub(crate) fn parse_in_session(
    caps: &ServerCapabilities,
    session: &Session,
    id: RequestId,
    method: &str,
    params: Option<&RawValue>,
) -> Result<ParsedRequest, RpcError> {
    if method == methods::DISCOVER || method == methods::SUBSCRIPTIONS_LISTEN {
        return Err(RpcError::method_not_found(method));
    }
    let (info, body) = read_request(caps, method, params, Some(session))?;
    Ok(ParsedRequest { id, info, body })
}

fn read_request(
    caps: &ServerCapabilities,
    method: &str,
    params: Option<&RawValue>,
    session: Option<&Session>,
) -> Result<(Box<RequestInfo>, RequestBody), RpcError> {
    let offered = |present: bool| {
        if present {
            Ok(())
        } else {
            Err(RpcError::method_not_found(method))
        }
    };
    let (body, meta) = match method {
        methods::DISCOVER => (
            RequestBody::Discover,
            read_params::<RequestParams>(params)?.1,
        ),
        methods::TOOLS_LIST => {
            offered(caps.tools.is_some())?;
            let (p, m) = read_params::<PaginatedParams>(params)?;
            (RequestBody::ListTools { cursor: p.cursor }, m)
        }
        methods::TOOLS_CALL => {
            offered(caps.tools.is_some())?;
            let (p, m) = read_params::<CallToolParams>(params)?;
            (RequestBody::CallTool(Box::new(p)), m)
        }
        methods::PROMPTS_LIST => {
            offered(caps.prompts.is_some())?;
            let (p, m) = read_params::<PaginatedParams>(params)?;
            (RequestBody::ListPrompts { cursor: p.cursor }, m)
        }
        methods::PROMPTS_GET => {
            offered(caps.prompts.is_some())?;
            let (p, m) = read_params::<GetPromptParams>(params)?;
            (RequestBody::GetPrompt(Box::new(p)), m)
        }
        methods::RESOURCES_LIST => {
            offered(caps.resources.is_some())?;
            let (p, m) = read_params::<PaginatedParams>(params)?;
            (RequestBody::ListResources { cursor: p.cursor }, m)
        }
        methods::RESOURCES_TEMPLATES_LIST => {
            offered(caps.resources.is_some())?;
            let (p, m) = read_params::<PaginatedParams>(params)?;
            (RequestBody::ListResourceTemplates { cursor: p.cursor }, m)
        }
        methods::RESOURCES_READ => {
            offered(caps.resources.is_some())?;
            let (p, m) = read_params::<ReadResourceParams>(params)?;
            (RequestBody::ReadResource(Box::new(p)), m)
        }
        methods::COMPLETION_COMPLETE => {
            offered(caps.completions.is_some())?;
            let (p, m) = read_params::<CompleteParams>(params)?;
            (RequestBody::Complete(Box::new(p)), m)
        }
        methods::SUBSCRIPTIONS_LISTEN => {
            let (p, m) = read_params::<ListenParams>(params)?;
            (RequestBody::Listen(Box::new(p)), m)
        }
        _ => return Err(RpcError::method_not_found(method)),
    };
    let info = match session {
        None => RequestInfo::from_meta(meta)?,
        Some(s) => RequestInfo::in_session(s, meta),
    };
    Ok((Box::new(info), body))
}
