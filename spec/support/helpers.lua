-- Shared helpers for specs: where the executable is, and running it.
local M = {}

-- The executable under test: the Makefile exports LUAGENT_BIN (build/ or
-- build-san/); a plain `busted` run falls back to build/luagent.
M.bin = os.getenv("LUAGENT_BIN") or "build/luagent"

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
M.quote = shell_quote

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end
M.slurp = slurp

-- The lines of a file (none when it is missing).
function M.lines(path)
  local out = {}
  local f = io.open(path)
  if not f then return out end
  for l in f:lines() do out[#out + 1] = l end
  f:close()
  return out
end

-- Whether process `pid` still runs (a zombie does not count).
function M.alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat", "rb")
  if not f then return false end
  local stat = f:read("a")
  f:close()
  return stat:match("^%d+ %b() (%a)") ~= "Z"
end

-- Writes `text` to a fresh temporary file and returns its path.
function M.tempfile(text, suffix)
  local path = os.tmpname() .. (suffix or "")
  local f = assert(io.open(path, "wb"))
  f:write(text or "")
  f:close()
  return path
end

-- A fresh empty temporary folder; its path.
function M.tempdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p " .. shell_quote(d)))
  return d
end

-- run_env(env, args...) -> {code=, stdout=, stderr=}: runs the executable
-- with the given arguments (strings, quoted here) and captures everything;
-- tempdb() -> a path for a SQLite file nobody has; remove_db(path) removes
-- it with its WAL and shared-memory files (journal specs).
function M.tempdb()
  local p = os.tmpname()
  os.remove(p)
  return p .. ".db"
end

function M.remove_db(p)
  for _, suffix in ipairs({ "", "-wal", "-shm" }) do os.remove(p .. suffix) end
end

-- env (or nil): NAME = value assignments for it, `unset` a list of
-- variables to leave out, `within` seconds after which it is killed (code
-- 137: for a spec whose failure would be a hang).
function M.run_env(env, ...)
  local out, err = os.tmpname(), os.tmpname()
  local words = {}
  if env then
    if env.within then words[#words + 1] = "timeout -s KILL " .. env.within end
    words[#words + 1] = "env"
    for _, name in ipairs(env.unset or {}) do words[#words + 1] = "-u " .. name end
    for k, v in pairs(env) do
      if k ~= "unset" and k ~= "within" then words[#words + 1] = k .. "=" .. shell_quote(v) end
    end
  end
  words[#words + 1] = shell_quote(M.bin)
  for _, a in ipairs({ ... }) do words[#words + 1] = shell_quote(a) end
  local cmd = table.concat(words, " ") .. " >" .. out .. " 2>" .. err .. " </dev/null"
  local _, _, code = os.execute(cmd)
  local r = { code = code, stdout = slurp(out), stderr = slurp(err) }
  os.remove(out)
  os.remove(err)
  return r
end

-- run(args...): run_env with no assignments.
function M.run(...) return M.run_env(nil, ...) end

-- run_script(source, args...) -> same as run, for `luagent run <tmpfile>`.
function M.run_script(source, ...)
  local path = M.tempfile(source, ".lua")
  local r = M.run("run", path, ...)
  r.path = path
  os.remove(path)
  return r
end

-- run_script_within(seconds, source, args...) -> run_script's, killed
-- (code 137) if it runs longer: for a spec whose failure would be a hang.
function M.run_script_within(seconds, source, ...)
  local path = M.tempfile(source, ".lua")
  local r = M.run_env({ within = seconds }, "run", path, ...)
  os.remove(path)
  return r
end

-- key_forms(key) -> the forms a key can take in an output: as is,
-- percent-encoded (upper- and lowercase hex) and with "/" JSON-escaped.
function M.key_forms(key)
  local function pct(lower)
    return (key:gsub("[^%w%-%._~]", function(c) return string.format(lower and "%%%02x" or "%%%02X", c:byte()) end))
  end
  return { key, pct(false), pct(true), (key:gsub("/", "\\/")) }
end

-- drain(agent, text) -> every event of a prompt's run, and its agent_end.
function M.drain(a, text)
  local evs = {}
  for ev in a:prompt(text or "go") do evs[#evs + 1] = ev end
  return evs, evs[#evs]
end

-- of_type(events, type) -> the events of that type, in order.
function M.of_type(evs, t)
  local out = {}
  for _, e in ipairs(evs) do if e.type == t then out[#out + 1] = e end end
  return out
end

return M
