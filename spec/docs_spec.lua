-- The docs cannot rot: every fenced block of every docs/**/*.md page runs
-- as docs/README.md says (spec/support/docs.lua, the runner), `luagent help
-- TOPIC` prints the guide's pages, and the API reference is what its
-- generator makes from the annotations of the public modules.
local h = require "helpers"
local docs = require "docs"

local PAGES = { "docs/getting-started.md", "docs/guide/agent.md", "docs/guide/events.md",
  "docs/guide/policy.md", "docs/guide/config.md", "docs/guide/durable.md", "docs/guide/mcp.md",
  "docs/guide/observability.md" }

describe("the docs' snippets", function()
  it("cover the pages the guide promises", function()
    for _, page in ipairs(PAGES) do
      assert(io.open(page), page .. " is missing")
    end
  end)

  for _, page in ipairs(docs.pages(".")) do
    it("run: " .. page, function()
      local ok, err = docs.run_page(page, { bin = h.bin })
      assert(ok, err)
    end)
  end
end)

describe("the snippet runner", function()
  local function page(text)
    local dir = h.tempdir()
    local path = dir .. "/broken.md"
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
    return path, dir
  end

  it("fails naming page:line of a broken lua block, after running the good ones", function()
    local path, dir = page(table.concat({
      "# A page",                                     -- 1
      "",                                             -- 2
      "```lua file=tools/hi.lua",                     -- 3
      "return { name = 'hi' }",                       -- 4
      "```",                                          -- 5
      "```lua",                                       -- 6
      "local f = assert(io.open('tools/hi.lua'))",    -- 7
      "assert(f:read('a'):find('hi'))",               -- 8
      "```",                                          -- 9
      "```lua norun",                                 -- 10
      "this is not Lua",                              -- 11
      "```",                                          -- 12
      "```text",                                      -- 13
      "nor is this",                                  -- 14
      "```",                                          -- 15
      "```lua",                                       -- 16
      "error('the docs rotted')",                     -- 17
      "```",                                          -- 18
    }, "\n") .. "\n")
    local ok, err = docs.run_page(path, { bin = h.bin, name = "broken.md" })
    assert.is_nil(ok)
    assert.matches("^broken%.md:16: the lua block exited 1", err)
    assert.matches("the docs rotted", err)
    os.execute("rm -rf " .. h.quote(dir))
  end)

  it("runs a sh block's $ lines with luagent on PATH, and names the line that failed", function()
    local path, dir = page(table.concat({
      "```sh",                              -- 1
      "$ luagent --version",                -- 2
      "luagent 0.1.0 (output: not run)",    -- 3
      "$ echo one \\",                      -- 4
      "  two > out.txt",                    -- 5
      "$ grep -q 'one two' out.txt",        -- 6
      "$ test -f nowhere.txt",              -- 7
      "```",                                -- 8
    }, "\n") .. "\n")
    local ok, err = docs.run_page(path, { bin = h.bin, name = "broken.md" })
    assert.is_nil(ok)
    assert.matches("^broken%.md:7: 'test %-f nowhere%.txt' exited 1", err)
    os.execute("rm -rf " .. h.quote(dir))
  end)

  it("passes a page whose blocks all run", function()
    local path, dir = page("```lua\nprint('fine')\n```\n\n```sh\n$ luagent help >/dev/null\n```\n")
    local ok, info = docs.run_page(path, { bin = h.bin })
    assert(ok, info)
    assert.equal(2, info.ran)
    os.execute("rm -rf " .. h.quote(dir))
  end)

  it("refuses an unknown attribute, an unsafe file= and an open fence, naming page:line", function()
    assert.same({ nil, "p.md:2: unknown attribute 'nrun' of a ``` block (norun, file=PATH)" },
      { docs.blocks("x\n```lua nrun\n```\n", "p.md") })
    assert.same({ nil, "p.md:1: file=../x.lua: a path inside the scratch folder is expected" },
      { docs.blocks("```lua file=../x.lua\n```\n", "p.md") })
    assert.same({ nil, "p.md:3: the ``` block is never closed" },
      { docs.blocks("a\nb\n```sh\n$ true\n", "p.md") })
  end)
end)

describe("luagent help TOPIC", function()
  local topics = { agent = "docs/guide/agent.md", tools = "docs/guide/tools.md",
    events = "docs/guide/events.md", policy = "docs/guide/policy.md", config = "docs/guide/config.md",
    durable = "docs/guide/durable.md", mcp = "docs/guide/mcp.md", chat = "docs/guide/chat.md",
    observability = "docs/guide/observability.md", start = "docs/getting-started.md" }
  for _, topic in ipairs({ "agent", "tools", "events", "policy", "config", "durable", "mcp", "chat",
                           "observability", "start" }) do
    it("prints " .. topics[topic] .. " for " .. topic, function()
      local r = h.run("help", topic)
      assert.equal(0, r.code, r.stderr)
      assert.equal(h.slurp(topics[topic]), r.stdout)
      assert(#r.stdout > 0)
    end)
  end

  it("lists the guide's topics in the usage, and refuses an unknown one", function()
    local r = h.run("help")
    local flat = r.stdout:gsub("%s+", " ")
    assert.matches("agent, tools, events, policy, config, durable, mcp, chat", flat)
    r = h.run("help", "nosuch")
    assert.equal(2, r.code)
    assert.matches("help: unknown topic 'nosuch'", r.stderr)
  end)
end)

describe("the API reference (docs/api.md)", function()
  it("is what mk/apidoc.lua makes from the annotations (run 'make api' after changing them)", function()
    local p = io.popen("lua5.4 mk/apidoc.lua --print 2>&1")
    local made = p:read("a")
    local ok = p:close()
    assert(ok, made)
    assert.equal(made, h.slurp("docs/api.md"), "docs/api.md differs from its annotations: run 'make api'")
  end)

  it("has every setting of lua/luagent/config.lua as a field of luagent.Settings", function()
    local text = h.slurp("docs/api.md")
    local section = text:match("\n## luagent%.Settings\n(.-)\n## ")
    assert(section, "docs/api.md has no luagent.Settings section")
    for _, s in ipairs(require("luagent.config").SETTINGS) do
      if s.name then
        assert(section:find("| `" .. s.name .. "` |", 1, true),
          "luagent.Settings (lua/luagent/config.lua) has no ---@field " .. s.name)
      end
    end
  end)

  it("documents every public name of the face", function()
    local text = h.slurp("docs/api.md")
    local luagent = require "luagent"
    local names = {}
    for k in pairs(luagent) do names[#names + 1] = k end
    for _, k in ipairs({ "agent", "tools", "events", "json", "http", "log", "options" }) do names[#names + 1] = k end
    for _, k in ipairs(names) do
      assert(text:find("luagent." .. k, 1, true), "docs/api.md does not name luagent." .. k)
    end
  end)
end)
