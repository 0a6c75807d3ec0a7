-- hello.lua: one streamed model call, printed as it arrives.
--
--   build/luagent run examples/hello.lua              (no key: the embedded mock
--                                                      replays hello.cassette.jsonl)
--   build/luagent run --faults 503@1 examples/hello.lua   (see a retry)
--   OPENAI_API_KEY=... build/luagent run examples/hello.lua   (a live call)
--
-- Retries are visible: a failed attempt's partial text is followed by a
-- reset marker, and each retry is announced with its wait.
local luagent = require "luagent"

local model = os.getenv("LUAGENT_MODEL") or "openai/gpt-4o-mini"
local stream = luagent.stream {
  model = model,
  system = "You are a concise assistant.",
  messages = { { role = "user", content = "In three sentences: why should an agent retry a failed model call with jittered backoff?" } },
  max_tokens = 200,
}
-- For pipes and logs, `luagent run --retry-safe` filters this stream by
-- itself: only attempts that succeeded arrive (no reset marker to print).

io.stderr:write(string.format("luagent: asking %s\n", model))
local midline = false -- the answer so far ends without a newline
local partial = false -- this attempt has printed text (a retry starts it over)
for ev in stream do
  if ev.type == "text_delta" then
    io.write(ev.text)
    io.flush()
    midline, partial = ev.text:sub(-1) ~= "\n", true
  elseif ev.type == "provider_retry" then
    io.stderr:write(string.format("%s[attempt %d of %d failed: %s; retrying in %.2f s]\n",
      midline and "\n" or "", ev.attempt, ev.max_attempts, ev.error_message, ev.delay))
  elseif ev.type == "stream_reset" then
    if partial then io.write(midline and "\n" or "", "[the retry starts the answer over]\n") end
    midline, partial = false, false
  elseif ev.type == "message_end" and ev.final then
    io.write("\n")
    io.flush()
    local u = ev.total_usage or {}
    if ev.stop_reason == "error" then
      io.stderr:write(string.format("[failed after %d attempt(s): %s]\n", ev.attempts or 0, tostring(ev.error)))
      os.exit(1)
    end
    io.stderr:write(string.format("[%s after %d attempt(s); tokens in %d, out %d]\n",
      ev.stop_reason, ev.attempts or 0, u.input_tokens or 0, u.output_tokens or 0))
  end
end
