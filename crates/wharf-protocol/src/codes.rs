//! JSON-RPC error codes used by MCP 2026-07-28.
//!
//! `-32020..=-32099` is reserved for the specification; only the codes defined here may be
//! emitted from that range. Application codes live outside `-32768..=-32000`.

/// Invalid JSON was received.
pub const PARSE_ERROR: i32 = -32700;
/// The JSON sent is not a valid request object.
pub const INVALID_REQUEST: i32 = -32600;
/// The method does not exist or is not available.
pub const METHOD_NOT_FOUND: i32 = -32601;
/// Invalid method parameters (also: unknown tool, prompt or resource; bad cursor).
pub const INVALID_PARAMS: i32 = -32602;
/// Internal JSON-RPC error.
pub const INTERNAL_ERROR: i32 = -32603;
/// An `Mcp-*` / `MCP-Protocol-Version` header is missing, malformed or disagrees with the body.
pub const HEADER_MISMATCH: i32 = -32020;
/// The request needs a client capability that the client did not declare.
pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i32 = -32021;
/// The requested protocol version is not supported by this server.
pub const UNSUPPORTED_PROTOCOL_VERSION: i32 = -32022;
/// A resource that does not exist, as 2025-11-25 answers it (legacy sessions only:
/// 2026-07-28 answers [`INVALID_PARAMS`], and asks clients to accept this code too).
pub const RESOURCE_NOT_FOUND_2025: i32 = -32002;

/// Whether `code` lies in the range reserved by JSON-RPC and MCP (`-32768..=-32000`).
pub const fn is_reserved(code: i32) -> bool {
    code >= -32768 && code <= -32000
}
