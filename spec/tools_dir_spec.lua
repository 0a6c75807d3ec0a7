-- Hot-reloaded tool sets: a folder of tool files edited, broken, fixed,
-- renamed over and deleted while an agent runs; each change reaches the
-- agent between turns, as events, and decides which definition serves
-- each call. Real file watching (inotify) on the real clock.
local luagent = require "luagent"
local mock = require "luagent.mock"
local tools = require "luagent.agent.tools"
local helpers = require "spec.support.helpers"

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

-- A tool file whose tool `version` answers `v`.
local function version_tool(v)
  return 'local answer = "' .. v .. '"\nreturn {\n  name = "version",\n  description = "Which version answers",\n'
    .. '  read_only = true,\n  run = function() return answer end,\n}\n'
end

local dir
before_each(function()
  luagent.configure { log_sink = function() end }
  dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir " .. dir))
end)
after_each(function()
  os.execute("rm -rf " .. dir)
  luagent.configure { log_sink = false }
end)

-- Waits (real clock) until the set has logged more than `seq` events.
local function await_log(set, seq)
  local t0 = luagent.now()
  while set.seq <= seq do
    assert(luagent.now() - t0 < 5, "the tool set did not reload")
    luagent.sleep(0.01)
  end
end

describe("tools.dir", function()
  it("loads every *.lua file, each in its own environment, and checks the tools", function()
    write(dir .. "/a.lua", 'shared = "a"\nreturn { name = "a", description = "A", run = function() return shared end }\n')
    write(dir .. "/b.lua", 'return {\n  { name = "b1", description = "B1", command = { "true" } },\n'
      .. '  { name = "b2", description = "B2", run = function() return tostring(shared) end },\n}\n')
    write(dir .. "/notes.txt", "not a tool")
    local set = assert(tools.dir(dir, { watch = false }))
    assert.same({ "a", "b1", "b2" }, set:snapshot().names)
    assert.equal("a", set:snapshot().tools.a.run())
    assert.equal("nil", set:snapshot().tools.b2.run()) -- a's global did not leak into b
    assert.is_nil(rawget(_G, "shared"))
    local evs = set:events_since(nil)
    assert.equal(1, #evs)
    assert.equal("tools_changed", evs[1].type)
    assert.same({ "a", "b1", "b2" }, evs[1].added)
  end)

  it("reports a bad file with file and line, and keeps unique names across files", function()
    write(dir .. "/a.lua", 'return { name = "dup", description = "A", run = function() end }\n')
    write(dir .. "/b.lua", 'return {\n  name = "dup",\n  description = "B",\n  run = function() end,\n}\n')
    write(dir .. "/c.lua", 'return {\n  name = "c",\n  description = 42,\n  run = function() end,\n}\n')
    write(dir .. "/d.lua", 'return {\n  name = "d"\n  description = "missing comma",\n}\n')
    write(dir .. "/e.lua", 'while true do end\n')
    write(dir .. "/f.lua", string.dump(load('return { name = "f", description = "F", command = { "true" } }')))
    local set = assert(tools.dir(dir, { watch = false }))
    assert.same({ "dup" }, set:snapshot().names)
    local failed = {}
    for _, e in ipairs(set:events_since(nil)) do
      if e.type == "tools_reload_failed" then failed[e.file:match("[^/]+$")] = e end
    end
    assert.equal(2, failed["b.lua"].line)
    assert.matches("b.lua:2: tool name 'dup' is already defined in .*a.lua", failed["b.lua"].message)
    assert.equal(3, failed["c.lua"].line)
    assert.matches("c.lua:3: tool 'c': description must be a non%-empty string", failed["c.lua"].message)
    assert.equal(3, failed["d.lua"].line)
    assert.matches("instruction limit", failed["e.lua"].message)
    assert.matches("attempt to load a binary chunk", failed["f.lua"].message) -- text only
  end)

  -- The tools_reload_failed events of a set, by file name.
  local function failures(set, cursor)
    local out = {}
    for _, e in ipairs((set:events_since(cursor))) do
      if e.type == "tools_reload_failed" then out[e.file:match("[^/]+$")] = e end
    end
    return out
  end

  local CAP = require("luagent.model.policy").limits.max_bytes

  -- Should reading the FIFO at `path` ever block again, a writer ends the
  -- wait after 3 s (opening read-write never blocks), so the spec fails
  -- instead of freezing the suite. Stopped when the test ends.
  local function unblock_later(path)
    local p = io.popen("setsid sh -c 'sleep 3; exec 3<>\"$1\"' sh " .. path .. " >/dev/null 2>&1 & echo $!")
    local pid = p:read("n")
    p:close()
    -- its group (the sleep too), and itself should setsid not have run yet
    finally(function() os.execute("kill -- -" .. pid .. " " .. pid .. " 2>/dev/null") end)
  end

  it("refuses a FIFO named *.lua, naming it, without waiting for a writer", function()
    write(dir .. "/a.lua", 'return { name = "a", description = "A", run = function() return "a" end }\n')
    assert(os.execute("mkfifo " .. dir .. "/fifo.lua"))
    unblock_later(dir .. "/fifo.lua")
    local set = assert(tools.dir(dir, { watch = false }))
    assert.same({ "a" }, set:snapshot().names)
    local f = failures(set)["fifo.lua"]
    assert.equal(dir .. "/fifo.lua", f.file)
    assert.equal(dir .. "/fifo.lua: not a regular file (a FIFO)", f.message)
  end)

  it("refuses a link to a device, and a file over the policy files' 1 MiB, without reading them", function()
    assert(os.execute("ln -s /dev/zero " .. dir .. "/zero.lua"))
    assert(os.execute("truncate -s " .. (CAP + 1) .. " " .. dir .. "/big.lua")) -- sparse
    -- exactly the bound, and a link to a regular file, are fine
    local tool = 'return { name = "full", description = "F", run = function() return "f" end }\n'
    write(dir .. "/full.lua", tool .. "--" .. string.rep("x", CAP - #tool - 3) .. "\n")
    write(dir .. "/target.txt", 'return { name = "linked", description = "L", run = function() return "l" end }\n')
    assert(os.execute("ln -s target.txt " .. dir .. "/linked.lua"))
    local set = assert(tools.dir(dir, { watch = false }))
    assert.same({ "full", "linked" }, set:snapshot().names)
    local f = failures(set)
    assert.equal(dir .. "/zero.lua: not a regular file (a character device)", f["zero.lua"].message)
    assert.equal(string.format("%s/big.lua: the file is %d bytes; at most %d are read", dir, CAP + 1, CAP),
      f["big.lua"].message)
    assert.is_nil(f["big.lua"].line)
  end)

  it("keeps the last good tools of a file replaced by a FIFO or a file too big, and loads it once fixed", function()
    local good = 'return { name = "t", description = "T", run = function() return "good" end }\n'
    write(dir .. "/t.lua", good)
    local set = assert(tools.dir(dir, { watch = false }))
    local _, cursor = set:events_since(nil)
    os.remove(dir .. "/t.lua")
    assert(os.execute("mkfifo " .. dir .. "/t.lua"))
    unblock_later(dir .. "/t.lua")
    assert.equal(1, set:rescan())
    assert.equal("good", set:snapshot().tools.t.run())
    assert.matches("t.lua: not a regular file", failures(set, cursor)["t.lua"].message)
    _, cursor = set:events_since(cursor)
    assert.equal(1, set:rescan()) -- still refused; told once
    assert.same({}, (set:events_since(cursor)))
    os.remove(dir .. "/t.lua")
    assert(os.execute("truncate -s " .. (CAP * 1200) .. " " .. dir .. "/t.lua")) -- 1.2 GB, sparse
    assert.equal(1, set:rescan())
    assert.equal("good", set:snapshot().tools.t.run())
    assert.matches("t.lua: the file is %d+ bytes", failures(set, cursor)["t.lua"].message)
    _, cursor = set:events_since(cursor)
    write(dir .. "/t.lua", good:gsub('"good"', '"fixed"'))
    assert.equal(0, set:rescan())
    assert.equal("fixed", set:snapshot().tools.t.run())
  end)

  it("reads what a file returns raw, gives it no debug and no finalizer, and its own path as ...; on a reload too", function()
    -- each hostile part spins for 2 s of CPU time and then goes on, so code
    -- that runs it outside the load's bounds ends, and is seen to take long
    local spin = "local function spin() local t0 = os.clock() while os.clock() - t0 < 2 do end end\n"
    local function tool(name) return 'name = "' .. name .. '", description = "D", run = function() return "ok" end' end
    local files = {
      index = spin .. "return setmetatable({ " .. tool("index") .. " }, { __index = function() spin() end })\n",
      pairs = spin .. "return setmetatable({ " .. tool("pairs") .. " }, { __pairs = function(t) spin() return next, t end })\n",
      len = spin .. "return setmetatable({ { " .. tool("len") .. " } }, { __len = function() spin() return 1 end })\n",
      tostring = spin .. 'return { name = setmetatable({}, { __tostring = function() spin() return "n" end }), '
        .. 'description = "D", run = print }\n',
      gc = spin .. "setmetatable({}, { __gc = spin })\nreturn { " .. tool("gc") .. " }\n",
      hook = spin .. "debug.sethook()\nspin()\nreturn { " .. tool("hook") .. " }\n",
      require = spin .. 'require("debug").sethook()\nspin()\nreturn { ' .. tool("require") .. " }\n",
      path = "local path = ...\nreturn { name = 'path', description = path, run = function() return path end }\n",
    }
    for name, text in pairs(files) do write(dir .. "/" .. name .. ".lua", text) end
    local t0 = luagent.now()
    local set = assert(tools.dir(dir, { watch = false }))
    collectgarbage()
    collectgarbage()
    local took = luagent.now() - t0
    assert.is_true(took < 1.5, "loading took " .. took)
    assert.same({ "index", "len", "pairs", "path" }, set:snapshot().names)
    assert.equal(dir .. "/path.lua", set:snapshot().tools.path.description)
    assert.equal(tools.Tool, getmetatable(set:snapshot().tools.index))
    local failed = {}
    for _, e in ipairs(set:events_since(nil)) do
      if e.type == "tools_reload_failed" then failed[e.file:match("([^/]+)%.lua$")] = e.message end
    end
    assert.matches("tostring.lua:2: name must match %[A%-Za%-z0%-9_%-%]{1,64} %(got a table%)", failed.tostring)
    assert.matches("gc.lua:2: setmetatable: a tool file may not set a __gc", failed.gc)
    assert.matches("hook.lua:2: .*global 'debug'", failed.hook)
    assert.matches("require.lua:2: require: a tool file may not load 'debug'", failed.require)
    -- a reload that brings a hostile version keeps the previous tool
    write(dir .. "/path.lua", files.hook)
    t0 = luagent.now()
    assert.equal(1, set:rescan())
    took = luagent.now() - t0
    assert.is_true(took < 1.5, "the reload took " .. took)
    assert.equal(dir .. "/path.lua", set:snapshot().tools.path.description)
  end)

  it("refuses a folder that cannot be read", function()
    local set, err = tools.dir(dir .. "/missing")
    assert.is_nil(set)
    assert.equal("usage", err.kind)
    assert.matches("cannot read folder", err.message)
  end)

  it("swaps edits, breaks, fixes, renames and deletions in between turns of a running agent", function()
    write(dir .. "/v.lua", version_tool("v1"))
    local set = assert(tools.dir(dir, { debounce = 0.02 }))
    local srv
    finally(function() -- one finally per test (busted keeps the last one)
      set:close()
      if srv then srv:close() end
    end)
    -- `step` edits the folder, then waits until the set has reloaded, so the
    -- change is there before the next turn
    local actions = {
      edit = function() write(dir .. "/v.lua", version_tool("v2")) end,
      ["break"] = function() write(dir .. "/v.lua", version_tool("v9") .. "return return\n") end,
      fix = function() -- an editor's save: a temporary file renamed over the old one
        write(dir .. "/.v.lua.swp", version_tool("v3"))
        assert(os.rename(dir .. "/.v.lua.swp", dir .. "/v.lua"))
      end,
      add = function() write(dir .. "/w.lua", 'return { name = "extra", description = "E", run = function() return "x" end }\n') end,
      delete = function() os.remove(dir .. "/v.lua") end,
    }
    local step = { name = "step", description = "Changes the tool folder",
      params = { type = "object", properties = { action = { type = "string" } }, required = { "action" } },
      run = function(args)
        local seq = set.seq
        actions[args.action]()
        await_log(set, seq)
        return args.action .. " done"
      end }
    local function turn(action, ...)
      local calls = { { id = "v", name = "version", arguments = {} } }
      for _, extra in ipairs({ ... }) do calls[#calls + 1] = { id = extra, name = extra, arguments = {} } end
      if action then calls[#calls + 1] = { id = "s", name = "step", arguments = { action = action } } end
      return { tools = calls }
    end
    local script = { turn("edit"), turn("break"), turn("fix"), turn("add"), turn("delete", "extra"), turn(nil), { text = "done" } }
    srv = assert(mock.start { script = function(_, n) return script[n] end })
    local a = luagent.agent { model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" },
      tools = { step, set }, max_parallel_tools = 1, max_turns = 10 }
    local log, served = {}, {}
    for ev in a:prompt("go") do
      if ev.type == "tools_changed" then
        log[#log + 1] = "changed +" .. table.concat(ev.added, ",") .. " -" .. table.concat(ev.removed, ",")
          .. " ~" .. table.concat(ev.changed, ",")
      elseif ev.type == "tools_reload_failed" then
        log[#log + 1] = "failed " .. ev.file:match("[^/]+$") .. ":" .. tostring(ev.line)
        assert.matches("v.lua:8:", ev.message)
      elseif ev.type == "turn_start" then
        log[#log + 1] = "turn " .. ev.turn
      elseif ev.type == "tool_execution_end" and ev.name ~= "step" then
        served[#served + 1] = ev.name .. "=" .. (ev.result or ev.error.kind)
      elseif ev.type == "agent_end" then
        assert.equal("stop", ev.stop_reason)
      end
    end
    assert.same({
      "changed +version - ~", -- the first load
      "turn 1", "changed + - ~version", "turn 2", "failed v.lua:8", "turn 3", "changed + - ~version",
      "turn 4", "changed +extra - ~", "turn 5", "changed + -version ~", "turn 6", "turn 7",
    }, log)
    assert.same({ "version=v1", "version=v2", "version=v2", "version=v3", "version=v3", "extra=x",
                  "version=unknown_tool" }, served)
    -- the model was only ever offered what the set held at each turn
    local offered = {}
    for _, r in ipairs(srv:requests()) do
      local names = {}
      for _, t in ipairs(r.body.tools or {}) do names[#names + 1] = t["function"].name end
      offered[#offered + 1] = table.concat(names, ",")
    end
    assert.equal("step,version", offered[1])
    assert.equal("step,extra", offered[6])
  end)

  it("lets a call that is running finish on the definition it started with", function()
    -- the old version rewrites its own file, waits for the reload, and still answers "old"
    local old = 'return { name = "me", description = "Edits itself", run = function()\n'
      .. '  local set = require("spec.selfedit_set")\n'
      .. '  local v = set:version()\n'
      .. '  local f = io.open(set.path .. "/me.lua", "w")\n'
      .. '  f:write(\'return { name = "me", description = "New", run = function() return "new" end }\')\n'
      .. '  f:close()\n'
      .. '  while set:version() == v do require("luagent").sleep(0.01) end\n'
      .. '  return "old"\n'
      .. 'end }\n'
    write(dir .. "/me.lua", old)
    local set = assert(tools.dir(dir, { debounce = 0.02 }))
    package.loaded["spec.selfedit_set"] = set
    local srv
    finally(function()
      set:close()
      package.loaded["spec.selfedit_set"] = nil
      if srv then srv:close() end
    end)
    local call = { tools = { { id = "1", name = "me", arguments = {} } } }
    srv = assert(mock.start { script = function(_, n) return n <= 2 and call or nil end })
    local a = luagent.agent { model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" },
      tools = set }
    local answers = {}
    for ev in a:prompt("go") do
      if ev.type == "tool_execution_end" then answers[#answers + 1] = ev.result end
    end
    assert.same({ "old", "new" }, answers)
  end)

  it("luagent run --tools DIR gives the script luagent.options.tools", function()
    write(dir .. "/t.lua", 'return { name = "t", description = "T", run = function() return "ok" end }\n')
    local path = helpers.tempfile('local o = require("luagent").options\n'
      .. 'print(table.concat(o.tools:snapshot().names, ","), o.tools:snapshot().tools.t.run())', ".lua")
    local r = helpers.run("run", "--tools", dir, path)
    assert.equal(0, r.code, r.stderr)
    assert.equal("t\tok\n", r.stdout)
    r = helpers.run("run", "--tools", dir .. "/missing", path)
    os.remove(path)
    assert.equal(2, r.code)
    assert.matches("run: %-%-tools: cannot read folder", r.stderr)
  end)
end)
