-- The tools layer as agents and scripts see it (luagent.tools): what a tool
-- is and how one call runs (tool.lua), and the tool sets (set.lua: what a
-- set is, and a static list; dir.lua: a watched folder; mcp/: an MCP
-- server's tools). This module only gathers them: none of its parts
-- requires it, or one another's kind, so the graph is one direction:
--   schema <- tool <- set <- dir, mcp <- this
local tool = require "luagent.agent.tools.tool"
local set = require "luagent.agent.tools.set"
local dir = require "luagent.agent.tools.dir"
local mcp = require "luagent.agent.tools.mcp"
local agent_tool = require "luagent.agent.tools.agent"

---Tools and tool sets (`luagent.tools`).
---@class luagent.tools
---@field new fun(t: luagent.ToolDef): luagent.Tool checks a tool's definition; raises on a bad one, naming the field
---@field check fun(t: luagent.ToolDef, source?: string): luagent.Tool?, string?, string? the same as a value: the tool, or nil, message and field
---@field static fun(list: luagent.ToolDef[]): luagent.ToolSet a set of these tools that never changes
---@field is_set fun(v: any): boolean whether `v` is a tool set (anything with `:snapshot()`)
local M = {
  -- tools (lua/luagent/agent/tools/tool.lua); the constants are copies
  Tool = tool.Tool,
  NAME_PATTERN = tool.NAME_PATTERN,
  MAX_NAME = tool.MAX_NAME,
  MAX_PARAMS_DEPTH = tool.MAX_PARAMS_DEPTH,
  check = tool.check,             -- check(t [, source]) -> tool | nil, message, field
  new = tool.new,                 -- new(t) -> tool; raises on a bad definition
  spec = tool.spec,               -- spec(tool) -> the request's tools entry
  bound = tool.bound,             -- bound(text, cap [, total]) -> text cut to cap bytes
  execute = tool.execute,         -- execute(tool, call, opts) -> outcome
  check_outcome = tool.check_outcome,
  needs_approval = tool.needs_approval, -- (tool, call, opts) -> whether the call waits for a decision | nil, err
  section_in_force = tool.section_in_force, -- (tool_policy, policy, cache) -> the tool section
  unflagged_note = tool.unflagged_note, -- (tool, timeout) -> what a timeout of an unflagged tool does, or nil
  first_note = tool.first_note,   -- (rt.noted, tool) -> whether that note is due for its definition (marks it)
  mcp_flags = mcp.flags_for, -- (tool, tool section) -> read_only, idempotent of an MCP tool under that section
  -- tool sets (lua/luagent/agent/tools/set.lua)
  static = set.static,            -- static(list) -> a set that never changes
  is_set = set.is_set,
  subagent_prompt = agent_tool.prompt_of, -- (tool, args, encode) -> the text a sub-agent's call prompts it with
}

-- agent(child, opts) -> a tool whose calls run the agent `child`
-- (lua/luagent/agent/tools/agent.lua; the loop runs it).
---An agent as a tool of another: each call runs `child` on the call's
---`input` (or, with `params`, its arguments as JSON) and returns its last
---answer. Its run nests under the parent's `execute_tool` span, its text
---reaches the parent as `tool_execution_update` (`data = {agent =, delta =}`),
---its tokens and cost roll up into the parent's `agent_end`; an abort of
---the parent aborts it; a child that does not end with an answer gives an
---error result saying why (docs/guide/agent.md, "Sub-agents").
---@param child luagent.Agent
---@param opts? {name: string?, description: string?, params: table?} the tool's name (default the child's), what the model reads, the arguments' JSON Schema (default `{input: string}`)
---@return luagent.Tool
function M.agent(child, opts)
  return agent_tool.new(child, opts, 2)
end

-- dir(path [, opts]) -> a tool set loaded from the *.lua files of a folder
-- and reloaded when they change (lua/luagent/agent/tools/dir.lua).
---A tool set of the `*.lua` files of a folder (each returns a tool or a
---list of tools), watched: a changed file is reloaded between turns; a
---broken one keeps its previous tools and is reported
---(`tools_reload_failed`).
---@param path string the folder
---@param opts? {watch: boolean?, debounce: number?} `watch = false`: read the folder once, no watcher; `debounce`: seconds of quiet after a change before the folder is read again (0.05)
---@param rt? luagent.Runtime with it, the set's notes (a tool with neither read_only nor idempotent) go to that runtime's log, and its default policy gives their timeout
---@return luagent.ToolSet? set
---@return luagent.Error? err when the folder cannot be read
function M.dir(path, opts, rt)
  return dir.open(path, opts, rt)
end

-- mcp{command = {argv...} | url = "http://...", ...} -> a tool set of the
-- tools of an MCP server, re-listed when they change
-- (lua/luagent/agent/tools/mcp/init.lua).
-- With `rt`, the set belongs to that runtime (its default policy; closed
-- with it).
---A tool set of an MCP server's tools: a command speaking stdio, or a
---Streamable HTTP URL. Restarted with backoff when it dies; re-listed
---when its tools change.
---@param opts luagent.McpOptions
---@return luagent.McpSet? set
---@return luagent.Error? err when the server fails to start or to answer the handshake
function M.mcp(opts, rt)
  -- a tail call: open's errors name the line that called tools.mcp
  return mcp.open(opts, rt)
end

return M
