-- `luagent chat`: the REPL, from a pipe (one prompt per line) and in a
-- real terminal (tmux: send-keys, capture-pane), against the embedded mock
-- provider, with a stream reset injected. The terminal specs poll the
-- screen until what they wait for shows or a generous deadline passes (the
-- machine is shared): a poll's short sleep is never the assertion.
local h = require "helpers"
local core = require "luagent.core"
local json = require "luagent.base.json"

local KEYS = { "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "OPENAI_BASE_URL",
  "ANTHROPIC_BASE_URL", "OPENROUTER_BASE_URL" }

-- A tool folder with one read-only Lua tool the mock can call.
local function tool_dir()
  local dir = h.tempdir()
  local f = assert(io.open(dir .. "/weather.lua", "w"))
  f:write([[
return {
  name = "weather",
  description = "The weather in a city.",
  params = { type = "object", properties = { city = { type = "string" } }, required = { "city" } },
  read_only = true,
  run = function(args) return "sunny and 21 C in " .. args.city end,
}
]])
  f:close()
  return dir
end

-- Runs `luagent chat ARGS...` with `input` on its stdin (a pipe), no key set.
local function chat_pipe(input, ...)
  local inp = h.tempfile(input)
  local out, err = os.tmpname(), os.tmpname()
  local words = { "timeout -s KILL 120 env" }
  for _, k in ipairs(KEYS) do words[#words + 1] = "-u " .. k end
  words[#words + 1] = "LUAGENT_HOME=" .. h.quote(h.tempdir())
  words[#words + 1] = h.quote(h.bin) .. " chat"
  for _, a in ipairs({ ... }) do words[#words + 1] = h.quote(a) end
  local _, _, code = os.execute(table.concat(words, " ") .. " <" .. inp .. " >" .. out .. " 2>" .. err)
  local r = { code = code, stdout = h.slurp(out), stderr = h.slurp(err) }
  os.remove(inp) os.remove(out) os.remove(err)
  return r
end

local function count(text, plain)
  local n, from = 0, 1
  while true do
    local s, e = text:find(plain, from, true)
    if not s then return n end
    n, from = n + 1, e + 1
  end
end

describe("luagent chat (from a pipe)", function()
  it("asks for a tool's approval: y runs it, another line denies it with that reason", function()
    local dir = h.tempdir()
    local f = assert(io.open(dir .. "/pay.lua", "w"))
    f:write([[
return {
  name = "pay", description = "Pays.", needs_approval = true,
  params = { type = "object", properties = { text = { type = "string" } }, required = { "text" } },
  run = function(args) return "paid for " .. args.text end,
}
]])
    f:close()
    local r = chat_pipe("pay the rent\ny\npay the yacht\nnot this one\n", "--mock", "--tools", dir)
    assert.equal(0, r.code, r.stderr)
    assert.matches("%[approve%?%] pay", r.stdout .. r.stderr)
    assert.matches("y approves, any other line denies", r.stdout .. r.stderr)
    assert.equal(1, count(r.stdout .. r.stderr, "-> paid for rent"))
    assert.equal(0, count(r.stdout .. r.stderr, "paid for yacht"))
    assert.matches("denied: not this one", r.stdout .. r.stderr)
    os.execute("rm -rf " .. h.quote(dir))
  end)

  it("approves on exactly y or yes (any case): YES runs the tool, ys denies it", function()
    local dir = h.tempdir()
    local f = assert(io.open(dir .. "/pay.lua", "w"))
    f:write([[
return {
  name = "pay", description = "Pays.", needs_approval = true,
  params = { type = "object", properties = { text = { type = "string" } }, required = { "text" } },
  run = function(args) return "paid for " .. args.text end,
}
]])
    f:close()
    local r = chat_pipe("pay the rent\n YES \npay the yacht\nys\npay the boat\nyse\n", "--mock", "--tools", dir)
    assert.equal(0, r.code, r.stderr)
    local all = r.stdout .. r.stderr
    assert.equal(1, count(all, "-> paid for rent"))
    assert.equal(0, count(all, "paid for yacht"))
    assert.equal(0, count(all, "paid for boat"))
    assert.matches("denied: ys", all)
    assert.matches("denied: yse", all)
    os.execute("rm -rf " .. h.quote(dir))
  end)

  it("answers one prompt per line on the mock and exits 0 at the end of input", function()
    local r = chat_pipe("hello there\nsecond question\n", "--mock")
    assert.equal(0, r.code, r.stderr)
    assert.matches("hello there", r.stdout)
    assert.matches("second question", r.stdout)
    assert.matches("embedded mock provider", r.stderr)
  end)

  it("uses the mock by itself when no key is set, saying so", function()
    local r = chat_pipe("hi\n")
    assert.equal(0, r.code, r.stderr)
    assert.matches("no OPENAI_API_KEY set", r.stderr)
    assert.matches("hi", r.stdout)
  end)

  it("shows a retried answer once when stdout is not a terminal", function()
    -- the first attempt streams five words, then fails: they never show
    local r = chat_pipe("tell me about retries\n", "--faults", "stream-error:overloaded_error:after=5@1")
    assert.equal(0, r.code, r.stderr)
    assert.equal(1, count(r.stdout, "You said"), r.stdout)
    assert.matches("You said: \"tell me about retries\"", r.stdout)
    assert.matches("retrying", r.stderr)
  end)

  it("shows a tool call as it runs, and its answer", function()
    local r = chat_pipe("what is the weather in Paris\n", "--mock", "--tools", tool_dir())
    assert.equal(0, r.code, r.stderr)
    assert.matches("weather", r.stderr)
    assert.matches("sunny and 21 C in", r.stdout)
  end)

  it("keeps commands: /save and /load a conversation, /tools, /cost, /model, /reset", function()
    local file = os.tmpname()
    local r = chat_pipe("first prompt\n/save " .. file .. "\n/tools\n/cost\n/model openai/gpt-4o\n/reset\n"
      .. "/load " .. file .. "\n/nope\n", "--mock", "--tools", tool_dir())
    assert.equal(0, r.code, r.stderr)
    local saved = json.decode(h.slurp(file))
    os.remove(file)
    assert.equal("user", saved.messages[1].role)
    assert.equal("first prompt", saved.messages[1].content)
    assert.matches("weather", r.stdout)             -- /tools lists it, with its flags
    assert.matches("read_only", r.stdout)
    assert.matches("gpt%-4o%-mini", r.stdout)       -- /cost: the table
    assert.matches("openai/gpt%-4o", r.stderr)      -- /model
    assert.matches("loaded 2 message", r.stderr)    -- /load
    assert.matches("unknown command '/nope'", r.stderr)
  end)

  it("explains itself with --help; an unknown option is an error (exit 2)", function()
    local r = h.run("chat", "--help")
    assert.equal(0, r.code)
    assert.matches("usage: luagent chat", r.stdout)
    for _, word in ipairs({ "%-%-model", "%-%-tools", "%-%-policy", "%-%-system", "%-%-mock", "/save", "/cost",
      "Ctrl%-C" }) do
      assert.matches(word, r.stdout)
    end
    r = h.run("chat", "--frob")
    assert.equal(2, r.code)
    assert.matches("chat: unknown flag '%-%-frob'", r.stderr)
    r = h.run("chat", "extra")
    assert.equal(2, r.code)
    assert.matches("chat: unexpected argument 'extra'", r.stderr)
  end)
end)

describe("the mock's chat replies (lua/luagent/mock/chat.lua)", function()
  local chat = require "luagent.mock.chat"
  local weather = { name = "weather", schema = { type = "object", properties = { city = { type = "string" } },
    required = { "city" } } }

  it("calls a tool the prompt names, its text argument from the words after the name", function()
    local c = chat.script({ tools = { weather }, user_text = "What is the weather in Paris?" }, 3)
    assert.same({ id = "call_3", name = "weather", arguments = { city = "Paris" } }, c.tool)
    c = chat.script({ tools = { { name = "issue_search", schema = { type = "object",
      properties = { q = { type = "string" } } } } }, user_text = "run an issue search for leaks" }, 1)
    assert.same({ q = "leaks" }, c.tool.arguments)
  end)

  it("quotes a tool's result, and echoes anything else with a word on tools", function()
    assert.same({ text = "The tool answered: sunny" },
      chat.script({ tools = { weather }, last_is_tool_result = true, last_text = "sunny" }, 2))
    local c = chat.script({ tools = { weather }, user_text = "hello" }, 1)
    assert.matches('^You said: "hello"', c.text)
    assert.matches("%(weather%)", c.text)
    assert.matches("%-%-tools DIR", chat.script({ tools = {}, user_text = "hello" }, 1).text)
  end)
end)

describe("examples/interactive.lua", function()
  it("is a small REPL of its own: one prompt per line, each answered, to the end of input", function()
    local inp = h.tempfile("first line\nsecond line\n")
    local out, err = os.tmpname(), os.tmpname()
    local _, _, code = os.execute("timeout -s KILL 60 " .. h.quote(h.bin) .. " run --mock --faults "
      .. "stream-error:overloaded_error:after=1@1 examples/interactive.lua <" .. inp .. " >" .. out .. " 2>" .. err)
    local stdout, stderr = h.slurp(out), h.slurp(err)
    os.remove(inp) os.remove(out) os.remove(err)
    assert.equal(0, code, stderr)
    assert.matches("first line\n", stdout)
    assert.matches("second line\n", stdout)
    assert.matches("%[the answer starts again%]", stdout)
    assert.matches("retrying in", stderr)
  end)
end)

------------------------------------------------------------------------------
-- In a terminal
------------------------------------------------------------------------------

local have_tmux = os.execute("command -v tmux >/dev/null 2>&1")

-- A private tmux server (its own socket) running one chat in a 100x40 pane.
local Term = {}
Term.__index = Term

local function tmux(sock, args)
  local p = io.popen("tmux -L " .. sock .. " " .. args .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

local function open_term(args)
  local sock = "lgchat" .. math.random(1, 1e9)
  local words = { "env" }
  for _, k in ipairs(KEYS) do words[#words + 1] = "-u " .. k end
  words[#words + 1] = "LUAGENT_HOME=" .. h.quote(h.tempdir()) .. " TERM=xterm-256color"
  words[#words + 1] = h.quote(h.bin) .. " chat " .. args
  -- the pane stays after the chat exits, so its last screen can be read
  local cmd = table.concat(words, " ") .. "; echo CHAT-EXITED $?; sleep 600"
  local out, ok = tmux(sock, "new-session -d -s chat -x 100 -y 40 " .. h.quote(cmd))
  assert(ok, out)
  return setmetatable({ sock = sock }, Term)
end

function Term:screen()
  return (tmux(self.sock, "capture-pane -p -J -t chat"))
end

function Term:keys(...)
  local words = {}
  for _, k in ipairs({ ... }) do words[#words + 1] = h.quote(k) end
  assert(tmux(self.sock, "send-keys -t chat " .. table.concat(words, " ")))
end

-- Polls the screen until pred(screen) holds; fails with the last screen
-- after `secs` (generous: the machine is loaded).
function Term:wait(pred, what, secs)
  local deadline = core.now() + (secs or 60)
  local screen
  repeat
    screen = self:screen()
    if pred(screen) then return screen end
    core.sleep(0.1)
  until core.now() > deadline
  error("waited for " .. what .. "; the screen:\n" .. screen, 2)
end

function Term:close() tmux(self.sock, "kill-server") end

local function prompts(screen) return count(screen, "> ") end

local describe_term = have_tmux and describe or function(name, fn)
  describe(name, function()
    pending("tmux is not installed (make test installs it; apt-get install tmux)")
  end)
end

describe_term("luagent chat (in a terminal, tmux)", function()
  local term
  after_each(function() if term then term:close() term = nil end end)

  it("shows an answer once across a stream reset, then a tool call, then /cost", function()
    -- the first attempt streams five words, then fails: the retry takes them back
    term = open_term("--faults stream-error:overloaded_error:after=5@1 --tools " .. h.quote(tool_dir()))
    term:wait(function(s) return s:find("> ", 1, true) end, "the first prompt")
    term:keys("-l", "good morning to you")
    term:keys("Enter")
    local s = term:wait(function(s) return prompts(s) >= 2 end, "the answer, then the next prompt")
    assert.matches("retrying", s)
    -- the partial answer of the first attempt was taken back: the answer shows once
    assert.equal(1, count(s, "You said"), s)
    assert.matches('You said: "good morning to you"', s)
    term:keys("-l", "what is the weather in Paris")
    term:keys("Enter")
    s = term:wait(function(s) return prompts(s) >= 3 end, "the tool call, its answer, the next prompt")
    assert.matches("weather", s)
    assert.matches("sunny and 21 C in", s)
    term:keys("-l", "/cost")
    term:keys("Enter")
    s = term:wait(function(s) return s:find("gpt-4o-mini", 1, true) and prompts(s) >= 4 end, "the cost table")
    local answer = s:find("sunny and 21 C in", 1, true)
    local tool = s:find("weather", s:find("what is the weather in Paris", 1, true) + 30, true)
    local cost = s:find("gpt-4o-mini", answer, true)
    assert.truthy(tool and answer and cost and tool < answer and answer < cost, s)
    term:keys("C-d")
    term:wait(function(s) return s:find("CHAT-EXITED 0", 1, true) end, "the chat to exit 0 on Ctrl-D")
  end)

  it("takes back a partial answer that wrapped over several rows, and nothing above it", function()
    term = open_term("--faults stream-error:overloaded_error:after=45@1")
    term:wait(function(s) return s:find("> ", 1, true) end, "the first prompt")
    local words = {}
    for i = 1, 60 do words[i] = "alpha" .. i end
    term:keys("-l", table.concat(words, " "))
    term:keys("Enter")
    local s = term:wait(function(s) return prompts(s) >= 2 end, "the answer, then the next prompt")
    assert.matches("retrying", s)
    assert.equal(1, count(s, "You said"), s)
    -- once in the prompt typed, once in the answer: none left of the partial, the prompt kept
    assert.equal(2, count(s, "alpha40 "), s)
    assert.equal(2, count(s, "alpha1 "), s)
  end)

  it("stops an answer on Ctrl-C and returns to the prompt; Ctrl-C at an empty prompt does not quit", function()
    term = open_term("--mock")
    term:wait(function(s) return s:find("> ", 1, true) end, "the first prompt")
    local words = {}
    for i = 1, 150 do words[i] = "word" .. i end
    words[#words + 1] = "THE-END"
    term:keys("-l", table.concat(words, " "))
    term:keys("Enter")
    term:wait(function(s) return s:find("You said", 1, true) end, "the answer to start")
    term:keys("C-c")
    local s = term:wait(function(s) return s:find("interrupted", 1, true) and prompts(s) >= 2 end,
      "the answer to stop and the prompt to come back")
    assert.equal(1, count(s, "THE-END"), s) -- typed once, never answered in full
    term:keys("C-c")
    s = term:wait(function(s) return s:find("Ctrl-D", 1, true) end, "the hint at an empty prompt")
    assert.is_nil(s:find("CHAT-EXITED", 1, true))
    term:keys("-l", "still here")
    term:keys("Enter")
    term:wait(function(s) return count(s, "still here") >= 2 end, "an answer after the interrupt")
    term:keys("-l", "/exit")
    term:keys("Enter")
    term:wait(function(s) return s:find("CHAT-EXITED 0", 1, true) end, "the chat to exit 0 on /exit")
  end)
end)
