-- Packaging: `make install PREFIX=...` gives a luagent that runs the
-- examples from any folder, and `luarocks make --local` gives a plain lua5.4
-- the library and luagent.core.
local h = require "helpers"

local root = io.popen("pwd"):read("l")

-- sh(cmd) -> ok, output (stdout and stderr together)
local function sh(cmd)
  local p = io.popen("(" .. cmd .. ") 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return ok, out
end

local function tmpdir()
  local p = io.popen("mktemp -d")
  local d = p:read("l")
  p:close()
  return d
end

describe("make install", function()
  it("installs an executable that runs the installed hello example from /", function()
    local prefix = tmpdir()
    -- install the build under test (build/ or build-san/), without rebuilding it
    local b = h.bin:match("^(.*)/luagent$") or "build"
    local san = b:match("san") and " SAN=1" or ""
    local ok, out = sh(string.format("make -s -C %s install B=%s%s PREFIX=%s", h.quote(root), b, san, h.quote(prefix)))
    assert(ok, out)
    ok, out = sh(string.format("cd / && env -u OPENAI_API_KEY -u ANTHROPIC_API_KEY -u OPENROUTER_API_KEY %s/bin/luagent run --faults 503@1 --fast %s/share/luagent/examples/hello.lua",
      h.quote(prefix), h.quote(prefix)))
    assert(ok, out)
    assert.matches("replaying " .. prefix:gsub("%p", "%%%0") .. "/share/luagent/examples/hello%.cassette%.jsonl", out)
    assert.matches("%[attempt 1 of 6 failed: http: HTTP 503", out)
    assert.matches("Jitter randomizes each wait", out)
    ok, out = sh(string.format("cd / && %s/bin/luagent --version", h.quote(prefix)))
    assert(ok, out)
    assert.matches("^luagent %d+%.%d+%.%d+ %(Lua 5%.4%.%d+, libcurl [%d.]+, libuv [%d.]+%)\n$", out)
    -- the guide's pages come along: `luagent help agent` prints the installed one
    ok, out = sh(string.format("cd / && %s/bin/luagent help agent", h.quote(prefix)))
    assert(ok, out)
    assert.equal(h.slurp(root .. "/docs/guide/agent.md"), out)
    sh("rm -rf " .. h.quote(prefix))
  end)
end)

describe("luarocks make --local", function()
  local has_luarocks = os.execute("command -v luarocks >/dev/null 2>&1")
  if not has_luarocks then
    pending("skipped: luarocks is not installed (apt-get install luarocks; `make test` installs it)")
    return
  end
  it("installs the library and luagent.core for a plain lua5.4, policies included", function()
    local home, copy = tmpdir(), tmpdir()
    -- build from a copy of the tracked tree, so the checkout's build/ is untouched
    local ok, out = sh(string.format("cd %s && git ls-files -z | xargs -0 cp --parents -t %s", h.quote(root), h.quote(copy)))
    assert(ok, out)
    -- without make's own variables: under `make test SAN=1` they would carry
    -- SAN=1 into the rock's build, and a plain lua5.4 cannot load that
    ok, out = sh(string.format("cd %s && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES -u SAN -u B HOME=%s luarocks --lua-version 5.4 make --local",
      h.quote(copy), h.quote(home)))
    assert(ok, out)
    assert.matches("luagent scm%-1 is now installed", out)
    ok, out = sh(string.format([[cd / && eval "$(HOME=%s luarocks --lua-version 5.4 path)" && lua5.4 -e '
      local luagent = require "luagent"
      local core = require "luagent.core"
      local policy = require "luagent.model.policy"
      local found = package.searchpath("yoagent", policy.path)
      print(core.version, found)']], h.quote(home)))
    assert(ok, out)
    assert.matches("^%d+%.%d+%.%d+\t" .. home:gsub("%p", "%%%0") .. "/%.luarocks/share/lua/5%.4/luagent/policies/yoagent%.lua\n$", out)
    -- the docs, beside the annotated sources lua-language-server reads
    assert.equal(h.slurp(root .. "/docs/guide/agent.md"),
      h.slurp(home .. "/.luarocks/share/lua/5.4/luagent/docs/guide/agent.md"))
    assert.equal(h.slurp(root .. "/docs/api.md"), h.slurp(home .. "/.luarocks/share/lua/5.4/luagent/docs/api.md"))
    -- and the help command finds them there, without an executable beside them
    ok, out = sh(string.format([[cd / && eval "$(HOME=%s luarocks --lua-version 5.4 path)" && lua5.4 -e '
      os.exit(require("luagent.cli").main({ [0] = "luagent", "help", "agent" }))']], h.quote(home)))
    assert(ok, out)
    assert.equal(h.slurp(root .. "/docs/guide/agent.md"), out)
    -- the runtime object and its methods, on the rock alone (spec/runtime_api_spec.lua)
    ok, out = sh(string.format([[cd / && eval "$(HOME=%s luarocks --lua-version 5.4 path)" && timeout -s KILL 60 lua5.4 %s]],
      h.quote(home), h.quote(root .. "/spec/fixtures/runtime_api.lua")))
    assert(ok, out)
    assert.equal("provider\topenai\tgpt-4o-mini\ttrue\ncomplete\tstring\t1\nstream\ttrue\n"
      .. "agent\tagent_end\tstop\nsubscribed\t2\nhealth\t1\nclosed\n", out)
    sh("rm -rf " .. h.quote(home) .. " " .. h.quote(copy))
  end)
end)
