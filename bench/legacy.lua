-- wrk script: one `tools/call` of `echo` per request from a legacy client (2025-11-25) in
-- the session bench/legacy.sh opened (WHARF_SESSION), with the headers such a client sends.
wrk.method = "POST"
wrk.path = "/mcp"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2025-11-25"
wrk.headers["Mcp-Session-Id"] = os.getenv("WHARF_SESSION")
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{'
  .. '"name":"echo","arguments":{"text":"hello from wrk"}}}'
