-- An agent as a tool of another (`luagent.tools.agent(child, {name =,
-- description =, params =})`): a checked tool that carries the child; the
-- agent loop (lua/luagent/agent/loop.lua, Agent:run_subagent) runs it, not
-- the tool runner, so the child's run is a run of its own (its events on
-- the bus, its spans under the call's execute_tool span, its cost rolled
-- up into the parent's) and never runs inside a tool's sandbox. This file
-- knows an agent only by its metatable's name: the tools layer does not
-- require the loop.
local tool = require "luagent.agent.tools.tool"
local options = require "luagent.base.options"

local M = {}

-- The options tools.agent takes (M.new reads them): any other raises,
-- naming the nearest. A new option is added here.
M.OPTIONS = options.known { "name", "description", "params" }

-- The arguments a sub-agent takes when no params are given: its prompt.
local function default_params()
  return { type = "object", properties = { input = { type = "string", description = "the task for the agent" } },
           required = { "input" } }
end

local function is_agent(v)
  local mt = type(v) == "table" and getmetatable(v)
  return type(mt) == "table" and mt.__name == "luagent.Agent"
end

-- new(child, opts) -> a tool whose calls run `child` (opts: name,
-- description, params; name defaults to the child's). Raises on misuse.
function M.new(child, opts, level)
  level = (level or 1) + 1
  if not is_agent(child) then error("tools.agent: expects an agent (luagent.agent{...}) first", level) end
  opts = opts or {}
  if type(opts) ~= "table" then error("tools.agent: options must be a table {name =, description =, params =}", level) end
  options.check(opts, M.OPTIONS, "tools.agent", level)
  local t, err = tool.check {
    name = opts.name or child.name,
    description = opts.description or ("Hands a task to the agent " .. child.name .. " and returns its answer"),
    params = opts.params or default_params(),
    run = function() error("tools.agent: a sub-agent runs through its parent's loop", 0) end,
  }
  if not t then error("tools.agent: " .. tostring(err), level) end
  t.subagent = { agent = child, custom_params = opts.params ~= nil }
  return t
end

-- The prompt a call hands the child: `input` with the default params,
-- else the arguments as JSON.
function M.prompt_of(t, args, encode)
  if not t.subagent.custom_params and type(args.input) == "string" then return args.input end
  return encode(args)
end

return M
