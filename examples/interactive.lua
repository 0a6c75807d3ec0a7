-- interactive.lua: the pattern for a person watching a terminal. Stream the
-- answer live; a terminal cannot take text back, so when a retry is
-- announced after some text was already shown, stop the call instead of
-- letting the retry print the answer again. An error before any text still
-- retries as usual.
--
--   build/luagent run --faults stream-error:overloaded_error@1 examples/interactive.lua
--   build/luagent run --faults 503@1 examples/interactive.lua     (retries, then answers)
local luagent = require "luagent"

local call = luagent.spawn(function()
  local shown = false -- text of the current attempt is on the screen
  for ev in luagent.stream {
    model = os.getenv("LUAGENT_MODEL") or "openai/gpt-4o-mini",
    system = "You are a concise assistant.",
    messages = { { role = "user", content = "In three sentences: why should an agent retry a failed model call with jittered backoff?" } },
    max_tokens = 200,
  } do
    if ev.type == "message_start" then
      shown = false
    elseif ev.type == "text_delta" or ev.type == "thinking_delta" then
      shown = shown or ev.text ~= ""
      io.write(ev.text)
      io.flush()
    elseif ev.type == "provider_retry" then
      if shown then
        io.write("\n")
        io.stderr:write("[stopped: " .. ev.error_message .. "; run again to retry]\n")
        -- cancelling ourselves: the backoff sleep wakes with `cancelled`
        -- and no retry request is sent
        luagent.current():cancel("partial answer already shown")
      else
        io.stderr:write(string.format("[%s; retrying in %.2f s]\n", ev.error_message, ev.delay))
      end
    elseif ev.type == "message_end" and ev.final then
      io.write("\n")
    end
  end
end)

local ok, err = pcall(call.join, call)
if not ok and not (type(err) == "table" and err.kind == "cancelled") then error(err, 0) end
