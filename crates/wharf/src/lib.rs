//! Server core for stateless MCP servers (revision 2026-07-28).
//!
//! Register tools, resources, resource templates and prompts on a [`ServerBuilder`]; the
//! built [`Server`] validates and dispatches requests handed to it by a transport
//! (`wharf-http`, `wharf-stdio`). Everything is built once: schemas are generated and their
//! validators compiled at [`ServerBuilder::build`], never per request.
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

pub mod bus;
pub mod context;
pub mod cursor;
pub mod dispatch;
pub mod error;
pub mod limits;
pub mod listen;
pub mod meta;
pub mod middleware;
pub mod mrtr;
pub mod principal;
mod progress;
pub mod prompt;
pub mod resource;
pub mod schema;
mod serialize;
pub mod server;
pub mod state;
pub mod tool;
mod tool_call;
pub mod uri_template;

pub use bus::{ChangeEvent, InProcessBus, NotificationBus};
pub use context::Context;
pub use cursor::CursorKey;
pub use dispatch::{ParsedRequest, RequestBody, Scope};
pub use error::{ErrorKind, RpcError};
pub use limits::{Limits, Permit};
pub use listen::Listener;
pub use meta::RequestInfo;
pub use middleware::{Middleware, Next};
pub use mrtr::{Ask, Elicited, FormSchema, StateConfig, StateKeys};
pub use principal::{Grant, Principal};
pub use prompt::{PromptArgs, prompt};
pub use resource::{ReadRequest, resource, template};
pub use server::{BuildError, CachePolicy, Server, ServerBuilder, ServerConfig};
pub use state::{Handle, HandleKind, Store, StoreError, Transaction, TxMode};
pub use tool::{IntoToolResult, NoArgs, Step, Structured, ToolError, tool};
pub use wharf_protocol as protocol;
