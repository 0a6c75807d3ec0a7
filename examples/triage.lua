-- triage.lua: an agent that triages crash reports with the tools in
-- examples/tools/ (a hot-reloaded tool set): read-only crash_list,
-- crash_show and issue_search, a command tool (grep, a child process), and
-- create_issue, which changes the world and so has neither safety flag.
--
--   make run                                       (no key: the embedded mock
--                                                   replays triage.cassette.jsonl,
--                                                   a 503 injected on the first call)
--   build/luagent run examples/triage.lua          (the same, without the 503)
--   OPENAI_API_KEY=... build/luagent run --tools examples/tools examples/triage.lua
--
-- The output is the retry-safe view of the agent's events: each tool call,
-- each retry and the answer appear once, whatever was retried.
local luagent = require "luagent"

local here = arg and arg[0] and arg[0]:match("^(.*)/[^/]*$") or "examples"
local tools = luagent.options and luagent.options.tools or assert(luagent.tools.dir(here .. "/tools"))

local agent = luagent.agent {
  name = "triage",
  model = os.getenv("LUAGENT_MODEL") or "openai/gpt-4o-mini",
  system = "You triage crash reports. Use the tools to read every new crash, look for a known "
    .. "issue, and file an issue only for a crash no open issue covers. End with a short summary.",
  tools = tools,
  max_turns = 8,
  max_tokens = 400,
}

local function shorten(text, n)
  text = tostring(text or ""):gsub("%s+$", "")
  local first = text:match("^[^\n]*")
  local more = select(2, text:gsub("\n", ""))
  if #first > n then first = first:sub(1, n - 3) .. "..." end
  return more > 0 and string.format("%s (+%d lines)", first, more) or first
end

local function args_text(a)
  local s = luagent.json.encode(a or {})
  return shorten(s == "[]" and "{}" or s, 90)
end

io.stdout:setvbuf("line")

io.stdout:write(string.format("triage agent on %s with tools: %s\n", agent.provider.model,
  table.concat(tools:snapshot().names, ", ")))
local last
for ev in luagent.events.retry_safe(agent:prompt("Triage the new crash reports.")) do
  if ev.type == "tool_execution_start" then
    print(string.format("-> %s %s", ev.name, args_text(ev.arguments)))
  elseif ev.type == "tool_execution_end" then
    if ev.error then
      print(string.format("   <- %s failed: %s", ev.name, shorten(ev.error.message, 90)))
    else
      print(string.format("   <- %s: %s", ev.name, shorten(ev.result, 90)))
    end
  elseif ev.type == "tool_retry" then
    print(string.format("   [%s failed (%s); retry %d of %d in %.2f s]", ev.name, ev.error_message, ev.attempt,
      ev.max_attempts - 1, ev.delay))
  elseif ev.type == "provider_retry" then
    print(string.format("[model call attempt %d of %d failed: %s; retrying in %.2f s]",
      ev.attempt, ev.max_attempts, ev.error_message, ev.delay))
  elseif ev.type == "tools_changed" and ev.version > 1 then
    print("[tools changed: +" .. table.concat(ev.added, ",") .. " -" .. table.concat(ev.removed, ",")
      .. " ~" .. table.concat(ev.changed, ",") .. "]")
  elseif ev.type == "tools_reload_failed" then
    print("[tool file failed, previous version kept: " .. ev.message .. "]")
  elseif ev.type == "message_end" and ev.final and ev.message and ev.message.content ~= "" then
    if ev.message.tool_calls then
      print("model: " .. ev.message.content)
    else
      print("\n" .. ev.message.content .. "\n")
    end
  elseif ev.type == "agent_end" then
    last = ev
  end
end
local u = last.usage or {}
local cost = last.cost and last.cost.total and string.format("; cost $%.4f", last.cost.total) or ""
io.stdout:write(string.format("[%s after %d turn(s); tokens in %d, out %d%s%s]\n", last.stop_reason, last.turns,
  u.input_tokens or 0, u.output_tokens or 0, cost, last.reason and ("; " .. last.reason) or ""))
if last.error then
  io.stderr:write("[error: " .. tostring(last.error) .. "]\n")
  os.exit(1)
end
