-- The direction of lua/luagent, read from its source (issue 25).
--
-- Every module has a place, given by its folder:
--   base/     errors, json, queue, secrets, sandbox, usage, http, bus, ...
--   model/    the call, its policy, endpoints, providers
--   agent/    the loop, the journal, tools
--   observe/  the observers: log, cost, prices, record, trace, ...
--   config    lua/luagent/config.lua, the settings
--   the composition root: the face `luagent` (init.lua), `luagent.runtime`
--             (runtime.lua) and `luagent.cli*` (cli/)
--   the test bench: luagent.mock*, luagent.sim*
-- luagent.core (the C core) is below them all: anyone may require it.
--
-- The rules, each its own test below:
--   base/ requires base/ only; model/ base/ and model/; agent/ base/,
--   model/ and agent/; observe/ base/ and observe/ (the bus is base/bus.lua).
--   model/ and agent/ never require an observer: they offer control points
--   (admission, request decorators) that observers register with. Only the
--   composition root wires observers.
--   config.lua depends on base/ only. The settings are the runtime's
--   (rt.settings): the other layers read them through the runtime they are
--   given, so only the composition root requires luagent.config (a module
--   that requires it reads process-wide settings, the singleton that issue
--   25 removes).
--   The product never reaches the bench, directly or through another
--   module, except luagent.cli, and that only inside a function; the bench
--   never requires the face.
--   No `require` inside a function anywhere in the library, except in the
--   composition root and the exceptions named in LAZY_OK below.
--   The face does not hand out the C core, and no example reaches it.
--
-- How dependencies are found: a small lexer (comments and strings skipped
-- correctly) and a parser that follows block nesting (function, if, while,
-- for, do, repeat ... end/until). For the graph, every string literal that
-- names a module counts (so a name in a table of lazily loaded modules
-- counts too); a literal ending in "." ("luagent.model.providers." .. name)
-- stands for every module under it; "luagent" alone (also the product's
-- name in telemetry) counts only as a require's argument. For the "inside
-- a function" rule, every `require` call counts (also `pcall(require, ...)`
-- and `require(name)` with a name computed at run time) when any enclosing
-- block is a function; a require in a top-level `if` or `do` runs as the
-- file loads and is not lazy.

local ROOT = "lua"

-- Lexing: spec/support/lua_lex.lua (shared with spec/module_state_spec.lua).
local lex = require "spec.support.lua_lex"

-- Parsing ---------------------------------------------------------------

local function is_op(tok, v) return tok ~= nil and tok.t == "op" and tok.v == v end
local function is_name(tok, v) return tok ~= nil and tok.t == "name" and (v == nil or tok.v == v) end

-- The name of the function whose `function` keyword is toks[k]: the name
-- after it (function a.b:c), or the one assigned to (x = function),
-- else "(anonymous)".
local function function_name(toks, k)
  if is_name(toks[k + 1]) then
    local parts, j = { toks[k + 1].v }, k + 2
    while (is_op(toks[j], ".") or is_op(toks[j], ":")) and is_name(toks[j + 1]) do
      parts[#parts + 1] = toks[j].v .. toks[j + 1].v
      j = j + 2
    end
    return table.concat(parts)
  end
  if is_op(toks[k - 1], "=") and is_name(toks[k - 2]) then
    local parts, j = { toks[k - 2].v }, k - 3
    while is_op(toks[j], ".") and is_name(toks[j - 1]) do
      table.insert(parts, 1, toks[j - 1].v .. ".")
      j = j - 2
    end
    return table.concat(parts)
  end
  return "(anonymous)"
end

-- scan(src) -> { literals = { {v=, line=, infn=, required=} }, requires =
-- { {line=, target=, infn=, fn=} } }. target is the module named (a prefix
-- ends in ".*"), or nil when the name is computed at run time; infn is
-- whether the require (or literal) is inside a function, fn that
-- function's name; required, whether the literal is a require's argument.
local function scan(src)
  local toks = lex(src)
  local literals, requires = {}, {}
  local stack, fns, pending_do = {}, {}, 0 -- blocks open; functions open; while/for awaiting their do
  for k, tok in ipairs(toks) do
    local prev = toks[k - 1]
    if tok.t == "string" then
      literals[#literals + 1] = { v = tok.v, line = tok.line, infn = #fns > 0, required = tok.required }
    elseif tok.t == "name" and not (is_op(prev, ".") or is_op(prev, ":")) then
      local v = tok.v
      if v == "function" then
        local f = { name = function_name(toks, k) }
        stack[#stack + 1] = f
        fns[#fns + 1] = f
      elseif v == "if" or v == "repeat" then
        stack[#stack + 1] = {}
      elseif v == "while" or v == "for" then
        stack[#stack + 1] = {}
        pending_do = pending_do + 1
      elseif v == "do" then
        if pending_do > 0 then pending_do = pending_do - 1 else stack[#stack + 1] = {} end
      elseif v == "end" or v == "until" then
        local b = table.remove(stack)
        if b and b == fns[#fns] then fns[#fns] = nil end
      elseif v == "require" and not is_name(prev, "function") then
        local n1, n2, n3 = toks[k + 1], toks[k + 2], toks[k + 3]
        local target
        if n1 and n1.t == "string" then
          target, n1.required = n1.v, true
        elseif (is_op(n1, "(") or is_op(n1, ",")) and n2 and n2.t == "string" then
          target, n2.required = is_op(n3, "..") and n2.v .. "*" or n2.v, true
        end
        requires[#requires + 1] = {
          line = tok.line, target = target, infn = #fns > 0, fn = fns[#fns] and fns[#fns].name,
        }
      end
    end
  end
  -- every block closed: a check on the parser itself
  return { literals = literals, requires = requires, balanced = #stack == 0 and pending_do == 0 }
end

-- The tree --------------------------------------------------------------

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function lua_files(dir)
  local out = {}
  local p = io.popen("find " .. dir .. " -name '*.lua' | sort")
  for path in p:lines() do out[#out + 1] = path end
  p:close()
  return out
end

-- Every .lua file under lua/luagent, as module name -> path.
local all, names = {}, {}
for _, path in ipairs(lua_files(ROOT .. "/luagent")) do
  local name = path:sub(#ROOT + 2, -5):gsub("/", "."):gsub("%.init$", "")
  all[name] = path
  names[#names + 1] = name
end
table.sort(names)

-- The modules a literal stands for: itself, or every module under a prefix
-- ("luagent.x." or "luagent.x.*").
local function targets_of(lit)
  local prefix = lit:match("^(luagent[%w_.]*%.)%*?$")
  if prefix then
    local out = {}
    for _, name in ipairs(names) do
      if name:sub(1, #prefix) == prefix then out[#out + 1] = name end
    end
    return out
  end
  if all[lit] then return { lit } end
  return {}
end

-- scans[name] = scan of the file; graph[name][dep] = { line = the first line
-- naming dep, how = "requires" or "names" (a literal that is not a require's
-- argument), eager = the first line naming it outside any function }.
local scans, graph = {}, {}
for _, name in ipairs(names) do
  local sc = scan(read(all[name]))
  scans[name] = sc
  local deps = {}
  for _, lit in ipairs(sc.literals) do
    -- "luagent" alone is also the product's name (OTel's sdk name, MCP's
    -- clientInfo): it names the face only as the argument of a require
    local face_name_only = lit.v == "luagent" and not lit.required
    for _, t in ipairs(face_name_only and {} or targets_of(lit.v)) do
      local d = deps[t] or { line = lit.line, how = lit.required and "requires" or "names" }
      deps[t] = d
      if not lit.infn and not d.eager then d.eager = lit.line end
    end
  end
  graph[name] = deps
end

-- Places -----------------------------------------------------------------

local LAYERS = { base = true, model = true, agent = true, observe = true }

-- place(name) -> "face", "runtime", "cli", "config", "core", "bench", a
-- layer (base, model, agent, observe), or nil for a module with no place.
local function place(name)
  if name == "luagent" then return "face" end
  if name == "luagent.runtime" then return "runtime" end
  if name == "luagent.config" then return "config" end
  if name == "luagent.core" then return "core" end
  local top = name:match("^luagent%.([%w_]+)")
  if top == "cli" then return "cli" end
  if top == "mock" or top == "sim" then return "bench" end
  if LAYERS[top] then return top end
end

local ROOT_PLACES = { face = true, runtime = true, cli = true }
local function is_root(name) return ROOT_PLACES[place(name)] == true end
local function is_bench(name) return place(name) == "bench" end

-- The layers each layer may require (luagent.core aside, which all may).
local MAY_REQUIRE = {
  base = { base = true },
  model = { base = true, model = true },
  agent = { base = true, model = true, agent = true },
  observe = { base = true, observe = true },
}
local DIRECTION = {
  base = "base/ requires only base/ and luagent.core",
  model = "model/ requires only base/ and model/",
  agent = "agent/ requires only base/, model/ and agent/",
  observe = "observe/ requires only base/ and observe/ (the bus is base/bus.lua), never model/ or agent/",
}

-- The rules on edges of the graph, each checked on its own (an edge may
-- break more than one: model/ requiring an observer breaks the direction and
-- the observer rule). The bench's own rules are below, apart.
local EDGE_RULES = {}
for _, layer in ipairs { "base", "model", "agent", "observe" } do
  EDGE_RULES[#EDGE_RULES + 1] = {
    id = layer, why = DIRECTION[layer],
    breaks = function(from, to) return place(from) == layer and not MAY_REQUIRE[layer][place(to)] end,
  }
end
local more = {
  { id = "observer_from_call",
    why = "model/ and agent/ never require an observer (observe/): observers register with the call layer's control points",
    breaks = function(from, to)
      return place(to) == "observe" and (place(from) == "model" or place(from) == "agent")
    end },
  { id = "observer_wiring",
    why = "only the composition root (luagent, luagent.runtime, luagent.cli*) wires observers",
    breaks = function(from, to) return place(to) == "observe" and place(from) ~= "observe" and not is_root(from) end },
  { id = "config_base",
    why = "config.lua depends on base/ only",
    breaks = function(from, to) return place(from) == "config" and place(to) ~= "base" end },
  { id = "settings",
    why = "the settings are the runtime's (rt.settings): only the composition root requires luagent.config",
    breaks = function(from, to) return place(to) == "config" and not is_root(from) end },
}
for _, rule in ipairs(more) do EDGE_RULES[#EDGE_RULES + 1] = rule end

-- offences[rule id] = { "path:line: requires dep" }
local offences = {}
for _, rule in ipairs(EDGE_RULES) do offences[rule.id] = {} end
for _, from in ipairs(names) do
  local deps = {}
  for d in pairs(graph[from]) do deps[#deps + 1] = d end
  table.sort(deps, function(a, b) return graph[from][a].line < graph[from][b].line end)
  for _, to in ipairs(deps) do
    for _, rule in ipairs(EDGE_RULES) do
      if from ~= to and rule.breaks(from, to) then
        local d = graph[from][to]
        table.insert(offences[rule.id], all[from] .. ":" .. d.line .. ": " .. d.how .. " " .. to)
      end
    end
  end
end

-- The requires inside a function that are allowed: the composition root's
-- (it may load what is optional on demand, for start-up time), and one in
-- base/ that is not the library's own.
local LAZY_OK = {
  { place = "face", why = "the face: its lazily loaded names, and the default runtime made on first use",
    allows = function() return true end },
  { place = "runtime", why = "runtime.lua: the observers it wires when asked, and the call and agent layers"
      .. " on first use (for start-up time and the heap a host that only serves carries)",
    allows = function(target) return target == nil or place(target) == "observe" or place(target) == "model"
      or place(target) == "agent" end },
  { place = "cli", why = "the CLI: its commands, each loaded when it runs",
    allows = function() return true end },
  { path = ROOT .. "/luagent/base/sandbox.lua", fn = "env.require",
    why = "the require a tool file calls, forwarded once checked: the tool's dependency, not the library's",
    allows = function(target) return target == nil end },
}

local function lazy_allowed(name, req)
  for _, ok in ipairs(LAZY_OK) do
    local here = (ok.place and place(name) == ok.place) or (ok.path and all[name] == ok.path and req.fn == ok.fn)
    if here and ok.allows(req.target) then return true end
  end
  return false
end

local function fail_unless_empty(rule, list)
  assert(#list == 0, rule .. ":\n  " .. table.concat(list, "\n  ")
    .. "\n(" .. #list .. (#list == 1 and " offence)" or " offences)"))
end

-- The path through the graph from `from` to a bench module, or nil.
local function path_to_bench(from)
  local seen, prev, queue = { [from] = true }, {}, { from }
  local head = 1
  while queue[head] do
    local m = queue[head]
    head = head + 1
    local deps = {}
    for d in pairs(graph[m] or {}) do deps[#deps + 1] = d end
    table.sort(deps)
    for _, d in ipairs(deps) do
      if not seen[d] then
        seen[d], prev[d] = true, m
        if is_bench(d) then
          local chain, x = { d }, d
          while prev[x] do x = prev[x]; table.insert(chain, 1, x) end
          return all[from] .. ":" .. graph[from][chain[2]].line .. ": " .. table.concat(chain, " -> ")
        end
        if d ~= "luagent.cli" then queue[#queue + 1] = d end
      end
    end
  end
end

describe("the require graph of lua/luagent", function()
  it("reads requires by parsing: strings, comments and blocks", function()
    local sc = scan(table.concat({
      'local a = require "luagent.base.json"      -- 1: top level',
      '--[[ require "luagent.x" ]] local s = "end function"',
      'if x then local b = require("luagent.base.queue") end  -- 3: load time',
      'local function f()',
      '  local t = { "function", [[ end ]] }',
      '  return pcall(require, "luagent.observe.log")  -- 6',
      'end',
      'M.g = function() for i = 1, 2 do local m = require(names[i]) end end  -- 8',
      'while true do break end',
      'local c = require "luagent.model.providers." .. k  -- 10: top level',
      'local d = require("luagent.model.providers." .. k)',
      'local e = { name = "luagent" }; local face = require "luagent"',
    }, "\n"))
    local got = {}
    for _, r in ipairs(sc.requires) do
      got[#got + 1] = r.line .. " " .. tostring(r.target) .. " " .. tostring(r.infn) .. " " .. tostring(r.fn)
    end
    assert.same({
      "1 luagent.base.json false nil",
      "3 luagent.base.queue false nil",
      "6 luagent.observe.log true f",
      "8 nil true M.g",
      "10 luagent.model.providers. false nil",
      "11 luagent.model.providers.* false nil",
      "12 luagent false nil",
    }, got)
    assert.same({ false, true }, { sc.literals[#sc.literals - 1].required or false, sc.literals[#sc.literals].required })
    assert.truthy(sc.balanced)
    local unbalanced = {}
    for _, name in ipairs(names) do
      if not scans[name].balanced then unbalanced[#unbalanced + 1] = all[name] end
    end
    assert.same({}, unbalanced)
    assert.truthy(all["luagent"], "lua/luagent/init.lua is the face")
    assert.truthy(all["luagent.base.bus"])
    assert.truthy(all["luagent.mock"])
    assert.truthy(graph["luagent.base.bus"]["luagent.base.json"])
    -- a prefix stands for the modules under it
    local under = {}
    for _, t in ipairs(targets_of("luagent.base.")) do under[t] = true end
    assert.truthy(under["luagent.base.json"] and under["luagent.base.bus"])
    assert.same({}, targets_of("luagent.no_such_module"))
  end)

  it("gives every module a place (a layer folder, config, the root or the bench)", function()
    local bad = {}
    for _, name in ipairs(names) do
      if not place(name) then bad[#bad + 1] = all[name] .. ": " .. name end
    end
    fail_unless_empty("every module has a place", bad)
  end)

  for _, rule in ipairs(EDGE_RULES) do
    it("keeps the rule: " .. rule.why, function()
      fail_unless_empty(rule.why, offences[rule.id])
    end)
  end

  it("has no require inside a function outside the composition root", function()
    local bad = {}
    for _, name in ipairs(names) do
      for _, req in ipairs(scans[name].requires) do
        if req.infn and not lazy_allowed(name, req) then
          bad[#bad + 1] = string.format("%s:%d (in %s): require %s", all[name], req.line, req.fn,
            req.target or "(a name computed at run time)")
        end
      end
    end
    fail_unless_empty("no require inside a function outside the composition root (face, runtime, CLI; see LAZY_OK)",
      bad)
  end)

  it("keeps every product module away from the mock and the simulation", function()
    local bad = {}
    for _, name in ipairs(names) do
      if not is_bench(name) and name ~= "luagent.cli" then
        local chain = path_to_bench(name)
        if chain then bad[#bad + 1] = chain end
      end
    end
    fail_unless_empty("the product never reaches the bench (luagent.mock*, luagent.sim*) except from luagent.cli", bad)
  end)

  it("lets luagent.cli reach the bench only lazily, inside a function", function()
    local bad = {}
    for _, d in ipairs(names) do
      local where = graph["luagent.cli"][d]
      if is_bench(d) and where and where.eager then
        bad[#bad + 1] = all["luagent.cli"] .. ":" .. where.eager .. ": names " .. d .. " outside a function"
      end
    end
    fail_unless_empty("luagent.cli reaches the bench only inside a function", bad)
  end)

  it("has the bench require luagent.core and product modules, never the face `luagent`", function()
    local bad = {}
    for _, name in ipairs(names) do
      local where = is_bench(name) and graph[name]["luagent"]
      if where then bad[#bad + 1] = all[name] .. ":" .. where.line .. ": requires luagent" end
    end
    fail_unless_empty("the bench never requires the face", bad)
  end)
end)

describe("the C core", function()
  it("is not handed out by the face: require('luagent').core is nil", function()
    local luagent = require "luagent"
    local ok, core = pcall(function() return luagent.core end)
    local where = all["luagent"]
    local n = 0
    for line in (read(where) .. "\n"):gmatch("(.-)\n") do
      n = n + 1
      if line:match("^%s*core%s*=") then where = where .. ":" .. n break end
    end
    assert(not ok or core == nil, where .. ": the face exports luagent.core (the C core is reached only"
      .. " through the modules that wrap it)")
  end)

  it("is reached by no example, nor is any module but the face", function()
    local bad = {}
    for _, path in ipairs(lua_files("examples")) do
      for _, lit in ipairs(scan(read(path)).literals) do
        -- the test bench (the mock provider, the simulation) is required by name
        if lit.v:match("^luagent%.") and not is_bench(lit.v) then
          bad[#bad + 1] = path .. ":" .. lit.line .. ": names " .. lit.v
        end
      end
    end
    fail_unless_empty("examples use the public API (require \"luagent\") and the bench, never the C core or a module", bad)
  end)
end)
