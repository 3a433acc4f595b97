#!/usr/bin/env python3
"""A deliberately non-conforming 2026-07-28 server, for the tests of `wharf check`: each rule
the probe checks, this server breaks, while its happy path looks right. Standard library only.

    python broken_server.py PORT     # serves http://127.0.0.1:PORT/mcp

What it does right: `server/discover` answers a plausible result (supportedVersions
["2026-07-28"], tools capability, serverInfo); `tools/list` lists one tool, `echo`;
`tools/call` of `echo` returns its text (all three results valid against the 2026-07-28
schema); another method is a JSON-RPC -32601 with HTTP 404.

What it does wrong (on purpose):
  - GET on the endpoint answers 200 text/plain "hello" instead of 405;
  - it never reads a header: `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` may
    contradict the body (no 400 / -32020), and `Accept` is not checked either;
  - it never checks `_meta`: an unknown protocol version is served (no 400 / -32022 with
    `error.data.supported`), and a request without `params._meta` is served (no 400 / -32602);
  - it answers `initialize` with -32601 (so it serves no legacy client, which is allowed);
  - it never streams: every answer is one application/json body, so there is no SSE and
    no `X-Accel-Buffering` header, even for a call that carries a progress token.
It prints nothing, and SIGTERM or SIGKILL ends it.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/mcp"

DISCOVER = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {}},
    "ttlMs": 60000,
    "cacheScope": "public",
    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "broken", "version": "0.1.0"}},
}

ECHO = {
    "name": "echo",
    "description": "Returns the text.",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
}


def answer(method, params):
    """(HTTP status, result or None, error or None) for one request."""
    if method == "server/discover":
        return 200, DISCOVER, None
    if method == "tools/list":
        return 200, {"resultType": "complete", "tools": [ECHO], "ttlMs": 60000, "cacheScope": "public"}, None
    if method == "tools/call" and isinstance(params, dict) and params.get("name") == "echo":
        arguments = params.get("arguments")
        text = arguments.get("text") if isinstance(arguments, dict) else None
        if not isinstance(text, str):
            return 200, {"resultType": "complete", "isError": True,
                         "content": [{"type": "text", "text": "echo needs a string `text`"}]}, None
        return 200, {"resultType": "complete", "content": [{"type": "text", "text": text}]}, None
    if method == "tools/call":
        return 200, None, {"code": -32602, "message": "Unknown tool"}
    return 404, None, {"code": -32601, "message": f"Method not found: {method}"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def send(self, status, content_type, body):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.split("?")[0] != PATH:
            return self.send(404, "text/plain", b"not found")
        self.send(200, "text/plain", b"hello")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.split("?")[0] != PATH:
            return self.send(404, "text/plain", b"not found")
        try:
            message = json.loads(raw)
        except ValueError:
            body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
            return self.send(400, "application/json", json.dumps(body).encode())
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid request"}}
            return self.send(400, "application/json", json.dumps(body).encode())
        if "id" not in message:
            self.send_response(202)
            self.send_header("Content-Length", "0")
            return self.end_headers()
        status, result, error = answer(message["method"], message.get("params"))
        body = {"jsonrpc": "2.0", "id": message["id"]}
        if error is None:
            body["result"] = result
        else:
            body["error"] = error
        self.send(status, "application/json", json.dumps(body).encode())


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that hangs up early (a readiness probe, say) is not worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


if __name__ == "__main__":
    httpd = Server(("127.0.0.1", int(sys.argv[1])), Handler)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
