//! A request as the core takes it: its method known, its params typed, its `_meta` read,
//! and who it comes from.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wharf_protocol::{
    CallToolParams, CompleteParams, GetPromptParams, ListenParams, PaginatedParams,
    ReadResourceParams, RequestId, RequestMeta, RequestParams, ServerCapabilities, methods,
    one_pass,
};

use crate::error::{ErrorKind, RpcError};
use crate::meta::{RequestInfo, TraceContext, refusal_before_params};
use crate::metrics::OutcomeCell;
use crate::principal::Principal;
use crate::session::Session;
use crate::uri_template;

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
    /// Progress sent by earlier rounds on the same stream (a legacy call that asks).
    pub(crate) progress_floor: Option<Arc<ProgressFloor>>,
}

/// The last progress value a request sent, kept across the rounds of a legacy call that
/// asks for input: every round runs its handler again on the same stream, and the client
/// must still see progress only increase.
#[derive(Default)]
pub(crate) struct ProgressFloor(std::sync::Mutex<Option<f64>>);

impl ProgressFloor {
    pub(crate) fn get(&self) -> Option<f64> {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn set(&self, value: f64) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(value);
    }
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

/// Params that carry a `_meta`.
trait HasMeta {
    fn meta_mut(&mut self) -> &mut Option<RequestMeta>;
}

macro_rules! has_meta {
    ($($t:ty),*) => {$(
        impl HasMeta for $t {
            fn meta_mut(&mut self) -> &mut Option<RequestMeta> { &mut self.meta }
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

/// Where a method's params are read from: their raw text, or the body's own parser in the
/// single pass (see [`read`]).
trait Source: Sized {
    type Error;

    /// The params as `T`.
    fn parse<T: DeserializeOwned>(self) -> Result<T, Self::Error>;

    /// The refusal of a method this server does not have.
    fn not_found(method: &str) -> Self::Error;

    /// The refusal of a `_meta` that lacks what the request must say about itself.
    fn refused(e: RpcError) -> Self::Error;

    /// The params as `T`, and what the request says about itself, taken out of their
    /// `_meta`. Both boxed as soon as they are read: each is hundreds of bytes, and every
    /// layer they are returned through would copy them.
    fn read<T: DeserializeOwned + HasMeta>(
        self,
        reading: &Reading<'_>,
    ) -> Result<(Box<T>, Box<RequestInfo>), Self::Error> {
        let mut value: Box<T> = self.parse()?;
        let info = reading.info(value.meta_mut()).map_err(Self::refused)?;
        Ok((value, info))
    }
}

/// Where a request comes from, which decides what its `_meta` must carry.
struct Reading<'a> {
    caps: &'a ServerCapabilities,
    /// The versions the server speaks, which a refusal of the version lists.
    versions: &'a [&'static str],
    /// The legacy session it belongs to, if any.
    session: Option<&'a Session>,
}

impl Reading<'_> {
    /// What the request says about itself (see [`RequestInfo`]), with what it may ask of
    /// this server: a server that does not offer logging sends no log messages (the logging
    /// page: a server that emits them MUST declare the capability), so a `logLevel` asks it
    /// for nothing, and does not turn the response into a stream.
    fn info(&self, meta: &mut Option<RequestMeta>) -> Result<Box<RequestInfo>, RpcError> {
        let mut info = Box::new(match self.session {
            None => RequestInfo::take_from(meta, self.versions)?,
            Some(session) => RequestInfo::in_session(session, meta),
        });
        if self.caps.logging.is_none() {
            info.log_level = None;
        }
        // The params keep no `_meta`: what is left of it is not the request's to use.
        *meta = None;
        Ok(info)
    }
}

/// Params as raw JSON text (`{}` when absent); a failure names what is wrong.
struct RawParams<'a> {
    params: Option<&'a RawValue>,
    /// For a stateless request, whose `_meta` is judged first: the versions the server
    /// speaks, which a refusal of the version lists.
    stateless: Option<&'a [&'static str]>,
}

impl Source for RawParams<'_> {
    type Error = RpcError;

    fn parse<T: DeserializeOwned>(self) -> Result<T, RpcError> {
        let text = self.params.map_or("{}", RawValue::get);
        serde_json::from_str(text).map_err(|e| {
            let first = self
                .stateless
                .and_then(|versions| refusal_before_params(text, versions));
            first.unwrap_or_else(|| params_error::<T>(text, e))
        })
    }

    fn not_found(method: &str) -> RpcError {
        RpcError::method_not_found(method)
    }

    fn refused(e: RpcError) -> RpcError {
        e
    }
}

/// Params read where the body's parser stands; a failure sends the body the long way.
struct InPlace<'de, D>(D, PhantomData<&'de ()>);

impl<'de, D: serde::Deserializer<'de>> Source for InPlace<'de, D> {
    type Error = D::Error;

    fn parse<T: DeserializeOwned>(self) -> Result<T, D::Error> {
        T::deserialize(self.0)
    }

    fn not_found(_: &str) -> D::Error {
        serde::de::Error::custom("not a method of this server")
    }

    fn refused(_: RpcError) -> D::Error {
        serde::de::Error::custom("read the long way, which names what is missing")
    }
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
/// `versions`: those the server speaks, which a refusal of the version lists.
pub(crate) fn parse(
    caps: &ServerCapabilities,
    versions: &[&'static str],
    id: RequestId,
    method: &str,
    params: Option<&RawValue>,
) -> Result<ParsedRequest, (RpcError, RequestId)> {
    let reading = Reading {
        caps,
        versions,
        session: None,
    };
    let params = RawParams {
        params,
        stateless: Some(versions),
    };
    match read_body(&reading, method, params) {
        Ok((body, info)) => Ok(ParsedRequest { id, info, body }),
        Err(e) => Err((e, id)),
    }
}

/// Reads a well-formed request in one pass (see [`wharf_protocol::one_pass`]); `None` for
/// anything else, which [`parse`] then reads and refuses by name.
pub(crate) fn read(
    caps: &ServerCapabilities,
    versions: &[&'static str],
    body: &[u8],
    max_depth: usize,
) -> Option<ParsedRequest> {
    let reading = Reading {
        caps,
        versions,
        session: None,
    };
    let (id, (body, info)) = one_pass::read_request(body, max_depth, &Methods(reading))?;
    Some(ParsedRequest { id, info, body })
}

/// The method table as the single pass reads params.
struct Methods<'a>(Reading<'a>);

impl one_pass::ParamsReader for Methods<'_> {
    type Params = (RequestBody, Box<RequestInfo>);

    fn read<'de, D: serde::Deserializer<'de>>(
        &self,
        method: &str,
        params: D,
    ) -> Result<Self::Params, D::Error> {
        read_body(&self.0, method, InPlace(params, PhantomData))
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
    trace: TraceContext<'_>,
) -> Result<ParsedRequest, RpcError> {
    if method == methods::DISCOVER || method == methods::SUBSCRIPTIONS_LISTEN {
        return Err(RpcError::method_not_found(method));
    }
    let reading = Reading {
        caps,
        // A session's `_meta` never names a version: nothing here refuses one.
        versions: &[],
        session: Some(session),
    };
    let params = RawParams {
        params,
        stateless: None,
    };
    let (body, mut info) = read_body(&reading, method, params)?;
    info.adopt_trace(trace);
    Ok(ParsedRequest { id, info, body })
}

/// The most resources one subscription holds: a listen stream's `resourceSubscriptions`,
/// or a legacy session's subscriptions. Each is matched against every change announced.
pub(crate) const MAX_SUBSCRIPTIONS: usize = 1_000;
/// The URIs one subscription holds, together, in bytes: a stream keeps them for its life,
/// and a legacy session's record (rewritten whole on each change) carries them.
pub(crate) const MAX_SUBSCRIBED_BYTES: usize = 128 * 1024;
/// The longest URI a subscription holds, in bytes.
pub(crate) const MAX_URI_LEN: usize = 2_048;

/// The method table: which params each method takes, and which capability it needs.
fn read_body<S: Source>(
    reading: &Reading<'_>,
    method: &str,
    params: S,
) -> Result<(RequestBody, Box<RequestInfo>), S::Error> {
    let caps = reading.caps;
    let offered = |present: bool| {
        if present {
            Ok(())
        } else {
            Err(S::not_found(method))
        }
    };
    // A refusal of params that did read: a version the server does not speak is refused as
    // that first, as admission would, since another revision may allow what this one does
    // not.
    let refused = |info: &RequestInfo, e: RpcError| {
        S::refused(info.check_version(reading.versions).err().unwrap_or(e))
    };
    Ok(match method {
        methods::DISCOVER => (
            RequestBody::Discover,
            params.read::<RequestParams>(reading)?.1,
        ),
        methods::TOOLS_LIST => {
            offered(caps.tools.is_some())?;
            let (p, m) = params.read::<PaginatedParams>(reading)?;
            (RequestBody::ListTools { cursor: p.cursor }, m)
        }
        methods::TOOLS_CALL => {
            offered(caps.tools.is_some())?;
            let (p, m) = params.read::<CallToolParams>(reading)?;
            (RequestBody::CallTool(p), m)
        }
        methods::PROMPTS_LIST => {
            offered(caps.prompts.is_some())?;
            let (p, m) = params.read::<PaginatedParams>(reading)?;
            (RequestBody::ListPrompts { cursor: p.cursor }, m)
        }
        methods::PROMPTS_GET => {
            offered(caps.prompts.is_some())?;
            let (p, m) = params.read::<GetPromptParams>(reading)?;
            (RequestBody::GetPrompt(p), m)
        }
        methods::RESOURCES_LIST => {
            offered(caps.resources.is_some())?;
            let (p, m) = params.read::<PaginatedParams>(reading)?;
            (RequestBody::ListResources { cursor: p.cursor }, m)
        }
        methods::RESOURCES_TEMPLATES_LIST => {
            offered(caps.resources.is_some())?;
            let (p, m) = params.read::<PaginatedParams>(reading)?;
            (RequestBody::ListResourceTemplates { cursor: p.cursor }, m)
        }
        methods::RESOURCES_READ => {
            offered(caps.resources.is_some())?;
            let (p, m) = params.read::<ReadResourceParams>(reading)?;
            if let Some(problem) = uri_template::uri_problem(&p.uri) {
                return Err(refused(&m, not_a_uri("uri", &p.uri, &problem)));
            }
            (RequestBody::ReadResource(p), m)
        }
        methods::COMPLETION_COMPLETE => {
            offered(caps.completions.is_some())?;
            let (p, m) = params.read::<CompleteParams>(reading)?;
            (RequestBody::Complete(p), m)
        }
        methods::SUBSCRIPTIONS_LISTEN => {
            let (p, m) = params.read::<ListenParams>(reading)?;
            let uris = p.notifications.resource_subscriptions.as_ref();
            if uris.is_some_and(|u| u.len() > MAX_SUBSCRIPTIONS) {
                return Err(refused(
                    &m,
                    RpcError::invalid_params(format!(
                        "Invalid params: a listen stream subscribes to at most {MAX_SUBSCRIPTIONS} resources (resourceSubscriptions); open another stream for more"
                    )),
                ));
            }
            if uris.is_some_and(|u| u.iter().any(|u| u.len() > MAX_URI_LEN)) {
                return Err(refused(
                    &m,
                    RpcError::invalid_params(format!(
                        "Invalid params: a URI in resourceSubscriptions is longer than {MAX_URI_LEN} bytes"
                    )),
                ));
            }
            let bad = uris
                .into_iter()
                .flatten()
                .find_map(|u| Some((u, uri_template::uri_problem(u)?)));
            if let Some((uri, problem)) = bad {
                return Err(refused(
                    &m,
                    not_a_uri("a URI in resourceSubscriptions", uri, &problem),
                ));
            }
            if uris.is_some_and(|u| u.iter().map(String::len).sum::<usize>() > MAX_SUBSCRIBED_BYTES)
            {
                return Err(refused(
                    &m,
                    RpcError::invalid_params(format!(
                        "Invalid params: the URIs in resourceSubscriptions are over {} KiB together; open another stream for more",
                        MAX_SUBSCRIBED_BYTES / 1024
                    )),
                ));
            }
            (RequestBody::Listen(p), m)
        }
        _ => return Err(S::not_found(method)),
    })
}

/// The refusal of `what`, `uri`, which is not a URI for `problem`.
pub(crate) fn not_a_uri(what: &str, uri: &str, problem: &str) -> RpcError {
    RpcError::invalid_params(format!(
        "Invalid params: {what} {uri:?} is not a URI (RFC 3986): {problem}; anything but a URI's own characters in their places must be percent-encoded"
    ))
}

#[cfg(test)]
mod tests {
    use wharf_protocol::{Envelope, ListCapability, LoggingLevel, ResourcesCapability, version};

    use super::*;

    const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}},"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"progressToken":"p","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}"#;

    /// A server offering tools and resources, but neither prompts nor completions.
    fn caps() -> ServerCapabilities {
        ServerCapabilities {
            tools: Some(ListCapability::default()),
            resources: Some(ResourcesCapability::default()),
            ..ServerCapabilities::default()
        }
    }

    fn body(method: &str, params: &str) -> String {
        format!(r#"{{"jsonrpc":"2.0","id":"r1","method":"{method}","params":{{{META}{params}}}}}"#)
    }

    /// The long way: the envelope, then the method's params.
    fn long_way(body: &str) -> Result<ParsedRequest, RpcError> {
        let envelope = Envelope::parse(body.as_bytes(), 64).expect("a valid envelope");
        let id = envelope.id.expect("an id");
        let method = envelope.method.as_deref().expect("a method");
        parse(&caps(), version::SUPPORTED, id, method, envelope.params).map_err(|(e, _)| e)
    }

    #[test]
    fn both_ways_read_every_method_alike() {
        let requests = [
            body(methods::DISCOVER, ""),
            body(methods::TOOLS_LIST, r#","cursor":"c""#),
            body(
                methods::TOOLS_CALL,
                r#","name":"echo","arguments":{"text":"h\u00e9","n":[1,2.5,null]},"requestState":"s""#,
            ),
            body(methods::RESOURCES_LIST, ""),
            body(methods::RESOURCES_TEMPLATES_LIST, ""),
            body(methods::RESOURCES_READ, r#","uri":"dataset://d""#),
            body(
                methods::SUBSCRIPTIONS_LISTEN,
                r#","notifications":{"toolsListChanged":true}"#,
            ),
        ];
        for body in &requests {
            let short =
                read(&caps(), version::SUPPORTED, body.as_bytes(), 64).expect("read in one pass");
            let long = long_way(body).expect("read the long way");
            assert_eq!(format!("{short:?}"), format!("{long:?}"), "{body}");
            // What `_meta` says is in `info`; the params keep none of it.
            assert!(!format!("{short:?}").contains("meta: Some"), "{short:?}");
        }
    }

    /// A member named twice in what the application reads (a gateway reading the first and
    /// the server the last would see two calls) is refused, naming it, both ways.
    #[test]
    fn what_the_application_reads_names_each_member_once() {
        for (request, twice) in [
            (
                body(
                    methods::TOOLS_CALL,
                    r#","name":"echo","arguments":{"path":"/public","path":"/etc"}"#,
                ),
                "path",
            ),
            (
                body(
                    methods::TOOLS_CALL,
                    r#","name":"echo","arguments":{},"inputResponses":{"k":{"action":"accept","action":"decline"}}"#,
                ),
                "action",
            ),
            (
                body(
                    methods::RESOURCES_READ,
                    r#","uri":"dataset://d","inputResponses":{"k":1,"k":2}"#,
                ),
                "k",
            ),
        ] {
            assert!(read(&caps(), version::SUPPORTED, request.as_bytes(), 64).is_none());
            let e = long_way(&request).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidParams, "{e}");
            let named = format!("the member {twice:?} is there twice");
            assert!(e.message.contains(&named), "{e}");
        }
    }

    /// A URI that is not written as one is refused, naming it, both ways: to read, and to
    /// subscribe to.
    #[test]
    fn a_resource_uri_must_be_a_uri() {
        let read_of = |uri: &str| {
            body(
                methods::RESOURCES_READ,
                &format!(r#","uri":{}"#, serde_json::to_string(uri).unwrap()),
            )
        };
        let listen_to = |uri: &str| {
            body(
                methods::SUBSCRIPTIONS_LISTEN,
                &format!(
                    r#","notifications":{{"resourceSubscriptions":["dataset://fine",{}]}}"#,
                    serde_json::to_string(uri).unwrap()
                ),
            )
        };
        for bad in [
            "notes://a b",
            "no scheme",
            "dataset://line\nbreak",
            "dataset://50%",
        ] {
            for request in [read_of(bad), listen_to(bad)] {
                assert!(read(&caps(), version::SUPPORTED, request.as_bytes(), 64).is_none());
                let e = long_way(&request).unwrap_err();
                assert_eq!(e.kind, ErrorKind::InvalidParams, "{e}");
                let named = format!("{bad:?} is not a URI");
                assert!(e.message.contains(&named), "{e}");
            }
        }
        for good in ["notes://a%20b", "urn:isbn:0451450523"] {
            assert!(long_way(&read_of(good)).is_ok(), "{good}");
            assert!(long_way(&listen_to(good)).is_ok(), "{good}");
        }
        // At a version the server does not speak, the version is what is refused: another
        // revision may take what this one does not.
        for request in [read_of("notes://a b"), listen_to("notes://a b")] {
            let later = request.replace("\"2026-07-28\"", "\"2027-01-01\"");
            let e = long_way(&later).unwrap_err();
            assert_eq!(e.kind, ErrorKind::UnsupportedVersion, "{e}");
        }
    }

    /// A listen stream subscribes to at most `MAX_SUBSCRIPTIONS` resources and
    /// `MAX_SUBSCRIBED_BYTES` of URIs, none longer than `MAX_URI_LEN`, both ways.
    #[test]
    fn a_listen_stream_subscribes_to_so_many_resources_at_most() {
        let listen = |n: usize| {
            let uris: Vec<String> = (0..n).map(|i| format!("dataset://d{i}")).collect();
            let uris = serde_json::to_string(&uris).unwrap();
            body(
                methods::SUBSCRIPTIONS_LISTEN,
                &format!(r#","notifications":{{"resourceSubscriptions":{uris}}}"#),
            )
        };
        let most = listen(MAX_SUBSCRIPTIONS);
        assert!(read(&caps(), version::SUPPORTED, most.as_bytes(), 64).is_some());
        assert!(long_way(&most).is_ok());
        // One more: the one pass leaves it to the long way, which names the refusal.
        let more = listen(MAX_SUBSCRIPTIONS + 1);
        assert!(read(&caps(), version::SUPPORTED, more.as_bytes(), 64).is_none());
        let e = long_way(&more).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidParams, "{e}");
        assert!(e.message.contains("at most 1000 resources"), "{e}");
        // And by bytes: one URI too long, or too many long ones together.
        let with = |uris: Vec<String>| {
            let uris = serde_json::to_string(&uris).unwrap();
            body(
                methods::SUBSCRIPTIONS_LISTEN,
                &format!(r#","notifications":{{"resourceSubscriptions":{uris}}}"#),
            )
        };
        let path = |n: usize| "p".repeat(n - "dataset://".len());
        let longest = with(vec![format!("dataset://{}", path(MAX_URI_LEN))]);
        assert!(read(&caps(), version::SUPPORTED, longest.as_bytes(), 64).is_some());
        let too_long = with(vec![format!("dataset://{}", path(MAX_URI_LEN + 1))]);
        assert!(read(&caps(), version::SUPPORTED, too_long.as_bytes(), 64).is_none());
        let e = long_way(&too_long).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidParams, "{e}");
        assert!(e.message.contains("longer than 2048 bytes"), "{e}");
        let many = MAX_SUBSCRIBED_BYTES / MAX_URI_LEN;
        let most = with(
            (0..many)
                .map(|i| format!("dataset://{i:04}{}", path(MAX_URI_LEN - 4)))
                .collect(),
        );
        assert!(long_way(&most).is_ok());
        let over = with(
            (0..=many)
                .map(|i| format!("dataset://{i:04}{}", path(MAX_URI_LEN - 4)))
                .collect(),
        );
        let e = long_way(&over).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidParams, "{e}");
        assert!(e.message.contains("over 128 KiB together"), "{e}");
    }

    #[test]
    fn a_log_level_asks_nothing_of_a_server_without_logging() {
        let with_level = body(methods::TOOLS_LIST, "").replace(
            r#""progressToken":"p","#,
            r#""io.modelcontextprotocol/logLevel":"debug","#,
        );
        let mut logging = caps();
        logging.logging = Some(Default::default());
        for (caps, wanted) in [(caps(), None), (logging, Some(LoggingLevel::Debug))] {
            let short = read(&caps, version::SUPPORTED, with_level.as_bytes(), 64)
                .expect("read in one pass");
            assert_eq!(short.info.log_level, wanted);
            assert_eq!(short.info.wants_stream(), wanted.is_some());
            let envelope = Envelope::parse(with_level.as_bytes(), 64).expect("an envelope");
            let id = envelope.id.expect("an id");
            let long = parse(
                &caps,
                version::SUPPORTED,
                id,
                methods::TOOLS_LIST,
                envelope.params,
            )
            .expect("read");
            assert_eq!(long.info.log_level, wanted);
        }
    }

    #[test]
    fn what_the_long_way_refuses_is_not_read_in_one_pass() {
        let no_meta = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"{}","params":{{}}}}"#,
            methods::TOOLS_LIST
        );
        let refused = [
            // unknown, or its capability not offered
            body("tools/run", ""),
            body(methods::PROMPTS_GET, r#","name":"p""#),
            body(methods::COMPLETION_COMPLETE, ""),
            // params that are not the method's
            body(methods::TOOLS_CALL, ""),
            body(methods::TOOLS_CALL, r#","name":7"#),
            body(methods::TOOLS_CALL, r#","name":"echo","arguments":[1]"#),
            body(methods::RESOURCES_READ, r#","uri":null"#),
            // `_meta` without what this revision requires of it, or not an object
            no_meta,
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"{}","params":{{"_meta":["2026-07-28",{{}}]}}}}"#,
                methods::TOOLS_LIST
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"{}","params":{{"_meta":null}}}}"#,
                methods::TOOLS_LIST
            ),
            body(methods::SUBSCRIPTIONS_LISTEN, r#","notifications":[true]"#),
            body(methods::TOOLS_LIST, "").replace(
                r#""io.modelcontextprotocol/protocolVersion":"2026-07-28","#,
                "",
            ),
        ];
        for body in &refused {
            assert!(
                read(&caps(), version::SUPPORTED, body.as_bytes(), 64).is_none(),
                "{body}"
            );
            assert!(long_way(body).is_err(), "{body}");
        }
    }
}
