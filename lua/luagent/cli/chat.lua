-- `luagent chat`: a REPL over one agent. The answer streams as it comes; a
-- retried attempt's partial answer is taken back on a terminal (rewound
-- when the retry is announced) and never shown when stdout is no terminal
-- (the retry-safe filter, lua/luagent/observe/retry_safe.lua); tool calls
-- are shown as they run. Lines come from core.line_reader (host/line_lua.c:
-- libedit's editing and history on a terminal, plain lines from a pipe).
-- Ctrl-C is trapped (host/loop.c, sigint_trap): it aborts the answer, or
-- drops the line being typed; SIGTERM still stops the chat.
local core = require "luagent.core"
local luagent = require "luagent"
local flags = require "luagent.cli.flags"
local json = require "luagent.base.json"
local secrets = require "luagent.base.secrets"
local errors = require "luagent.base.errors"
local provider = require "luagent.model.provider"
local tools = require "luagent.agent.tools"
local retry_safe = require "luagent.observe.retry_safe"

local M = {}

M.HELP = [[
usage: luagent chat [--model M] [--tools DIR] [--policy P] [--system TEXT]
                    [--mock] [--faults SPEC] [--history FILE | --no-history]

A chat with a model in the terminal: type a prompt, the answer streams as
it comes. The conversation is one agent's history: each prompt is a run of
the agent, tool calls included (shown as they run).

options:
  --model M          kind/model (default: the first of openai/gpt-4o-mini,
                     anthropic/claude-3-5-haiku-latest and
                     openrouter/openai/gpt-4o-mini whose key is set)
  --tools DIR        offer the tools of a tool folder (watched: edits apply
                     to the next turn)
  --policy P         the retry policy: a bundled name (patient, sdk, ...) or
                     a file (watched)
  --system TEXT      the system prompt
  --mock             answer with the embedded mock provider (also when no
                     key is set for the model, said at the start): it echoes
                     a prompt and calls a tool the prompt names
  --faults SPEC      make the mock fail on purpose ('luagent help faults');
                     implies --mock
  --history FILE     where the line history is kept (default
                     $LUAGENT_HOME/chat_history, else ~/.luagent_history)
  --no-history       keep no history file
  -h, --help         show this help

commands (a line that starts with /):
  /reset             forget the conversation
  /save FILE         write the conversation (model, system, messages) as JSON
  /load FILE         read a conversation /save wrote
  /cost              the cost table of the calls so far
  /trace             the span tree of the last answer (calls, attempts, tools)
  /tools             the tools offered, with their flags
  /model M           go on with another model (the history stays)
  /help              this list
  /exit, /quit       leave (so does Ctrl-D on an empty line)

Keys: the line is edited with libedit (emacs keys, the history with the
arrows, ~/.editrc). Ctrl-C during an answer stops it (what was said stays
in the history, marked incomplete) and gives the prompt back; at the
prompt it drops the line typed; twice in a row on an empty line it leaves.
When a call is retried after part of its answer was shown, the part is
taken back and the answer starts again.

From a pipe (stdin not a terminal) it reads one prompt per line, answers
each, and exits 0 at the end of input; when stdout is not a terminal, an
answer is written once it is whole (a retried attempt never shows) and the
notes (tool calls, retries) go to stderr.

Exit codes: 0 done; 1 the chat could not start (a tool folder or policy
that does not load); 2 usage error; 143 terminated (SIGTERM).
]]

local FLAGS = { model = true, tools = true, policy = true, system = true, mock = false, faults = true,
  history = true, ["no-history"] = false }

-- The model when none is given: the first whose key is set; else OpenAI's
-- (answered by the mock).
local DEFAULTS = {
  { kind = "openai", model = "openai/gpt-4o-mini" },
  { kind = "anthropic", model = "anthropic/claude-3-5-haiku-latest" },
  { kind = "openrouter", model = "openrouter/openai/gpt-4o-mini" },
}

local function key_of(kind)
  local info = provider.kinds[kind]
  local var = info and info.key_env
  local v = var and os.getenv(var)
  return var, v ~= nil and v ~= ""
end

local function default_model()
  for _, d in ipairs(DEFAULTS) do
    local _, set = key_of(d.kind)
    if set then return d.model end
  end
  return DEFAULTS[1].model
end

------------------------------------------------------------------------------
-- Showing an answer
------------------------------------------------------------------------------

-- How many rows up the start of `shown` is from the cursor, on a terminal
-- `cols` wide (a line exactly `cols` wide leaves the cursor on its row).
local function rows_up(shown, cols)
  local up, first = 0, true
  for seg in (shown .. "\n"):gmatch("(.-)\n") do
    if not first then up = up + 1 end
    first = false
    local w = core.text_width(seg)
    if w > 0 then up = up + (w - 1) // cols end
  end
  return up
end

-- A view writes an answer and the notes about it. `live`: stdout is a
-- terminal (text as it comes, a retried attempt's rewound); else whole
-- answers on stdout, notes on stderr.
local function new_view(live)
  local v = { shown = "", col0 = true }
  local notes = live and io.stdout or io.stderr

  function v.text(t)
    t = core.terminal_text(t:gsub("\t", "    "), true)
    io.stdout:write(t)
    io.stdout:flush()
    v.shown = v.shown .. t
    v.col0 = t:sub(-1) == "\n"
  end

  -- the answer so far ends its line (before a note, at the end)
  function v.end_line()
    if v.shown ~= "" and not v.col0 then io.stdout:write("\n") end
    v.col0 = true
    io.stdout:flush()
  end

  function v.note(text)
    v.end_line()
    v.shown = "" -- what came before the note stays
    notes:write(core.terminal_text(secrets.text(text), true), "\n")
    notes:flush()
  end

  -- takes back the partial answer of a failed attempt (a terminal only:
  -- the cursor goes up to where it started, the rest of the screen clears)
  function v.rewind()
    if not live or v.shown == "" then
      v.shown = ""
      return
    end
    local cols = core.terminal_size(1) or 80
    local up = rows_up(v.shown, cols)
    io.stdout:write("\r", up > 0 and ("\27[" .. up .. "A") or "", "\27[J")
    io.stdout:flush()
    v.shown, v.col0 = "", true
  end

  return v
end

-- A tool call's duration as the tree writes it ("1.3ms").
local function duration(d)
  if type(d) ~= "number" then return "?" end
  return core.duration_text(d)
end

-- A tool call's arguments, short, on one line.
local function short(text, max)
  text = tostring(text or ""):gsub("%s+", " ")
  if #text > max then text = text:sub(1, max - 3) .. "..." end
  return text
end

------------------------------------------------------------------------------
-- The chat
------------------------------------------------------------------------------

local Chat = {}
Chat.__index = Chat

function Chat:make_agent(model)
  self.agent = self.rt:agent { name = "chat", model = model, system = self.system, tools = self.set,
    policy = self.policy, messages = self.agent and self.agent.messages or {} }
  self.model = model
end

-- One prompt: the agent's run, shown as it goes. Returns the agent_end.
-- While tool calls wait for approval (the last run stopped with
-- approval_required), the line is the decision: y or yes approves them,
-- anything else denies them with the line as the reason; the run goes on.
function Chat:answer(text)
  local view = new_view(self.live_out)
  self.answering = true
  local iter, _, _, closer
  local waiting = self.agent:pending_approvals()
  if #waiting > 0 then
    local word = text:lower():match("^%s*(.-)%s*$")
    local yes = word == "y" or word == "yes"
    for _, w in ipairs(waiting) do
      if yes then self.agent:approve(w.call_id) else self.agent:deny(w.call_id, text) end
    end
    iter, _, _, closer = self.agent:continue()
  else
    iter, _, _, closer = self.agent:prompt(text)
  end
  local events = iter
  if not self.live_out then events = retry_safe.retry_safe(iter, self.rt.diag) end
  local last
  local ok, err = pcall(function()
    local _ <close> = closer
    for ev in events do
      local t = ev.type
      if t == "text_delta" then
        view.text(ev.text)
      elseif t == "provider_retry" then
        view.rewind()
        view.note(string.format("  [attempt %d of %d failed: %s; retrying in %.2f s]", ev.attempt,
          ev.max_attempts, short(ev.error_message, 120), ev.delay))
      elseif t == "stream_reset" then
        view.rewind()
      elseif t == "approval_requested" then
        view.note(string.format("  [approve?] %s %s", ev.name, short(ev.raw_arguments or "", 100)))
      elseif t == "tool_execution_start" then
        view.note(string.format("  [tool] %s %s", ev.name, short(ev.raw_arguments or "", 100)))
      elseif t == "tool_execution_end" then
        local what = ev.error and ("failed: " .. short(tostring(ev.error.message or ev.error), 100))
          or ("-> " .. short(ev.result, 100))
        view.note(string.format("  [tool] %s %s (%s)", ev.name, what, duration(ev.duration)))
      elseif t == "agent_end" then
        last = ev
      end
    end
  end)
  self.answering = false
  view.end_line()
  if not ok then error(err, 0) end
  if last and last.stop_reason == "aborted" then
    view.note("  [interrupted]")
  elseif last and last.stop_reason == "approval_required" then
    view.note("  [" .. short(last.reason or "waiting for approval", 300) .. ": y approves, any other line "
      .. "denies with it as the reason]")
  elseif last and last.stop_reason ~= "stop" then
    local why = last.error and tostring(last.error.message or last.error) or last.reason or last.stop_reason
    view.note("  [" .. last.stop_reason .. ": " .. short(why, 300) .. "]")
  end
  return last
end

-- The commands, each given the rest of its line; says on stderr, prints on stdout.
local COMMANDS = {}

function COMMANDS.reset(self)
  local h = self.agent.messages
  for i = #h, 1, -1 do h[i] = nil end
  self.say("chat: the conversation is forgotten")
end

function COMMANDS.save(self, file)
  if file == "" then return self.say("chat: /save needs a file name") end
  local text = json.encode(json.object("model", self.model, "system", self.system or json.null,
    "messages", json.array(self.agent.messages)))
  local fh, err = io.open(file, "w")
  if not fh then return self.say("chat: /save: cannot open '%s': %s", file, (err:gsub("^[^:]*: ", ""))) end
  local ok, werr = fh:write(text, "\n")
  fh:close()
  if not ok then return self.say("chat: /save: cannot write '%s': %s", file, werr) end
  self.say("chat: saved %d message(s) to %s", #self.agent.messages, file)
end

function COMMANDS.load(self, file)
  if file == "" then return self.say("chat: /load needs a file name") end
  local fh, err = io.open(file, "r")
  if not fh then return self.say("chat: /load: cannot open '%s': %s", file, (err:gsub("^[^:]*: ", ""))) end
  local text = fh:read("a")
  fh:close()
  local ok, t = pcall(json.decode, text)
  if not ok or type(t) ~= "table" or type(t.messages) ~= "table" then
    return self.say("chat: /load: '%s' is not a conversation /save wrote (JSON with messages)", file)
  end
  for i, m in ipairs(t.messages) do
    if type(m) ~= "table" or type(m.role) ~= "string" then
      return self.say("chat: /load: '%s': message %d has no role", file, i)
    end
  end
  local h = self.agent.messages
  for i = #h, 1, -1 do h[i] = nil end
  for i, m in ipairs(t.messages) do h[i] = m end
  self.say("chat: loaded %d message(s) from %s", #h, file)
end

function COMMANDS.cost(self)
  io.stdout:write(table.concat(self.meter:report(), "\n"), "\n")
end

function COMMANDS.trace(self)
  local text = self.tracer and self.tracer:tree_text() or ""
  local last = text:sub((self.trace_mark or 0) + 1)
  if last == "" then last = text end
  if last == "" then return self.say("chat: no answer traced yet") end
  io.stdout:write(last)
end

function COMMANDS.tools(self)
  if not self.set then return self.say("chat: no tools (give a folder with --tools DIR)") end
  local snap = self.set:snapshot()
  if #snap.names == 0 then return self.say("chat: the tool folder has no tools yet") end
  for _, name in ipairs(snap.names) do
    local t = snap.tools[name]
    local f = t.read_only and "read_only" or t.idempotent and "idempotent" or "no safety flag"
    io.stdout:write(string.format("  %-20s %-15s %s\n", name, f, short(t.description, 60)))
  end
end

function COMMANDS.model(self, m)
  if m == "" then return self.say("chat: the model is %s; /model kind/model changes it", self.model) end
  local ok, err = pcall(provider.new, self.rt, m)
  if not ok then return self.say("chat: /model: %s", tostring(err):gsub("^[^:]*:%d+: ", "")) end
  self:make_agent(m)
  self.say("chat: the model is now %s", m)
end

function COMMANDS.help(self)
  io.stdout:write(M.HELP:match("commands %(.-\n\n"))
end

-- The REPL: one line at a time until the end of input or /exit.
function Chat:repl()
  local reader = self.reader
  local hinted = false -- Ctrl-C at an empty prompt: once a hint, twice leave
  while true do
    if not reader.edit and self.prompt_out then
      self.prompt_out:write("> ")
      self.prompt_out:flush()
    end
    local line, why, typed = reader:read("> ")
    if line == nil and why == "interrupted" then
      if not reader.edit then
        self.code = 130 -- Ctrl-C while a pipe is read: nothing to drop, so leave
        return
      elseif typed ~= "" then
        hinted = false
        io.stdout:write("^C\n")
      elseif hinted then
        io.stdout:write("^C\n")
        return
      else
        hinted = true
        io.stdout:write("^C\n")
        self.say("chat: Ctrl-D or /exit leaves (or Ctrl-C again)")
      end
    elseif line == nil then
      return
    else
      hinted = false
      line = line:gsub("^%s+", ""):gsub("%s+$", "")
      if line ~= "" then
        reader:add_history(line)
        local cmd, rest = line:match("^/(%S+)%s*(.*)$")
        if cmd then
          if cmd == "exit" or cmd == "quit" then return end
          local fn = COMMANDS[cmd]
          if fn then fn(self, rest) else self.say("chat: unknown command '/%s' (/help lists them)", cmd) end
        else
          self.trace_mark = self.tracer and #self.tracer:tree_text() or 0
          self:answer(line)
        end
      end
    end
  end
end

------------------------------------------------------------------------------
-- Starting
------------------------------------------------------------------------------

-- main(args, env) -> exit code. env: say, usage_error, start_mock (the
-- command line's: only it reaches the bench), root (where the executable's
-- bundled policies are), home (the user's home folder, for the history).
function M.main(args, env)
  local say, usage_error = env.say, env.usage_error
  local opts, i = flags.parse(args, FLAGS, "chat")
  if not opts then return usage_error("%s", i) end
  if opts.help then
    io.write(M.HELP)
    return 0
  end
  if args[i] then return usage_error("chat: unexpected argument '%s' (a prompt is typed, or piped in)", args[i]) end
  local model = opts.model or default_model()
  local kind = model:match("^([%w_]+)/.")
  if not kind or not provider.kinds[kind] then
    return usage_error("chat: --model wants kind/model with a known kind (openai, anthropic, openrouter, "
      .. "openai_responses), not '%s'", model)
  end
  local settings = { policy_path = env.root and ("policies/?.lua;" .. env.root .. "/policies/?.lua") or nil }
  local okrt, rt = pcall(luagent.runtime, settings)
  if not okrt then return usage_error("%s", tostring(rt)) end
  luagent.default_runtime(rt)
  -- what the chat says (stderr) comes after what it printed (stdout) so far
  local function tell(...)
    io.stdout:flush()
    say(...)
  end
  local chat = setmetatable({ rt = rt, system = opts.system, say = tell }, Chat)
  local cleanups = {}
  local function finish(code)
    for k = #cleanups, 1, -1 do pcall(cleanups[k]) end
    pcall(rt.close, rt)
    return code
  end
  if opts.policy then
    local ok, err = pcall(rt.policies.resolve, rt.policies, opts.policy, 1, "chat")
    if not ok then
      say("luagent: chat: --policy: %s", (tostring(type(err) == "table" and err.message or err):gsub("^chat: ", "")))
      return finish(errors.is(err, "usage") and 2 or 1)
    end
    chat.policy = opts.policy
  end
  if opts.tools then
    local set, err = tools.dir(opts.tools)
    if not set then
      say("luagent: chat: --tools: %s", err.message)
      return finish(2)
    end
    chat.set = set
    cleanups[#cleanups + 1] = function() set:close() end
  end
  local var, has_key = key_of(kind)
  if opts.mock or opts.faults or not has_key then
    -- paced as a model streams when someone watches; at once into a pipe
    local watched = core.isatty(1)
    local srv, err = env.start_mock { faults = opts.faults, seed = 0, chat = true,
      ttft = watched and 0.2 or nil, tps = watched and 25 or nil }
    if not srv then
      if err and err.kind == "usage" then return finish(usage_error("chat: %s", err.message)) end
      say("luagent: chat: %s", tostring(err))
      return finish(1)
    end
    cleanups[#cleanups + 1] = function() srv:close() end
    rt.settings:set { providers = { base_urls = srv.base_urls, api_key = "mock-key" } }
    say("luagent: chat: %s: using the embedded mock provider at %s%s", has_key and "as asked"
      or ("no " .. var .. " set"), srv.url, opts.faults and (" (faults " .. opts.faults .. ")") or "")
  end
  chat.meter = rt:meter("cost")
  chat.tracer = rt:trace { tree = true, render_batch = 1 }
  local okagent, aerr = pcall(chat.make_agent, chat, model)
  if not okagent then
    say("luagent: chat: %s", tostring(aerr))
    return finish(2)
  end
  local history = not opts["no-history"] and (opts.history or env.history_file) or nil
  local tty_in, tty_out = core.isatty(0), core.isatty(1)
  chat.live_out = tty_out
  local okr, reader = pcall(core.line_reader, { edit = tty_in and tty_out, history = history, name = "luagent" })
  if not okr then
    say("luagent: chat: %s", tostring(reader))
    return finish(1)
  end
  cleanups[#cleanups + 1] = function() reader:close() end
  chat.reader = reader
  chat.prompt_out = tty_in and not reader.edit and io.stderr or nil
  if reader.edit then
    say("luagent: chat with %s; /help lists the commands, Ctrl-D leaves", model)
  end
  -- Ctrl-C: stops the answer, or drops the line being typed
  core.sigint_trap(true)
  local watcher = core.spawn(function()
    while true do
      core.sigint_wait()
      if chat.answering then chat.agent:abort("interrupted (Ctrl-C)") else reader:interrupt() end
    end
  end)
  watcher:set_daemon(true)
  local code = 0
  local main = core.spawn(function()
    local ok, err = pcall(chat.repl, chat)
    if not ok then
      if errors.is_cancel(err) then
        local stopped, sig = core.interrupted()
        code = stopped and 128 + (sig or 15) or 130
      else
        say("luagent: chat: %s", tostring(err))
        code = 1
      end
    end
    watcher:cancel("the chat ends")
    if chat.code then code = chat.code end
  end)
  core.on_sigint(main) -- SIGTERM stops the chat (SIGINT is trapped)
  core.run()
  core.sigint_trap(false)
  return finish(code)
end

return M
