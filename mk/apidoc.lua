-- `make api`: docs/api.md, the API reference, from the LuaLS annotations
-- (---@class, ---@field, ---@param, ---@return) of the public modules.
-- spec/docs_spec.lua fails when docs/api.md is not what this makes.
--
--   lua5.4 mk/apidoc.lua [docs/api.md]   rewrite the file (when it changed)
--   lua5.4 mk/apidoc.lua --print         write the reference to stdout
--
-- What it reads: a block of `---` lines is a class (its `---@class` line,
-- the text before it, its `---@field` lines) or, when a `function A.b(...)`
-- or `function A:b(...)` follows it, that function's text, `---@param` and
-- `---@return` lines. A is the class whose block a `local A = ...` line
-- follows in the same file. An annotated function of a table that is no
-- class, a class listed below that no file defines, or a type it cannot
-- read is an error naming file:line, so the reference cannot silently
-- lose a part.

-- The annotated files, in the order their parts are read.
local FILES = {
  "lua/luagent/init.lua",
  "lua/luagent/runtime.lua",
  "lua/luagent/config.lua",
  "lua/luagent/model/call.lua",
  "lua/luagent/model/provider.lua",
  "lua/luagent/agent/loop.lua",
  "lua/luagent/agent/tools/init.lua",
  "lua/luagent/agent/tools/tool.lua",
  "lua/luagent/agent/tools/set.lua",
  "lua/luagent/agent/tools/mcp/init.lua",
  "lua/luagent/model/policy.lua",
  "lua/luagent/base/errors.lua",
}

-- The order of the reference's sections: the face first, then what a
-- newcomer meets in that order. A class not listed comes after, by name.
local ORDER = {
  "luagent", "luagent.Runtime", "luagent.Settings", "luagent.StreamOptions", "luagent.Message",
  "luagent.Event", "luagent.Provider", "luagent.ProviderSpec", "luagent.Agent", "luagent.AgentOptions",
  "luagent.AgentEnd", "luagent.tools", "luagent.ToolDef", "luagent.ToolContext", "luagent.Tool",
  "luagent.ToolSet", "luagent.ToolSnapshot", "luagent.McpOptions", "luagent.McpSet", "luagent.Policy",
  "luagent.events", "luagent.Error", "luagent.errors", "luagent.Task", "luagent.clock", "luagent.json",
  "luagent.log",
}

-- What a method's object is called in its heading (rt:close()).
local SELF = { ["luagent.Runtime"] = "rt", ["luagent.Agent"] = "agent", ["luagent.ToolSet"] = "set",
  ["luagent.McpSet"] = "set", ["luagent.Provider"] = "provider" }

local function fail(where, msg)
  io.stderr:write("mk/apidoc.lua: ", where, ": ", msg, "\n")
  os.exit(1)
end

-- Reads one type at text[i]: a name (luagent.Agent, string[], "debug"),
-- a table literal {a: T}, a parenthesized type, fun(...)[: returns], each
-- with `[]` and `?` after it and `|` between alternatives. Returns the end
-- index, or nil.
local function scan_type(text, i)
  local function balanced(j, open, close)
    local depth = 0
    while j <= #text do
      local c = text:sub(j, j)
      if c == open then depth = depth + 1
      elseif c == close then
        depth = depth - 1
        if depth == 0 then return j end
      elseif c == '"' then
        local q = text:find('"', j + 1, true)
        if not q then return nil end
        j = q
      end
      j = j + 1
    end
    return nil
  end
  local primary
  local function returns(j)
    -- fun(...): T, U  (the types after the colon)
    if text:sub(j + 1, j + 2) ~= ": " then return j end
    local e = scan_type(text, j + 3)
    if not e then return nil end
    while text:sub(e + 1, e + 2) == ", " do
      local n = scan_type(text, e + 3)
      if not n then break end
      e = n
    end
    return e
  end
  function primary(j)
    local c = text:sub(j, j)
    local e
    if text:sub(j, j + 3) == "fun(" then
      e = balanced(j + 3, "(", ")")
      if not e then return nil end
      e = returns(e)
    elseif c == "(" then e = balanced(j, "(", ")")
    elseif c == "{" then e = balanced(j, "{", "}")
    elseif c == '"' then e = text:find('"', j + 1, true)
    else
      local _, n = text:find("^[%w_%.%*]+", j)
      if not n then
        if text:sub(j, j + 2) == "..." then n = j + 2 else return nil end
      end
      e = n
      if text:sub(e + 1, e + 1) == "<" then e = balanced(e + 1, "<", ">") end
    end
    if not e then return nil end
    while true do
      local two = text:sub(e + 1, e + 2)
      if two == "[]" then e = e + 2
      elseif text:sub(e + 1, e + 1) == "?" then e = e + 1
      else break end
    end
    return e
  end
  local e = primary(i)
  while e and text:sub(e + 1, e + 1) == "|" do e = primary(e + 2) end
  return e
end

-- "type rest" -> type, rest (rest without its leading spaces), or nil.
local function split_type(text)
  local e = scan_type(text, 1)
  if not e then return nil end
  return text:sub(1, e), (text:sub(e + 1):gsub("^%s+", ""))
end

-- Reads a file's annotated blocks into `api` (classes, and functions by
-- class).
-- A line of an annotation block: `---` then anything but another dash
-- (a rule of dashes is a plain comment).
local function is_doc(l) return l:match("^%s*%-%-%-$") or l:match("^%s*%-%-%-[^%-]") end

local function read(path, api)
  local fh = io.open(path, "r")
  if not fh then fail(path, "cannot open") end
  local lines = {}
  for l in fh:lines() do lines[#lines + 1] = l end
  fh:close()
  local owners = {} -- local table name -> class, in this file
  local i = 1
  while i <= #lines do
    if is_doc(lines[i]) then
      local first = i
      local block = {}
      while i <= #lines and is_doc(lines[i]) do
        block[#block + 1] = { text = lines[i]:match("^%s*%-%-%-(.*)$"), line = i }
        i = i + 1
      end
      -- the code the block is about: the next line that is not a plain comment
      local j = i
      while j <= #lines and lines[j]:match("^%s*%-%-") and not is_doc(lines[j]) do j = j + 1 end
      local code = lines[j] or ""
      local text, class, params, rets = {}, nil, {}, {}
      for _, b in ipairs(block) do
        local where = path .. ":" .. b.line
        local tag, rest = b.text:match("^@(%w+)%s*(.*)$")
        if not tag then
          text[#text + 1] = (b.text:gsub("^ ", ""))
        elseif tag == "class" then
          local name, parent = rest:match("^([%w_%.]+)%s*:%s*([%w_%.]+)")
          name = name or rest:match("^([%w_%.]+)")
          if not name then fail(where, "a @class without a name") end
          if api.classes[name] then fail(where, "class " .. name .. " is defined twice") end
          class = { name = name, parent = parent, text = table.concat(text, " "), fields = {}, functions = {},
                    where = where }
          text = {}
          api.classes[name] = class
        elseif tag == "field" then
          if not class then fail(where, "a @field outside a @class block") end
          local name, after = rest:match("^([%w_]+%??)%s+(.*)$")
          if not name then fail(where, "a @field needs a name and a type") end
          local ty, desc = split_type(after)
          if not ty then fail(where, "cannot read the type of field " .. name) end
          class.fields[#class.fields + 1] = { name = name, type = ty, text = desc }
        elseif tag == "param" then
          local name, after = rest:match("^([%w_%.]+%??)%s+(.*)$")
          if not name then fail(where, "a @param needs a name and a type") end
          local ty, desc = split_type(after)
          if not ty then fail(where, "cannot read the type of param " .. name) end
          params[#params + 1] = { name = name, type = ty, text = desc }
        elseif tag == "return" then
          local ty, desc = split_type(rest)
          if not ty then fail(where, "cannot read the type of a @return") end
          -- LuaLS: `---@return TYPE [NAME [TEXT]]`
          local name, more = desc:match("^([%w_]+)%s*(.*)$")
          rets[#rets + 1] = { type = ty, name = name, text = name and more or desc }
        elseif tag ~= "meta" and tag ~= "diagnostic" then
          fail(where, "an annotation this generator does not read: @" .. tag)
        end
      end
      local lname = code:match("^local%s+([%w_]+)%s*=")
      local owner, sep, fname, args = code:match("^function%s+([%w_]+)([%.:])([%w_]+)%s*(%b())")
      if class and lname then
        owners[lname] = class
      elseif owner then
        local c = owners[owner]
        if not c then fail(path .. ":" .. j, "function " .. owner .. sep .. fname .. " is annotated, but " .. owner .. " is no @class of this file") end
        c.functions[#c.functions + 1] = { name = fname, sep = sep, args = args, text = table.concat(text, " "),
                                          params = params, returns = rets }
      elseif not class then
        fail(path .. ":" .. first, "an annotation block before neither a function nor a @class")
      end
    else
      i = i + 1
    end
  end
end

-- Markdown table cells: `|` would end the cell.
local function cell(s) return (s:gsub("|", "\\|")) end

-- Module-like classes (lowercase: the face and its areas) name their
-- fields in full (luagent.spawn); types (Agent, Tool) by the field alone.
local function is_module(name) return not name:match("%.%u") and name:sub(1, 1):match("%l") ~= nil end

local function render(api)
  local out = {}
  local function w(s) out[#out + 1] = s end
  w("# API reference")
  w("")
  w("<!-- generated by `make api` (mk/apidoc.lua) from the LuaLS annotations of the public")
  w("modules; edit the annotations, not this file (spec/docs_spec.lua checks it is current) -->")
  w("")
  w("Every public function, option table and shape, from the `---@class`,")
  w("`---@field`, `---@param` and `---@return` annotations in the sources. The")
  w("same annotations give lua-language-server users completion and type")
  w("checks (README.md, \"Editor completion\"). Types are LuaLS's: `T?` may be")
  w("nil, `T[]` is a list, `fun(a: A): R` a function, `A|B` either. The guide")
  w("([docs/README.md](README.md)) explains; EVENTS.md lists every event.")
  w("")
  local names, seen = {}, {}
  for _, n in ipairs(ORDER) do
    if not api.classes[n] then fail("mk/apidoc.lua", "class " .. n .. " is in ORDER but no file defines it") end
    names[#names + 1] = n
    seen[n] = true
  end
  local rest = {}
  for n in pairs(api.classes) do if not seen[n] then rest[#rest + 1] = n end end
  table.sort(rest)
  for _, n in ipairs(rest) do names[#names + 1] = n end
  w("Contents: " .. (function()
    local links = {}
    for _, n in ipairs(names) do links[#links + 1] = "[" .. n .. "](#" .. n:lower():gsub("[^%w%-_ ]", "") .. ")" end
    return table.concat(links, ", ")
  end)())
  w("")
  for _, n in ipairs(names) do
    local c = api.classes[n]
    w("## " .. n)
    w("")
    if c.parent then
      w("Has the fields of [" .. c.parent .. "](#" .. c.parent:lower():gsub("[^%w%-_ ]", "") .. ") too.")
      w("")
    end
    if c.text ~= "" then
      w(c.text)
      w("")
    end
    if #c.fields > 0 then
      w("| field | type | what it is |")
      w("|---|---|---|")
      for _, f in ipairs(c.fields) do
        local fname = is_module(n) and (n .. "." .. f.name) or f.name
        w(string.format("| `%s` | `%s` | %s |", fname, cell(f.type), cell(f.text)))
      end
      w("")
    end
    for _, f in ipairs(c.functions) do
      local shown = {}
      for _, p in ipairs(f.params) do shown[#shown + 1] = p.name end
      local owner = f.sep == ":" and (SELF[n] or (n:match("([%w_]+)$"):gsub("^%u", string.lower))) or n
      w(string.format("### `%s%s%s(%s)`", owner, f.sep, f.name, table.concat(shown, ", ")))
      w("")
      if f.text ~= "" then
        w(f.text)
        w("")
      end
      for _, p in ipairs(f.params) do
        w(string.format("- `%s`: `%s`%s", p.name, p.type, p.text ~= "" and (": " .. p.text) or ""))
      end
      for _, r in ipairs(f.returns) do
        if r.name then
          w(string.format("- returns `%s`: `%s`%s", r.name, r.type, r.text ~= "" and (": " .. r.text) or ""))
        else
          w(string.format("- returns `%s`", r.type))
        end
      end
      if #f.params + #f.returns > 0 then w("") end
    end
  end
  return (table.concat(out, "\n"):gsub("\n+$", "\n"))
end

local api = { classes = {} }
for _, f in ipairs(FILES) do read(f, api) end
local text = render(api)

if arg[1] == "--print" then
  io.write(text)
  return
end
local path = arg[1] or "docs/api.md"
local fh = io.open(path, "r")
local old = fh and fh:read("a")
if fh then fh:close() end
if old ~= text then
  fh = assert(io.open(path, "w"))
  fh:write(text)
  fh:close()
  print(path .. ": rewritten from the annotations")
end
