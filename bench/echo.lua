-- wrk script: one 2026-07-28 `tools/call` of the `echo` tool per request, with the headers a
-- conforming client sends (they must mirror the body). Used by bench/run.sh for both sides.
wrk.method = "POST"
wrk.path = "/mcp"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2026-07-28"
wrk.headers["Mcp-Method"] = "tools/call"
wrk.headers["Mcp-Name"] = "echo"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{'
  .. '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
  .. '"io.modelcontextprotocol/clientCapabilities":{},'
  .. '"io.modelcontextprotocol/clientInfo":{"name":"wrk","version":"4.1.0"}},'
  .. '"name":"echo","arguments":{"text":"hello from wrk"}}}'

-- AUTH=es256 (bench/run.sh): the token the issuer printed, on every request.
local token = os.getenv("WHARF_TOKEN")
if token ~= nil and token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end

-- WRK_CHECK_ANSWERS=1 (bench/instructions.sh, whose server runs under valgrind): an answer
-- that is not the echo's result (an error, `isError`, a lost session) stops the run loudly
-- rather than count as a call. Off for throughput runs, where reading every body in Lua
-- would load wrk's one CPU (they check the first answer and count non-2xx answers).
if os.getenv("WRK_CHECK_ANSWERS") == "1" then
  response = function(status, headers, body)
    if status ~= 200 or not string.find(body, '"result":{', 1, true)
        or not string.find(body, "hello from wrk", 1, true)
        or string.find(body, '"isError":true', 1, true) then
      io.stderr:write("unexpected answer: " .. status .. " " .. body .. "\n")
      os.exit(1)
    end
  end
end
