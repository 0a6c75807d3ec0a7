-- The official npm clients, openai and @anthropic-ai/sdk (pinned in
-- peers/package.json, installed by `make peers` into the git-ignored .peers/),
-- parse the normal replies of `luagent mock` without error: chat completions
-- streamed and not, responses streamed, Anthropic messages streamed (raw
-- events and messages.stream()) and not; each without tools (the message is
-- echoed) and with a tool offered (the mock calls it). The mock runs as a
-- child process, because node runs from here as a blocking child: an
-- in-process mock could not answer while this spec waits for node.
-- Skipped, and counted as such, without node or the packages.
local luagent = require "luagent"
local http = require "luagent.base.http"
local cjson = require "cjson"
local peers = require "peers"
local helpers = require "helpers"

local SAY = "hello from the official clients"
local SCRIPT = "spec/support/sdk_check.mjs"
local PACKAGES = { "openai", "@anthropic-ai/sdk" }

-- The cases sdk_check.mjs runs, each without and with tools: name, the
-- finish reason of a text reply, of a tool call, and the tool id prefix.
local CASES = {
  { "openai chat.completions.create stream:true", "stop", "tool_calls", "call_mock" },
  { "openai chat.completions.stream", "stop", "tool_calls", "call_mock" },
  { "openai chat.completions.create stream:false", "stop", "tool_calls", "call_mock" },
  { "openai responses.create stream:true", "completed", "completed", "call_mock" },
  { "openai responses.stream", "completed", "completed", "call_mock" },
  { "anthropic messages.create stream:true", "end_turn", "tool_use", "toolu_mock" },
  { "anthropic messages.stream", "end_turn", "tool_use", "toolu_mock" },
  { "anthropic messages.create stream:false", "end_turn", "tool_use", "toolu_mock" },
}

-- Runs a shell command; its stdout, or nil when it failed.
local function sh(cmd)
  local p = io.popen(cmd, "r")
  if not p then return nil end
  local out = p:read("a")
  if not p:close() then return nil end
  return out
end

-- node, and each package installed at its pinned version: {node=,
-- versions={pkg=version}} | nil, why not.
local function find_sdks()
  local node = peers.node()
  if not node then return nil, "node is not on PATH" end
  local versions = {}
  for _, pkg in ipairs(PACKAGES) do
    local v = peers.installed(pkg)
    if not v then return nil, pkg .. " is not in " .. peers.root .. "/" end
    local pin = peers.pinned(pkg)
    if pin and pin ~= v then
      return nil, string.format("%s %s is installed but %s pins %s", pkg, v, peers.manifest, pin)
    end
    versions[pkg] = v
  end
  return { node = node, versions = versions }
end

local alive = helpers.alive

-- Stops the mock child: TERM, KILL after 3 s; removes its scratch folder.
local function stop_mock(m)
  if m.pid and alive(m.pid) then
    os.execute("kill -TERM " .. m.pid .. " 2>/dev/null")
    local limit = os.time() + 3
    while alive(m.pid) and os.time() <= limit do luagent.sleep(0.02) end
    if alive(m.pid) then os.execute("kill -KILL " .. m.pid .. " 2>/dev/null") end
  end
  os.execute("rm -rf " .. helpers.quote(m.dir))
end

-- Starts `luagent mock --listen 127.0.0.1:0` in the background and waits
-- (at most 10 s) for the address it prints. {pid=, url=, dir=} | nil, why.
local function start_mock()
  local dir = assert(sh("mktemp -d")):gsub("%s+$", "")
  local log = dir .. "/log"
  os.execute(helpers.quote(helpers.bin) .. " mock --listen 127.0.0.1:0 </dev/null >"
    .. helpers.quote(log) .. " 2>&1 & echo $! >" .. helpers.quote(dir .. "/pid"))
  local m = { dir = dir, pid = math.tointeger(tonumber(helpers.slurp(dir .. "/pid"):match("%d+") or "")) }
  local limit = os.time() + 10
  while m.pid do
    m.url = helpers.slurp(log):match("listening on (http://%S+)")
    if m.url then return m end
    if not alive(m.pid) or os.time() > limit then break end
    luagent.sleep(0.02)
  end
  local why = "luagent mock did not print its address: " .. helpers.slurp(log)
  stop_mock(m)
  return nil, why
end

-- Runs sdk_check.mjs against `url`: its results by case name, or nil and
-- what went wrong (with node's stderr).
local function run_node(node, url)
  local errfile = os.tmpname()
  local out = sh(table.concat({ "timeout 120", helpers.quote(node), helpers.quote(SCRIPT),
    helpers.quote(url), helpers.quote(peers.root), helpers.quote(SAY),
    "2>" .. helpers.quote(errfile) }, " "))
  local stderr = helpers.slurp(errfile)
  os.remove(errfile)
  local ok, list = pcall(cjson.decode, out or "")
  if not out or not ok or type(list) ~= "table" then
    return nil, SCRIPT .. " failed: " .. tostring(out) .. "\n" .. stderr
  end
  local by_name = {}
  for _, r in ipairs(list) do by_name[r.name] = r end
  return by_name
end

local sdks, why = find_sdks()

describe("the official openai and @anthropic-ai/sdk clients against luagent mock", function()
  if not sdks then
    pending("official SDK clients not installed: run `make peers` (needs node and npm): " .. why)
    return
  end

  local server, results, failure
  lazy_setup(function()
    server, failure = start_mock()
    if server then results, failure = run_node(sdks.node, server.url) end
  end)

  lazy_teardown(function()
    if server then stop_mock(server) end
  end)

  local versions = string.format("openai %s, @anthropic-ai/sdk %s",
    sdks.versions.openai, sdks.versions["@anthropic-ai/sdk"])

  for _, c in ipairs(CASES) do
    local name, text_finish, tool_finish, id_prefix = c[1], c[2], c[3], c[4]

    it(name .. " parses a text reply (" .. versions .. ")", function()
      assert(results, failure)
      local r = assert(results[name], SCRIPT .. " reported nothing for " .. name)
      assert(r.ok, r.error)
      assert.equal(SAY, r.text)
      assert.equal(text_finish, r.finish)
      assert.is_nil(r.tool)
    end)

    it(name .. " parses a tool call when tools are offered", function()
      assert(results, failure)
      local label = name .. " with tools"
      local r = assert(results[label], SCRIPT .. " reported nothing for " .. label)
      assert(r.ok, r.error)
      assert.equal("", r.text)
      assert.equal(tool_finish, r.finish)
      assert.is_table(r.tool)
      assert.equal("get_weather", r.tool.name)
      assert.matches("^" .. id_prefix .. "%d+$", r.tool.id)
      assert.same({ city = SAY }, r.tool.arguments)
    end)
  end

  it("sent one request per call, with their keys masked in the mock's log", function()
    assert(results, failure)
    local resp = assert(http.fetch { url = server.url .. "/__luagent/requests",
      timeout = { connect = 5, total = 10 } })
    assert.is_nil(resp.body:find("secret", 1, true), "an SDK key leaked into the log")
    local log = cjson.decode(resp.body)
    assert.equal(2 * #CASES, #log)
    for i, r in ipairs(log) do
      assert.equal(i, r.n)
      assert.equal("POST", r.method)
      -- @anthropic-ai/sdk 1.x sends its key as a bearer token, older ones
      -- as x-api-key: whichever came, it is masked
      local auth, key = r.headers.authorization, r.headers["x-api-key"]
      assert.is_truthy(auth or key, "no key header in request " .. i)
      if auth then assert.equal("Bearer ***", auth) end
      if key then assert.equal("***", key) end
    end
  end)
end)
