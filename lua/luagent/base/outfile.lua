-- The files a run writes its observations to (`--events jsonl:FILE`,
-- `--otlp FILE`): a write that fails (a full disk, ENOSPC; /dev/full) must
-- not pass in silence. The first failure is kept, and from then on the
-- file takes no more writes (it ends where the failure cut it, with no
-- hole after), and every call answers nil and the same message, naming the
-- file and the error. Whoever writes the file reports that message once;
-- `luagent run` also ends with exit status 74 (lua/luagent/cli/init.lua).
local M = {}

local Out = {}
Out.__index = Out

-- wrap(file, name) -> out: writes to an open Lua file; `name` (its path,
-- "stdout") names it in the message of a failure.
function M.wrap(file, name)
  if io.type(file) ~= "file" then error("outfile.wrap: expects an open file", 2) end
  return setmetatable({ file = file, name = tostring(name), error = nil, closed = false }, Out)
end

-- open(path) -> out (the file created or truncated) | nil, message.
function M.open(path)
  local f, err = io.open(path, "w")
  if not f then return nil, err end
  return M.wrap(f, path)
end

-- Keeps the first failure's message and returns it.
local function failed(out, err)
  if not out.error then
    out.error = string.format("cannot write to '%s': %s", out.name, tostring(err))
  end
  return out.error
end

-- out:write(...) -> true | nil, message: the pieces as the file's write
-- takes them (no joined copy).
function Out:write(...)
  if self.error then return nil, self.error end
  local ok, err = self.file:write(...)
  if not ok then return nil, failed(self, err) end
  return true
end

-- out:flush() -> true | nil, message.
function Out:flush()
  if self.error then return nil, self.error end
  local ok, err = self.file:flush()
  if not ok then return nil, failed(self, err) end
  return true
end

-- out:close() -> true | nil, message (a failure of its last flush too, or
-- the first failure before). Standard streams are flushed, not closed.
-- Once closed, it answers as it did.
function Out:close()
  if not self.closed then
    self.closed = true
    local f = self.file
    local ok, err
    if f == io.stdout or f == io.stderr then ok, err = f:flush() else ok, err = f:close() end
    if not ok then failed(self, err) end
  end
  if self.error then return nil, self.error end
  return true
end

return M
