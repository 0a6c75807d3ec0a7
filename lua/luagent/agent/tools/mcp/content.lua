-- What an MCP tools/call result becomes for the model: text content as it
-- is, structured content as JSON text, every other content type (images,
-- audio, resources, links, types added later) described in a line rather
-- than dropped. Pure Lua.
local json = require "luagent.base.json"

local M = {}

-- Size in bytes of base64 `data` once decoded.
local function b64_size(data)
  if type(data) ~= "string" then return 0 end
  local pad = data:match("(=*)$")
  return math.floor(#data:gsub("%s", "") * 3 / 4) - #pad
end

local function str(v, default)
  return type(v) == "string" and v or default
end

-- One content item as text.
function M.item(c)
  if type(c) ~= "table" then return "[content that is not an object: " .. json.encode(c) .. "]" end
  local kind = str(c.type, "?")
  if kind == "text" then return str(c.text, "") end
  if kind == "image" or kind == "audio" then
    return string.format("[%s content: %s, %d bytes, not shown]", kind, str(c.mimeType, "unknown type"),
      b64_size(c.data))
  end
  if kind == "resource_link" then
    return string.format("[resource link: %s%s%s]", str(c.name, ""), c.name and " " or "",
      str(c.uri, "?")) .. (c.mimeType and (" (" .. str(c.mimeType, "") .. ")") or "")
  end
  if kind == "resource" and type(c.resource) == "table" then
    local r = c.resource
    if type(r.text) == "string" then
      return string.format("[resource %s]\n%s", str(r.uri, "?"), r.text)
    end
    return string.format("[resource %s: %s, %d bytes, not shown]", str(r.uri, "?"),
      str(r.mimeType, "unknown type"), b64_size(r.blob))
  end
  local shown = json.encode(c)
  if #shown > 200 then shown = shown:sub(1, 200) .. "..." end
  return string.format("[%s content: %s]", kind, shown)
end

-- text(result) -> the text of a tools/call result: its content items, one
-- after another; its structuredContent as JSON when no item is text (the
-- spec asks servers to repeat structured content in a text item, so the
-- text is not given twice).
function M.text(result)
  local parts, has_text = {}, false
  local content = type(result.content) == "table" and result.content or {}
  for _, c in ipairs(content) do
    parts[#parts + 1] = M.item(c)
    if type(c) == "table" and c.type == "text" then has_text = true end
  end
  local sc = result.structuredContent
  if sc ~= nil and sc ~= json.null and not has_text then parts[#parts + 1] = json.encode(sc) end
  return table.concat(parts, "\n")
end

return M
