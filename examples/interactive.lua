-- interactive.lua: a small REPL of its own, over one agent. It reads one
-- prompt per line (io.read: the loop waits with it, which is fine for a
-- REPL that does nothing else meanwhile), streams each answer as it comes,
-- shows tool calls, and keeps the conversation in the agent's history.
-- `luagent chat` is the full one: line editing and history, Ctrl-C, the
-- partial answer of a retried attempt taken back, /save, /cost, ...
--
-- A terminal cannot take printed text back without moving its cursor, so
-- when an attempt that had shown text is retried (stream_reset), this one
-- says so and the answer starts again on a line of its own.
--
--   build/luagent run --mock examples/interactive.lua
--   printf 'hello\nhow are you?\n' | build/luagent run --mock \
--     --faults stream-error:overloaded_error:after=3@1 examples/interactive.lua
local luagent = require "luagent"

local agent = luagent.agent {
  model = os.getenv("LUAGENT_MODEL") or "openai/gpt-4o-mini",
  system = "You are a concise assistant.",
}

while true do
  io.write("> ")
  io.flush()
  local line = io.read("l")
  if line == nil then break end -- the end of input (Ctrl-D)
  if line:find("%S") then
    local shown = false -- text of this attempt is on the screen
    for ev in agent:prompt(line) do
      local t = ev.type
      if t == "text_delta" then
        io.write(ev.text)
        io.flush()
        shown = true
      elseif t == "provider_retry" then
        if shown then io.write("\n") end
        io.stderr:write(string.format("[%s; retrying in %.2f s]\n", ev.error_message, ev.delay))
      elseif t == "stream_reset" then
        if shown then io.write("[the answer starts again]\n") end
        shown = false
      elseif t == "tool_execution_start" then
        io.stderr:write(string.format("[tool %s %s]\n", ev.name, ev.raw_arguments or ""))
      elseif t == "agent_end" then
        io.write("\n")
        if ev.stop_reason ~= "stop" then
          io.stderr:write("[" .. ev.stop_reason .. ": " .. tostring(ev.reason or ev.error) .. "]\n")
        end
      end
    end
  end
end
