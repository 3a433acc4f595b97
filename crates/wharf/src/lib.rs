//! Server core for stateless MCP servers (revision 2026-07-28).
//!
//! Register tools, resources, resource templates and prompts on a [`ServerBuilder`]; the
//! built [`Server`] validates and dispatches requests handed to it by a transport
//! (`wharf-http`, `wharf-stdio`). Everything is built once, never per request: a tool's schemas
//! are generated when it is defined, and their validators compiled at
//! [`ServerBuilder::build`].
//!
//! A transport hands the core each request in two steps. It reads it with
//! [`Server::read_request`], one pass over the body; what that declines it reads the long
//! way, with `Envelope::parse` and [`Server::parse_request`], which name what is wrong.
//! Then [`Server::admit`], which decides once, for every method, whether it may run (version,
//! scopes, client capabilities, a slot under the load caps) and answers with an
//! [`ErrorReply`] or an [`Admitted`] request to run to one body or to a stream.
//! [`testing::Harness`] takes the same path in-process. The layers and the path of one
//! request are drawn in `ARCHITECTURE.md`.
//!
//! ```no_run
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//! use wharf::{Context, Server, tool};
//! use wharf_protocol::Implementation;
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct Echo { text: String }
//!
//! let server = Server::builder(Implementation::new("demo", "1.0.0"))
//!     .tool(tool("echo").description("Echo the text").handler(|_cx: Context, a: Echo| async move { a.text }))
//!     .build()
//!     .expect("valid definitions");
//! ```

mod access;
mod admission;
mod bus;
mod config;
mod context;
mod cursor;
mod deadline;
mod dispatch;
mod driver;
mod error;
mod fair_share;
mod handle_args;
mod handler;
mod keys;
mod keyset;
mod legacy;
mod limits;
mod listen;
mod meta;
mod methods;
pub mod metrics;
mod middleware;
mod mrtr;
mod mutation;
mod principal;
mod progress;
mod prompt;
mod registry;
mod reply;
mod request;
mod resource;
mod runtime;
mod schema;
mod server;
mod session;
pub mod store;
pub mod testing;
mod tool;
mod trace;
mod uri_template;

pub use admission::{Admitted, ErrorReply, ListenStream};
pub use bus::{BusError, ChangeEvent, InProcessBus, NotificationBus, SessionSignal};
pub use config::{CachePolicy, LegacyConfig, ServerConfig};
pub use context::{Context, TxGuard};
pub use cursor::{CursorKey, ShortCursorKey};
pub use error::{
    DETAIL_TARGET, ErrorKind, FORBIDDEN, RETRY_LATER, RpcError, TIMED_OUT, UNAUTHORIZED,
};
pub use handler::HandlerError;
pub use legacy::{
    Answer, LegacyCall, Outcome, Rounds, Scope, Session, SessionError, SessionStream, Sessions,
};
pub use limits::Limits;
pub use meta::{Era, RequestInfo, TraceContext};
pub use middleware::{Middleware, MiddlewareFuture, Next};
pub use mrtr::{Ask, Elicited, FormSchema, KeyError, StateConfig, StateKeys, StringFormat};
pub use principal::{Grant, Principal, PrincipalError};
pub use prompt::{PromptArgs, PromptBuilder, PromptDef, prompt};
pub use registry::BuildError;
pub use request::{Caller, Outbox, ParsedRequest, RequestBody};
pub use resource::{
    ReadRequest, ResourceBuilder, ResourceDef, TemplateBuilder, TemplateDef, resource, template,
};
pub use schema::HeaderParam;
pub use schemars;
pub use server::{Server, ServerBuilder};
pub use store::{Handle, HandleKind};
pub use tool::{IntoToolResult, NoArgs, Step, Structured, ToolBuilder, ToolDef, tool};
pub use uri_template::{Vars, is_uri};
pub use wharf_protocol as protocol;
