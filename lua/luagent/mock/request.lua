-- The mock provider's HTTP/1.1 request parser: bytes -> request. Pure.
local M = {}

-- Limits per request: its header block and its body (what one connection
-- can make the server buffer).
M.MAX_HEAD = 64 * 1024
M.MAX_BODY = 16 * 1024 * 1024

-- A parse failure answered with `status` before the connection closes.
local function bad(status, message)
  return "bad", { status = status, message = message }
end

-- Decodes a chunked body starting at `pos` in buf. Returns "ok", body, rest
-- or "more" or "bad", {status=, message=}.
local function dechunk(buf, pos)
  local parts, total = {}, 0
  while true do
    local eol = buf:find("\r\n", pos, true)
    if not eol then return "more" end
    local size = buf:sub(pos, eol - 1):match("^(%x+)[ \t]*;?.*$")
    if not size or #size > 8 then return bad(400, "malformed chunk size") end
    size = tonumber(size, 16)
    total = total + size
    if total > M.MAX_BODY then return bad(413, "request body too large") end
    if size == 0 then
      local stop = buf:find("\r\n\r\n", eol, true)
      if not stop then return "more" end
      return "ok", table.concat(parts), buf:sub(stop + 4)
    end
    local from = eol + 2
    if #buf < from + size + 1 then return "more" end
    if buf:sub(from + size, from + size + 1) ~= "\r\n" then
      return bad(400, "malformed chunk")
    end
    parts[#parts + 1] = buf:sub(from, from + size - 1)
    pos = from + size + 2
  end
end

-- Parses one HTTP/1.x request from the front of `buf`. Returns
--   "ok", request, rest   -- request = {method=, target=, path=, query=,
--                         --   version=, headers={lowercased=value}, body=,
--                         --   close=<client wants the connection closed>}
--   "more", head|nil      -- incomplete; head (the request without body) once
--                         --   the header is in, with head.need = total bytes
--                         --   needed when a Content-Length gives it and
--                         --   head.expect_continue
--   "bad", {status=, message=}
function M.parse(buf)
  local stop = buf:find("\r\n\r\n", 1, true)
  if not stop then
    if #buf > M.MAX_HEAD then return bad(431, "request header too large") end
    return "more"
  end
  if stop > M.MAX_HEAD then return bad(431, "request header too large") end
  local lines = {}
  for line in buf:sub(1, stop + 1):gmatch("(.-)\r\n") do lines[#lines + 1] = line end
  local method, target, version = lines[1]:match("^(%u+) (%S+) HTTP/(1%.[01])$")
  if not method then return bad(400, "malformed request line") end
  local headers = {}
  for i = 2, #lines do
    local name, value = lines[i]:match("^([%w!#$%%&'*+%-.^_`|~]+):[ \t]*(.-)[ \t]*$")
    if not name then return bad(400, "malformed header line") end
    name = name:lower()
    headers[name] = headers[name] and (headers[name] .. ", " .. value) or value
  end
  local path, query = target:match("^([^?#]*)%??([^#]*)")
  local connection = (headers.connection or ""):lower()
  local req = {
    method = method, target = target, path = path, query = query,
    version = version, headers = headers,
    close = connection:find("close", 1, true) ~= nil
      or (version == "1.0" and not connection:find("keep-alive", 1, true)),
    expect_continue = (headers.expect or ""):lower() == "100-continue",
  }
  local te, cl = headers["transfer-encoding"], headers["content-length"]
  if te then
    if te:lower() ~= "chunked" then return bad(501, "unsupported transfer-encoding: " .. te) end
    if cl then return bad(400, "both transfer-encoding and content-length") end
    local status, body, rest = dechunk(buf, stop + 4)
    if status == "ok" then req.body = body; return "ok", req, rest end
    if status == "bad" then return status, body end
    return "more", req
  end
  local len = 0
  if cl then
    if not cl:match("^%d+$") or #cl > 12 then return bad(400, "bad content-length") end
    len = math.tointeger(tonumber(cl))
    if len > M.MAX_BODY then return bad(413, "request body too large") end
  end
  req.need = stop + 3 + len
  if #buf < req.need then return "more", req end
  req.body = buf:sub(stop + 4, req.need)
  return "ok", req, buf:sub(req.need + 1)
end

return M
