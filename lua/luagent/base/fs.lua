-- luagent.fs: files for Lua tools and scripts, on the loop. Each call
-- waits as a task waits (host/fs.c runs it in libuv's thread pool,
-- host/fs_lua.c binds it under the suspension contract): other tasks run
-- meanwhile, a cancellation (the tool's timeout, the agent's abort) ends
-- the wait at once, and inside a Lua tool the wait counts against the
-- tool's timeout as any wait does, not as computing. A plain script that
-- is no task drives the loop while it waits; a policy hook may not wait.
--
-- Failures are values: nil and a record of kind "fs" whose message names
-- the operation and the path ({kind = "fs", message =, path =, op =,
-- reason =, code =}; reason is "missing", "permission_denied",
-- "directory" (a folder where a file is wanted), "not_directory",
-- "not_regular" (a FIFO, a device, a socket: never opened for reading),
-- "too_large", "no_space", "read_only" or "failed"; code is the errno's
-- name, "ENOENT", when the system gave one). Misuse (a path that is not a
-- string, an unknown option) raises.
local core = require "luagent.core"

---Files on the event loop (`luagent.fs`): `read`, `write`, `list`, `stat`.
---@class luagent.fs
local M = {}

-- What fs.read takes by default at most: a file past it is "too_large".
M.MAX_BYTES = 64 * 1024 * 1024

---@class luagent.fs.Error
---@field kind "fs"
---@field message string what failed, naming the operation and the path
---@field path string
---@field op "read"|"write"|"list"|"stat"
---@field reason "missing"|"permission_denied"|"directory"|"not_directory"|"not_regular"|"too_large"|"no_space"|"read_only"|"failed"
---@field code? string the errno's name ("ENOENT"), when the system gave one

---@class luagent.fs.Entry
---@field name string the entry's name in its folder
---@field type "file"|"directory"|"link"|"fifo"|"socket"|"char_device"|"block_device"|"unknown" links not followed

---@class luagent.fs.Stat
---@field type "file"|"directory"|"link"|"fifo"|"socket"|"char_device"|"block_device"|"unknown" links followed
---@field size integer bytes
---@field mtime number last change, in seconds since the epoch (fractional)

local function check_path(fn, path)
  if type(path) ~= "string" then
    error(string.format("fs.%s: path must be a string (got %s)", fn, type(path)), 3)
  end
  if path:find("\0", 1, true) then error("fs." .. fn .. ": path must not hold a NUL byte", 3) end
end

-- opts of fn: nil or a table whose keys are all in `allowed` ({name =
-- check}); raises naming the first unknown or bad one.
local function check_opts(fn, opts, allowed, names)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error("fs." .. fn .. ": options must be a table (got " .. type(opts) .. ")", 3) end
  for k, v in pairs(opts) do
    local check = allowed[k]
    if not check then
      error(string.format("fs.%s: unknown option '%s' (fs.%s takes %s)", fn, tostring(k), fn, names), 3)
    end
    local why = check(v)
    if why then error("fs." .. fn .. ": " .. k .. " " .. why, 3) end
  end
  return opts
end

local READ_OPTS = { max_bytes = function(v)
  if math.type(v) ~= "integer" or v < 0 then return "must be a whole number of bytes >= 0" end
end }
local WRITE_OPTS = { append = function(v)
  if type(v) ~= "boolean" then return "must be true or false" end
end }

--- Reads a regular file whole (links followed). A folder, a FIFO or a
--- device is refused unread, and so is a file of more than max_bytes
--- (default fs.MAX_BYTES, 64 MiB).
---@param path string
---@param opts? {max_bytes?: integer}
---@return string|nil bytes the file's bytes as they are
---@return luagent.fs.Error|nil err
function M.read(path, opts)
  check_path("read", path)
  opts = check_opts("read", opts, READ_OPTS, "max_bytes")
  return core.fs_read(path, opts.max_bytes or M.MAX_BYTES)
end

--- Writes `data` to the file at `path`, created if missing (mode 0666 less
--- the umask), replaced unless append = true. Only a regular file is
--- written (a folder, a FIFO or a device is refused). Not atomic: a reader
--- may see the file half written; write a temporary file and os.rename it
--- when that matters.
---@param path string
---@param data string
---@param opts? {append?: boolean}
---@return true|nil ok
---@return luagent.fs.Error|nil err
function M.write(path, data, opts)
  check_path("write", path)
  if type(data) ~= "string" then error("fs.write: data must be a string (got " .. type(data) .. ")", 2) end
  opts = check_opts("write", opts, WRITE_OPTS, "append")
  return core.fs_write(path, data, opts.append == true)
end

--- Lists a folder: its entries but "." and "..", sorted by name (bytes),
--- each with its type (a link is "link": not followed).
---@param path string
---@return luagent.fs.Entry[]|nil entries
---@return luagent.fs.Error|nil err
function M.list(path)
  check_path("list", path)
  return core.fs_list(path)
end

--- What is at `path` (links followed): its type, size and last change.
--- A missing path is nil and an error whose reason is "missing".
---@param path string
---@return luagent.fs.Stat|nil stat
---@return luagent.fs.Error|nil err
function M.stat(path)
  check_path("stat", path)
  return core.fs_stat(path)
end

return M
