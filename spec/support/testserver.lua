-- A raw TCP test server for transport specs: each connection runs
-- handler(conn, request) in its own task, where `request` is the parsed
-- request ({method=, path=, headers=, body=}) and `conn` the core TCP
-- connection, so a spec controls exactly which bytes go on the wire.
local luagent = require "luagent"
local core = require "luagent.core"

local M = {}

-- Reads one HTTP/1.1 request (head and Content-Length body) from conn.
local function read_request(conn)
  local buf = ""
  while not buf:find("\r\n\r\n", 1, true) do
    local chunk = conn:read()
    if not chunk then return nil end
    buf = buf .. chunk
  end
  local head, rest = buf:match("^(.-)\r\n\r\n(.*)$")
  local method, path = head:match("^(%S+) (%S+)")
  local headers = {}
  for name, value in head:gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do headers[name:lower()] = value end
  local len = tonumber(headers["content-length"] or 0)
  while #rest < len do
    local chunk = conn:read()
    if not chunk then break end
    rest = rest .. chunk
  end
  return { method = method, path = path, headers = headers, body = rest }
end
M.read_request = read_request

-- serve(handler [, opts]) -> {url=, port=, requests=<count>, close=fn}.
-- opts.raw: call handler(conn) at once, without reading a request (for
-- peers that do not speak HTTP, such as a TLS client hello).
function M.serve(handler, opts)
  local raw = opts and opts.raw
  local srv = assert(core.tcp_listen("127.0.0.1", 0))
  local _, port = srv:address()
  local s = { port = port, url = "http://127.0.0.1:" .. port, requests = 0 }
  local conns = {}
  local acceptor = luagent.daemon(function()
    while true do
      local conn = srv:accept()
      if not conn then return end
      conns[#conns + 1] = luagent.daemon(function()
        local req = raw or read_request(conn)
        if req then
          s.requests = s.requests + 1
          handler(conn, req)
        end
        conn:close()
      end)
    end
  end)
  function s.close()
    srv:close()
    acceptor:cancel()
    for _, t in ipairs(conns) do t:cancel() end
  end
  return s
end

-- Formats a response head; `headers` is a list of "Name: value" lines.
function M.head(status, headers)
  local lines = { "HTTP/1.1 " .. status .. " X" }
  for _, h in ipairs(headers or {}) do lines[#lines + 1] = h end
  return table.concat(lines, "\r\n") .. "\r\n\r\n"
end

return M
