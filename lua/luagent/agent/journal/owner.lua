-- Who runs a durable run. A run has one runner at a time: the process that
-- holds its claim (journal.lua: store:claim). A process is named by its pid,
-- its host and the start of that pid (the boot and the start time: a pid
-- used again later is another process), so a claim whose owner is gone can
-- be told from one whose owner still runs. Linux: read from /proc.
local M = {}

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function trimmed(s)
  s = s and s:match("^%s*(.-)%s*$")
  if s == "" then return nil end
  return s
end

-- host() -> this machine's name (the kernel's host name).
function M.host()
  return trimmed(read("/proc/sys/kernel/hostname")) or trimmed(os.getenv("HOSTNAME")) or "localhost"
end

-- start_of(pid) -> the start of the process `pid` names ("BOOT_ID/TICKS"),
-- or nil when no process has that pid (a zombie has ended too).
function M.start_of(pid)
  if not math.tointeger(pid) then return nil end
  local stat = read("/proc/" .. math.tointeger(pid) .. "/stat")
  -- the command name may hold spaces and parentheses: the fields follow the last ')'
  local rest = stat and stat:match("^.*%)%s+(.*)$")
  if not rest then return nil end
  local fields = {}
  for w in rest:gmatch("%S+") do
    fields[#fields + 1] = w
    if #fields == 20 then break end
  end
  if fields[1] == "Z" or fields[1] == "X" or not fields[20] then return nil end
  return (trimmed(read("/proc/sys/kernel/random/boot_id")) or "?") .. "/" .. fields[20]
end

-- this() -> {pid=, host=, pid_start=}: this process.
function M.this()
  local pid = math.tointeger(tonumber((read("/proc/self/stat") or ""):match("^(%d+)")))
  return { pid = pid, host = M.host(), pid_start = pid and M.start_of(pid) }
end

-- same(a, b) -> whether two owners are one process.
function M.same(a, b)
  return a.pid == b.pid and a.host == b.host and a.pid_start == b.pid_start
end

-- gone(holder, here, age, stale_after) -> why the holder of a claim no
-- longer runs, or nil while it may. On this host its process is looked at:
-- gone when no process has its pid, or the pid is another process now. The
-- processes of another host cannot be seen: there the holder is gone when
-- its heartbeat is `age` seconds old, more than `stale_after`.
function M.gone(holder, here, age, stale_after)
  if holder.host == here.host then
    if M.start_of(holder.pid) ~= holder.pid_start then return "its process is gone" end
    return nil
  end
  if age and age > stale_after then return string.format("no heartbeat for %.0f s", age) end
  return nil
end

-- describe(holder, age) -> "pid 123@host since 2026-01-02 03:04:05 UTC
-- (last heartbeat 4 s ago)".
function M.describe(holder, age)
  local text = string.format("pid %s@%s since %s UTC", tostring(holder.pid), tostring(holder.host),
    holder.since and os.date("!%Y-%m-%d %H:%M:%S", math.floor(holder.since)) or "?")
  if age then text = text .. string.format(" (last heartbeat %.0f s ago)", math.max(age, 0)) end
  return text
end

return M
