-- Peers for specs: programs written by others (pinned in peers/package.json,
-- installed into .peers/ by `make peers`) that luagent is tested against.
-- Finds node and an installed package, and runs a node program as a server
-- on a free loopback port: started in the background with a pid file, ready
-- once it answers HTTP, killed by stop(). Paths are relative to the checkout
-- root, where specs run.
local luagent = require "luagent"
local http = require "luagent.base.http"
local errors = require "luagent.base.errors"
local cjson = require "cjson"

local M = {
  root = ".peers",               -- where `make peers` installs
  manifest = "peers/package.json", -- the pinned versions
}

-- Quotes `s` as one word for /bin/sh.
local function quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Runs a shell command; returns its stdout without trailing white space, or
-- nil when it failed.
local function sh(cmd)
  local p = io.popen(cmd, "r")
  if not p then return nil end
  local out = p:read("a")
  if not p:close() then return nil end
  return (out:gsub("%s+$", ""))
end

-- The whole content of a file, or nil.
local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- A decoded JSON file, or nil.
local function json_file(path)
  local text = slurp(path)
  if not text then return nil end
  local ok, v = pcall(cjson.decode, text)
  if ok and type(v) == "table" then return v end
end

-- node() -> the path of node, or nil when it is not on PATH.
function M.node()
  local path = sh("command -v node 2>/dev/null")
  if path and path ~= "" then return path end
end

-- installed(pkg) -> the version of `pkg` installed in .peers/, or nil.
function M.installed(pkg)
  local meta = json_file(M.root .. "/node_modules/" .. pkg .. "/package.json")
  return meta and meta.version
end

-- pinned(pkg) -> the version peers/package.json pins for `pkg`, or nil.
function M.pinned(pkg)
  local meta = json_file(M.manifest)
  local deps = meta and meta.dependencies
  return type(deps) == "table" and deps[pkg] or nil
end

-- find(pkg, bin) -> {node=, bin=, version=} | nil, reason: node, and `pkg`
-- installed at its pinned version with the executable `bin`.
function M.find(pkg, bin)
  local node = M.node()
  if not node then return nil, "node is not on PATH" end
  local version = M.installed(pkg)
  if not version then return nil, pkg .. " is not in " .. M.root .. "/" end
  local pin = M.pinned(pkg)
  if pin and pin ~= version then
    return nil, string.format("%s %s is installed but %s pins %s", pkg, version, M.manifest, pin)
  end
  local path = M.root .. "/node_modules/.bin/" .. bin
  if not slurp(path) then return nil, path .. " is missing" end
  return { node = node, bin = path, version = version }
end

-- free_port(node) -> a TCP port nobody listens on at 127.0.0.1 right now
-- (the OS picks it; node is at hand wherever a peer can run).
function M.free_port(node)
  local js = "const s=require('net').createServer();"
    .. "s.listen(0,'127.0.0.1',()=>{process.stdout.write(String(s.address().port));s.close()})"
  local out = sh(quote(node) .. " -e " .. quote(js))
  local port = math.tointeger(tonumber(out or ""))
  if not port then error("peers.free_port: node did not report a port", 2) end
  return port
end

-- Whether process `pid` still runs (a zombie left for init to reap does not).
local function alive(pid)
  local stat = slurp("/proc/" .. pid .. "/stat")
  if stat then return stat:match("^%d+ %b() (%a)") ~= "Z" end
  return sh("kill -0 " .. pid .. " 2>/dev/null") ~= nil
end

-- Waits until process `pid` is gone, for at most `seconds` of wall time.
local function wait_gone(pid, seconds)
  local limit = os.time() + seconds
  while alive(pid) do
    if os.time() > limit then return false end
    luagent.sleep(0.02)
  end
  return true
end

local Server = {}
Server.__index = Server

-- server:log() -> what the program wrote to stdout and stderr so far.
function Server:log()
  return slurp(self.dir .. "/log") or ""
end

-- server:stop(): TERM, then KILL after 3 s, and removes the scratch folder.
-- Idempotent.
function Server:stop()
  if self.stopped then return end
  self.stopped = true
  if self.pid then
    os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
    if not wait_gone(self.pid, 3) then
      os.execute("kill -KILL " .. self.pid .. " 2>/dev/null")
      wait_gone(self.pid, 3)
    end
  end
  os.execute("rm -rf " .. quote(self.dir))
end
Server.__close = Server.stop

-- A server dropped without stop() is still told to exit, without waiting
-- (a finalizer must not yield), and its scratch folder removed.
function Server:__gc()
  if self.stopped then return end
  if self.pid then os.execute("kill -TERM " .. self.pid .. " 2>/dev/null") end
  os.execute("rm -rf " .. quote(self.dir))
end

-- Replaces {dir} and {port} in `s`.
local function expand(s, dir, port)
  return (s:gsub("{dir}", dir):gsub("{port}", tostring(port)))
end

-- start{node=, script=, args={...}, files={name=text}, port=, ready="/health",
-- timeout=10} -> server {pid=, port=, url=, dir=} | nil, err.
-- Writes `files` into a fresh scratch folder, runs `node script args...` in
-- the background (stdin from /dev/null, output to the folder's log) and
-- polls http://127.0.0.1:port<ready> until it answers with a status below
-- 500, at most `timeout` seconds. "{dir}" and "{port}" in args and files
-- are replaced. Fails with `usage` when the program exits first (its log is
-- in err.log) and `timeout` when it never answers; either way it is stopped.
function M.start(opts)
  if type(opts) ~= "table" or type(opts.node) ~= "string" or type(opts.script) ~= "string" then
    error("peers.start: expects {node=, script=, ...}", 2)
  end
  local port = opts.port or M.free_port(opts.node)
  local dir = sh("mktemp -d 2>/dev/null")
  if not dir or dir == "" then error("peers.start: mktemp -d failed", 2) end
  local server = setmetatable({ port = port, dir = dir, url = "http://127.0.0.1:" .. port }, Server)
  for name, text in pairs(opts.files or {}) do
    local f = assert(io.open(dir .. "/" .. name, "wb"))
    f:write(expand(text, dir, port))
    f:close()
  end
  local words = { quote(opts.node), quote(opts.script) }
  for _, a in ipairs(opts.args or {}) do words[#words + 1] = quote(expand(a, dir, port)) end
  os.execute(table.concat(words, " ") .. " </dev/null >" .. quote(dir .. "/log") .. " 2>&1 & echo $! >"
    .. quote(dir .. "/pid"))
  server.pid = math.tointeger(tonumber(slurp(dir .. "/pid") or ""))
  if not server.pid then
    server:stop()
    return nil, errors.new("usage", "peers.start: could not start " .. opts.script)
  end

  local limit = os.time() + (opts.timeout or 10)
  local ready = server.url .. (opts.ready or "/health")
  while true do
    local resp = http.fetch { method = "GET", url = ready, http_errors = false,
      timeout = { connect = 1, total = 2 } }
    if resp and resp.status < 500 then return server end
    if not alive(server.pid) then
      local log = server:log()
      server:stop()
      return nil, errors.new("usage", opts.script .. " exited before it listened: " .. log, { log = log })
    end
    if os.time() > limit then
      local log = server:log()
      server:stop()
      return nil, errors.new("timeout", string.format("%s did not answer %s within %g s",
        opts.script, ready, opts.timeout or 10), { which = "ready", log = log })
    end
    luagent.sleep(0.05)
  end
end

return M
