-- Running user Lua (policy files and hooks; Lua tools next) so that it can
-- neither freeze the host nor exhaust its memory: every call gets a bound in
-- wall time, memory and instructions, and one that passes a bound is
-- stopped and reported with file:line. host/sandbox.c does the bounding and
-- says why it is done in the host's own state; this module adds what user
-- code may see (env), what it is given (plain, bounded copies: plain) and
-- the call itself (call); and it reads the files user code comes in
-- (read_file: policy and tool files, and cassettes alike).
--
--   local ok, a, b = sandbox.call(fn, { x, y }, { wall = 0.1, memory = 32 * 2^20,
--                                                 instructions = 1e5 })
--   -- ok false: a is "file:line: message"
local core = require "luagent.core"

local M = {}

-- The bounds of a call that gives none: 0.1 s of wall time, 32 MiB of net
-- allocation, 1,000,000 Lua instructions.
M.defaults = { wall = 0.1, memory = 32 * 1024 * 1024, instructions = 1000000 }

-- How much of its input a hook is given (plain): strings are cut to
-- max_string bytes, tables to max_depth levels and max_items entries in all.
M.input = { max_string = 64 * 1024, max_depth = 8, max_items = 10000 }

local function copy(t, except)
  local c = {}
  for k, v in next, t do
    if not (except and except[k]) then c[k] = v end
  end
  return c
end

-- The string and table libraries of sandboxed code: Lua's, with the
-- functions whose time is not bounded by what they allocate replaced
-- (host/sandbox.c: find, match, gmatch, gsub, rep, move).
local STRING = copy(string)
for name, fn in pairs(core.bounded_string) do STRING[name] = fn end
local TABLE = copy(table)
for name, fn in pairs(core.bounded_table) do TABLE[name] = fn end

-- A fresh environment for user code: pure functions and copies of the pure
-- libraries. Left out: io, os (but time/clock/date/difftime), require, load,
-- dofile, debug, coroutine, package, print (stdout may carry JSON events),
-- collectgarbage, getmetatable (it reaches the shared string metatable),
-- setmetatable (a metamethod would run later, outside every bound: __gc at
-- any collection, __index or __pairs when the host reads a result) and
-- math.randomseed (host state). `extra` adds fields.
function M.env(extra)
  local env = {
    assert = assert, error = error, ipairs = ipairs, next = next,
    pairs = pairs, pcall = pcall, xpcall = xpcall, select = select,
    tonumber = tonumber, tostring = tostring, type = type,
    rawequal = rawequal, rawget = rawget, rawlen = rawlen, rawset = rawset,
    string = copy(STRING), table = copy(TABLE), utf8 = copy(utf8),
    math = copy(math, { randomseed = true }),
    os = { time = os.time, clock = os.clock, date = os.date, difftime = os.difftime },
  }
  env._G = env
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

-- A plain, bounded copy of v for user code: tables without metatables (read
-- raw), strings cut to M.input.max_string, at most M.input.max_depth levels
-- and M.input.max_items entries; functions, userdata and threads are left
-- out. A table seen twice is copied once.
function M.plain(v)
  local lim = M.input
  local items, seen = 0, {}
  local function cp(x, depth)
    local tx = type(x)
    if tx == "string" then
      return #x > lim.max_string and x:sub(1, lim.max_string) or x
    elseif tx == "number" or tx == "boolean" then
      return x
    elseif tx ~= "table" or depth > lim.max_depth then
      return nil
    end
    if seen[x] then return seen[x] end
    local c = {}
    seen[x] = c
    local k, val = next(x)
    while k ~= nil and items < lim.max_items do
      items = items + 1
      local ck = (type(k) == "string" or type(k) == "number" or type(k) == "boolean") and cp(k, depth + 1)
      if ck ~= nil then rawset(c, ck, cp(val, depth + 1)) end
      k, val = next(x, k)
    end
    return c
  end
  return cp(v, 1)
end

-- "file:line: " of a stack level (from debug.getinfo with "Sl"), or "".
local function position(info)
  if not info or info.currentline < 0 then return "" end
  local src = info.source:sub(1, 1) == "@" and info.source:sub(2) or info.short_src
  return src .. ":" .. info.currentline .. ": "
end

-- The message of an error value, with the failing position added from the
-- dead coroutine's stack when the message has none (error("x", 0), tables).
local function error_message(co, e)
  local msg = type(e) == "string" and e
    or (type(e) == "table" and type(rawget(e, "message")) == "string" and rawget(e, "message"))
    or ("error object is a " .. type(e) .. " value")
  if msg:match("^[^\n]-:%d+:") then return msg end
  for level = 0, 50 do
    local info = debug.getinfo(co, level, "Sl")
    if not info then break end
    if info.currentline >= 0 then return position(info) .. msg end
  end
  return msg
end

-- The functions swapped into the host's own string and table libraries
-- while a sandboxed call runs, so that string methods (s:match(...)) and
-- host functions the user code calls are bounded too.
local SWAP = {
  { string, "find" }, { string, "match" }, { string, "gmatch" }, { string, "gsub" },
  { string, "rep" }, { table, "move" },
}
local BOUNDED = {}
for i, s in ipairs(SWAP) do BOUNDED[i] = (s[1] == string and STRING or TABLE)[s[2]] end

-- Puts `fns` (a list in SWAP's order) into the libraries; returns the
-- functions they replace.
local function swap(fns)
  local old = {}
  for i, s in ipairs(SWAP) do
    old[i] = s[1][s[2]]
    s[1][s[2]] = fns[i]
  end
  return old
end

-- Calls fn(table.unpack(args)) within `limits` ({wall=, memory=,
-- instructions=}; a field left out takes M.defaults'; who= names the code
-- in messages, "user code" by default). Returns true and
-- fn's results, or false and a message starting with "file:line:" when the
-- position is known: an error, a bound passed (it is stopped at once and
-- pcall cannot catch that), or an attempt to wait (fn may not yield). The
-- host's string and table libraries hold the bounded functions while fn
-- runs (SWAP).
function M.call(fn, args, limits)
  limits = limits or {}
  local d = M.defaults
  local box = core.sandbox {
    wall = limits.wall or d.wall, memory = limits.memory or d.memory,
    instructions = limits.instructions or d.instructions,
  }
  local co = coroutine.create(fn)
  args = args or {}
  local host = swap(BOUNDED)
  local res = table.pack(pcall(box.resume, box, co, table.unpack(args, 1, args.n or #args)))
  swap(host)
  if not res[1] then error(res[2], 0) end -- misuse: a call inside a sandboxed call
  res = table.pack(table.unpack(res, 2, res.n))
  if not res[1] then
    local msg = res[3] or error_message(co, res[2])
    coroutine.close(co)
    return false, msg
  end
  if coroutine.status(co) == "suspended" then
    local where = position(debug.getinfo(co, 1, "Sl"))
    coroutine.close(co)
    return false, where .. (limits.who or "user code") .. " may not wait (it yielded)"
  end
  return true, table.unpack(res, 2, res.n)
end

-- read_file(path [, max_bytes]) -> the whole file at `path`, bytes as they
-- are, or nil and a message naming it as io's do ("path: No such file or
-- directory", "path: Is a directory": a folder opens but cannot be read).
-- With max_bytes, only a regular file (links followed) of at most that many
-- bytes is read, and opening never waits (core.read_file: a FIFO or a
-- device named like a user file cannot hold the loop); a third value then
-- says why not: "missing", "not_regular", "too_large", "changed" (it grew
-- while read) or "unreadable".
function M.read_file(path, max_bytes)
  if max_bytes then
    local text, err = core.read_file(path, max_bytes)
    if not text then return nil, err.message, err.reason end
    return text
  end
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local text, rerr = f:read("a")
  f:close()
  if not text then return nil, path .. ": " .. tostring(rerr) end
  return text
end

return M
