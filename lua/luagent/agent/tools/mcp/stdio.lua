-- The stdio transport of MCP: the server is a child process (its own
-- process group) speaking newline-delimited JSON-RPC on stdin/stdout; what
-- it writes to stderr is kept (its latest bytes) to explain its failures.
-- A line longer than max_message ends the connection with a clear error;
-- so does a server that leaves more than max_message bytes of what luagent
-- wrote unread (one that floods requests and never reads its stdin would
-- make the replies queue without bound). The server gets the reduced
-- environment of every child, as the MCP SDKs give theirs
-- (lua/luagent/base/child_env.lua), plus the set's `env`.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local child_env = require "luagent.base.child_env"
local deadline = require "luagent.base.deadline"

local M = {}

local Stdio = {}
Stdio.__index = Stdio

-- new{command={argv...}, env=, cwd=, max_message=, name=} -> transport.
function M.new(opts)
  return setmetatable({ command = opts.command, env = opts.env, cwd = opts.cwd,
    max_message = opts.max_message, name = opts.name }, Stdio)
end

-- start() -> true | nil, err: spawns the server.
function Stdio:start()
  self.overflow = nil
  local proc, err = core.process_spawn(self.command, { stream = true, cwd = self.cwd,
    env = child_env.build(self.env), inherit_env = false, max_output = self.max_message, grace = 1 })
  if not proc then return nil, err end
  self.proc = proc
  return true
end

-- send(text) -> true | nil, err: one message, as one line.
function Stdio:send(text)
  if self.overflow then return nil, self.overflow end
  if not self.proc then return nil, errors.new("eof", self.name .. " is not running") end
  local waiting = self.proc:queued()
  if waiting > self.max_message then -- it does not read: stop it, run() reports why
    self.overflow = errors.new("protocol", string.format(
      "%s does not read its stdin: more than %d bytes wait for it (max_message); the connection is dropped",
      self.name, self.max_message), { queued = waiting })
    self.proc:kill(0)
    return nil, self.overflow
  end
  return self.proc:write(text .. "\n")
end

-- The tail of the server's stderr, one line, for messages ("" if none).
function Stdio:stderr_tail()
  if not self.proc then return self.last_stderr or "" end
  local ok, s = pcall(self.proc.stderr, self.proc)
  s = ok and s or ""
  return (s:gsub("%s+$", ""):sub(-300):gsub("\n", " | "))
end

-- run(deliver) -> err: hands every line of stdout to deliver(line) until
-- the server ends, deliver refuses a line, or a line is too long; returns
-- why the connection ended (a record).
function Stdio:run(deliver)
  local proc = self.proc
  while true do
    if self.overflow then return self.overflow end -- stopped for not reading (send)
    local line, err = proc:read_line()
    if not line then
      if err then
        err.message = string.format("%s wrote a message longer than %d bytes (max_message); the connection is dropped",
          self.name, self.max_message)
        return err
      end
      break
    end
    local ok, derr = deliver(line)
    if not ok then return derr end
  end
  -- stdout ended: the server exits (or closed it): say how, stopping it
  -- if it is still there a second later
  local ok, r = pcall(deadline, 1, proc.wait, proc)
  local how
  if ok then
    how = r.signal and ("was killed by signal " .. r.signal) or ("exited with code " .. tostring(r.code))
  else
    if errors.is_cancel(r) then error(r, 0) end
    pcall(proc.wait, proc) -- stopped by the deadline: wait for its group to go
    how = "closed its stdout"
  end
  local tail = self:stderr_tail()
  return errors.new("eof", string.format("%s %s%s", self.name, how, tail ~= "" and (" (stderr: " .. tail .. ")") or ""),
    { died = true, exit_code = ok and r.code or nil, signal = ok and r.signal or nil })
end

-- kill(): stops the server at once (its whole process group); run() returns.
function Stdio:kill()
  if self.proc then self.proc:kill(0) end
end

-- close(): stops the server (its group killed) and waits, at most a few
-- seconds, until it is gone.
function Stdio:close()
  local proc = self.proc
  if not proc then return end
  self.last_stderr = self:stderr_tail()
  self.proc = nil
  proc:kill(0)
  local waited, err = pcall(deadline, 5, proc.wait, proc)
  proc:close()
  if not waited and errors.is_cancel(err) then error(err, 0) end
end

return M
