-- The product apart from its test bench: the require graph of lua/luagent.
-- Product modules (the API, retry, classify, policy, endpoint, providers,
-- events, http, agent, tools, log, secrets, sandbox, compact, record, ...)
-- never reach the mock provider (luagent.mock*) or the simulation
-- (luagent.sim*), directly or through another module. cli.lua is the one
-- entry point to the bench, and requires it lazily (inside a function).
-- The bench requires luagent.core and product modules, never the face
-- (`require "luagent"`), so there is no cycle through it.
--
-- Every string literal naming a module counts as a dependency (so a name
-- in a table of lazily loaded modules counts too); a literal ending in "."
-- that is concatenated ("luagent.model.providers." .. name) stands for every
-- module under it.

local ROOT = "lua"

-- Every .lua file under lua/luagent, as module name -> path.
local function modules()
  local out = {}
  local p = io.popen("find " .. ROOT .. "/luagent -name '*.lua' | sort")
  for path in p:lines() do
    local name = path:sub(#ROOT + 2, -5):gsub("/", ".")
    name = name:gsub("%.init$", "")
    out[name] = path
  end
  p:close()
  return out
end

-- The text of a Lua file with its comments removed (strings kept).
local function code_of(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  local out, i, n = {}, 1, #s
  while i <= n do
    local c = s:sub(i, i)
    if c == '"' or c == "'" then
      local j = i + 1
      while j <= n and s:sub(j, j) ~= c do
        if s:sub(j, j) == "\\" then j = j + 1 end
        j = j + 1
      end
      out[#out + 1] = s:sub(i, j)
      i = j + 1
    elseif s:sub(i, i + 1) == "--" then
      local level = s:match("^%[(=*)%[", i + 2)
      if level then
        local _, e = s:find("]" .. level .. "]", i, true)
        i = (e or n) + 1
      else
        i = (s:find("\n", i, true) or n + 1)
      end
    elseif s:match("^%[=*%[", i) then
      local level = s:match("^%[(=*)%[", i)
      local _, e = s:find("]" .. level .. "]", i, true)
      out[#out + 1] = s:sub(i, e or n)
      i = (e or n) + 1
    else
      out[#out + 1] = c
      i = i + 1
    end
  end
  return table.concat(out)
end

-- The modules a file names: name -> the first line's text naming it, and
-- whether that line is at the top level of the file (not indented).
local function deps(path, all)
  local found = {}
  local lineno = 0
  for line in (code_of(path) .. "\n"):gmatch("(.-)\n") do
    lineno = lineno + 1
    for q, lit in line:gmatch("([\"'])(luagent[%w_.]*)%1") do
      local targets = {}
      if lit:sub(-1) == "." then
        for name in pairs(all) do
          if name:sub(1, #lit) == lit then targets[#targets + 1] = name end
        end
      elseif all[lit] then
        targets[1] = lit
      end
      for _, t in ipairs(targets) do
        if not found[t] then
          found[t] = { line = lineno, top = not line:match("^%s") }
        end
      end
    end
  end
  return found
end

local function is_bench(name)
  return name:match("^luagent%.mock$") or name:match("^luagent%.mock%.")
    or name:match("^luagent%.sim$") or name:match("^luagent%.sim%.")
end

local all = modules()
local graph = {}
for name, path in pairs(all) do graph[name] = deps(path, all) end

-- The path through the graph from `from` to a bench module, or nil.
local function path_to_bench(from)
  local seen, prev, queue = { [from] = true }, {}, { from }
  local head = 1
  while queue[head] do
    local m = queue[head]
    head = head + 1
    for d in pairs(graph[m] or {}) do
      if not seen[d] then
        seen[d], prev[d] = true, m
        if is_bench(d) then
          local chain, x = { d }, d
          while prev[x] do x = prev[x]; table.insert(chain, 1, x) end
          return table.concat(chain, " -> ")
        end
        if d ~= "luagent.cli" then queue[#queue + 1] = d end
      end
    end
  end
end

describe("the require graph of lua/luagent", function()
  it("finds the modules and their requires", function()
    assert.truthy(all["luagent"], "lua/luagent/init.lua is the face")
    assert.truthy(all["luagent.model.call"])
    assert.truthy(all["luagent.mock"])
    assert.truthy(graph["luagent.model.call"]["luagent.model.endpoint"])
    -- a prefix stands for the modules under it
    assert.truthy(graph["luagent.model.provider"]["luagent.model.providers.anthropic"])
  end)

  it("keeps every product module away from the mock and the simulation", function()
    local bad = {}
    local names = {}
    for name in pairs(all) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
      if not is_bench(name) and name ~= "luagent.cli" then
        local chain = path_to_bench(name)
        if chain then bad[#bad + 1] = all[name] .. ": " .. chain end
      end
    end
    assert.same({}, bad)
  end)

  it("lets cli.lua reach the bench only lazily, inside a function", function()
    local eager = {}
    for d, where in pairs(graph["luagent.cli"]) do
      if is_bench(d) and where.top then eager[#eager + 1] = all["luagent.cli"] .. ":" .. where.line .. ": " .. d end
    end
    assert.same({}, eager)
  end)

  it("has the bench require luagent.core, never the face `luagent`", function()
    local bad = {}
    for name, path in pairs(all) do
      local where = is_bench(name) and graph[name]["luagent"]
      if where then bad[#bad + 1] = path .. ":" .. where.line end
    end
    table.sort(bad)
    assert.same({}, bad)
  end)
end)
