-- Help texts of the mock provider: `luagent help faults` (M.faults) and
-- `luagent mock --help` (M.mock). The fault examples are data (M.sections)
-- so a spec can check that every fault and argument has one and that each
-- example parses.
local replies = require "luagent.mock.replies"

local M = {}

-- Sections of the fault list: {title=, intro=, entries={{example, text}...}}.
-- A text line of "\n" continues under the previous one.
M.sections = {
  {
    title = "HTTP status faults",
    intro = "Any status from 400 to 599, answered at once with the provider's own\n"
      .. "error body for the endpoint (OpenAI, Anthropic or OpenRouter shape).\n"
      .. "Arguments add headers: retry-after=SECONDS, retry-after-ms=MS,\n"
      .. "retry-after-date=+SECONDS (an HTTP-date that far ahead) and\n"
      .. "x-should-retry=true|false.",
    entries = {
      { "429:retry-after=2@1-2", "rate limited, Retry-After: 2, requests 1-2" },
      { "429:retry-after-ms=1500", "rate limited, retry-after-ms: 1500" },
      { "429:retry-after-date=+5", "rate limited, Retry-After as an HTTP-date\n"
        .. "5 s ahead" },
      { "500:x-should-retry=false", "server error, x-should-retry: false" },
      { "502@1", "bad gateway on the first request" },
      { "503@1", "unavailable on the first request" },
      { "504@2", "gateway timeout on the second request" },
      { "529@p:0.5", "overloaded (Anthropic's 529), half the time" },
      { "401", "authentication failed, every request" },
      { "400:overflow@1", "context overflow: Anthropic \"prompt is too\n"
        .. "long: 210000 tokens > 200000 maximum\",\n"
        .. "OpenAI context_length_exceeded (overflow\n"
        .. "also fits 413)" },
      { "402:in-flight@1", "OpenRouter's in-flight budget refusal:\n"
        .. "error.metadata.limit_source is\nopenrouter_in_flight_budget" },
      { "402", "plain insufficient credits" },
    },
  },
  {
    title = "Connection faults",
    intro = "After the request is read.",
    entries = {
      { "close@1", "close the connection before any response" },
      { "reset:bytes=200@2", "send the headers and 200 body bytes, then\n"
        .. "reset the connection (RST); default 0" },
      { "stall:secs=30@1", "wait 30 s before the response headers" },
      { "stall:secs=30:after=200", "wait 30 s after 200 body bytes, go on" },
    },
  },
  {
    title = "Stream faults",
    intro = "They reshape the reply's events. On a stream:false request: cut sends\n"
      .. "half the body and closes, bad-json sends half the JSON, stream-error\n"
      .. "answers 200 with the error as the body.",
    entries = {
      { "stream-error:overloaded_error@1", "after the first delta, an error event in\n"
        .. "the provider's shape; no terminator" },
      { "stream-error:rate_limit_error", "the same with a rate limit error" },
      { "stream-error:no_capacity:after=0", "the error before any delta (after=N:\n"
        .. "after N deltas)" },
      { "cut@1", "end the stream after the deltas: no finish\n"
        .. "reason, no terminator" },
      { "cut:finished@1", "end it after the finish reason, before the\n"
        .. "terminator ([DONE], message_stop,\nresponse.completed)" },
      { "bad-json@1", "a truncated JSON chunk after the 1st delta" },
    },
  },
  {
    title = "Unusable replies",
    intro = "Well-formed replies whose content is no use.",
    entries = {
      { "empty@1", "a reply with empty content" },
      { "leak@1", "content that is only leaked tool-call\n"
        .. "markup: <tool_call>{\"name\":...}</tool_call>" },
    },
  },
}

-- The sections rendered as indented two-column text.
local function render_sections()
  local out = {}
  for _, s in ipairs(M.sections) do
    out[#out + 1] = s.title .. "\n"
    for line in (s.intro .. "\n"):gmatch("(.-)\n") do out[#out + 1] = "  " .. line .. "\n" end
    out[#out + 1] = "\n"
    for _, e in ipairs(s.entries) do
      local first = true
      for line in (e[2] .. "\n"):gmatch("(.-)\n") do
        local left = first and e[1] or ""
        if #left >= 34 then
          out[#out + 1] = "  " .. left .. "\n"
          left = ""
        end
        out[#out + 1] = string.format("  %-34s%s\n", left, line)
        first = false
      end
    end
    out[#out + 1] = "\n"
  end
  return table.concat(out)
end

M.faults = [[
luagent help faults: make the mock provider fail on purpose

  luagent mock --faults SPEC
  luagent run --faults SPEC script.lua

A SPEC is a list of faults separated by "," or ";". Each fault is
NAME[:ARG...][@SCOPE]; an ARG is KEY=VALUE or a bare word. Model requests
are numbered from 1. For each request the first fault whose scope matches
applies (at most one); other requests are answered normally.

Scopes
  (none)          every request
  @N              request N                        503@1
  @N-M            requests N to M                  429@1-2
  @every:K        requests K, 2K, 3K...            500@every:3
  @p:X            each request with probability X  503@p:0.3
                  (the same requests fail for the same --seed)

]] .. render_sections() .. [[
Example
  luagent mock --faults '503@1,429:retry-after=2@2,cut@3' --seed 7

An unknown fault, argument or scope is an error that names it.
]]

-- The model endpoints, one line each, as the wire formats' adapters say
-- (lua/luagent/mock/replies.lua).
local function endpoint_lines()
  local out = {}
  for _, e in ipairs(replies.endpoints()) do
    out[#out + 1] = string.format("  %-4s %-26s %s\n", e.method, e.path, e.title)
  end
  return table.concat(out)
end

M.mock = [[
usage: luagent mock [--listen HOST:PORT] [--cassette FILE] [--faults SPEC]
                    [--seed N] [--ttft SECONDS] [--tps N] [--recorded-speed]
                    [--generation-delay SECONDS]

Serves a mock model provider over HTTP on loopback:
]] .. endpoint_lines() .. [[
  GET  /api/v1/generation?id=ID   OpenRouter's generation lookup: the cost
                                  of a generation it streamed ($1 per million
                                  prompt tokens, $2 per million completion
                                  tokens), 404 until --generation-delay
  GET  /__luagent/requests        what it received (keys masked), as JSON

  --listen HOST:PORT   where to listen (default 127.0.0.1:0, a free port)
  --cassette FILE      replay a recorded run, in order; a request that
                       differs from the recording gets a 422 that says where
  --faults SPEC        inject faults (see `luagent help faults`)
  --seed N             seed for @p: fault scopes (default 0)
  --ttft SECONDS       time to first token
  --tps N              tokens per second
  --recorded-speed     replay a cassette at its recorded pace
  --generation-delay SECONDS
                       how long the generation lookup answers 404 after a
                       generation (default 0; OpenRouter's took 4.5 to 8.5
                       minutes in the book's measurement)
  --help               this text

Without a cassette it echoes the last message, or calls the first tool when
tools are offered and the last message is not a tool result; a request that
asks for structured output (response_format, text.format or
output_config.format with a JSON Schema) gets an example value of the schema
(its strings the prompt's text).

Limits: a request's headers up to 64 KiB (else 431) and its body up to
16 MiB (else 413); a connection that takes over 60 s to send its next whole
request is closed (a request begun gets a 408 first). /__luagent/requests
shows a window: the latest 1000 requests, fewer when their bodies pass
16 MiB together. Cassette header values with CR or LF are refused on load.
]]

return M
