-- wrk script: one idempotent `import_append_rows` per request, each with a fresh
-- idempotency key, ROWS rows per call. Used by bench/store.sh for both sides. Each wrk
-- thread (one connection each) appends to its own import, as independent agents would.
-- Environment: IMPORTS (comma-separated import handles), TOKEN (bearer), RUN (key prefix),
-- ROWS.
local imports = {}
for h in string.gmatch(os.getenv("IMPORTS") or "imp_missing", "[^,]+") do
  imports[#imports + 1] = h
end
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("import", imports[(threads - 1) % #imports + 1])
  thread:set("tid", threads)
end

local token = os.getenv("TOKEN") or ""
local run = os.getenv("RUN") or "run"
local nrows = tonumber(os.getenv("ROWS") or "50")

local rows = {}
for i = 1, nrows do
  rows[i] = string.format('{"id":%d,"city":"city-%d","temp":%d.5}', i, i, i % 40)
end
local rows_json = "[" .. table.concat(rows, ",") .. "]"

wrk.method = "POST"
wrk.path = "/mcp"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2026-07-28"
wrk.headers["Mcp-Method"] = "tools/call"
wrk.headers["Mcp-Name"] = "import_append_rows"
wrk.headers["Authorization"] = "Bearer " .. token

local counter = 0
request = function()
  counter = counter + 1
  local body = '{"jsonrpc":"2.0","id":' .. counter .. ',"method":"tools/call","params":{'
    .. '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
    .. '"io.modelcontextprotocol/clientCapabilities":{}},'
    .. '"name":"import_append_rows","arguments":{"import":"' .. import .. '",'
    .. '"idempotency_key":"' .. run .. '-' .. tid .. '-' .. counter .. '","rows":' .. rows_json .. '}}}'
  return wrk.format(nil, nil, nil, body)
end

-- Any answer that is not a plain result (an error, isError) fails the run loudly.
response = function(status, headers, body)
  if status ~= 200 or not string.find(body, '"appended"', 1, true) or string.find(body, '"isError":true', 1, true) then
    io.stderr:write("unexpected answer: " .. status .. " " .. body .. "\n")
    os.exit(1)
  end
end
