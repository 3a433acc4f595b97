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
