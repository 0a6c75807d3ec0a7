-- The docs' snippet runner (spec/docs_spec.lua): reads a Markdown page,
-- takes its fenced blocks in page order and runs them in a scratch folder
-- of the page's own, as docs/README.md says:
--
--   ```lua              a whole script: run with `luagent run --mock FILE`
--                       in the scratch folder; must exit 0
--   ```LANG file=PATH   written to PATH in the scratch folder, not run
--   ```sh               each line starting with "$ " run by sh in the
--                       scratch folder, build/ first on PATH; must exit 0
--                       (a line ending in "\" goes on on the next line)
--   ```LANG norun       not run; so is any other language (text, json)
--
-- Every run has no provider key in its environment (so the embedded mock
-- answers), is bounded in time, and fails naming page:line of its block.
local M = {}

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function write(path, text)
  local f, err = io.open(path, "wb")
  if not f then return nil, err end
  f:write(text)
  f:close()
  return true
end

-- The variables a snippet never sees: with none, the mock answers.
M.UNSET = { "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "OPENAI_BASE_URL",
            "ANTHROPIC_BASE_URL", "OPENROUTER_BASE_URL", "LUAGENT_LOG", "LUAGENT_REDIS_URL",
            "LUAGENT_HOME", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" }

-- The seconds one block may take before it is killed (a snippet that hangs
-- fails instead of holding the spec).
M.within = 60

local ATTRS = { norun = true, file = true }

-- blocks(text, page) -> the fenced blocks of a page, in order:
-- {lang=, file=, norun=, line=, text=} (line: the opening fence's line);
-- or nil, "page:line: message" for a block the runner cannot read (an
-- unknown attribute, an unsafe file name, a fence never closed).
function M.blocks(text, page)
  local out, open = {}, nil
  local n = 0
  for line in (text:gsub("\r\n", "\n") .. (text:sub(-1) == "\n" and "" or "\n")):gmatch("([^\n]*)\n") do
    n = n + 1
    if open then
      local indent = line:match("^( *)```%s*$")
      if indent and #indent <= #open.indent then
        open.text = table.concat(open.lines, "\n") .. (#open.lines > 0 and "\n" or "")
        open.lines, open.indent = nil, nil
        out[#out + 1] = open
        open = nil
      else
        -- a block indented in a list item: its lines lose that indent
        open.lines[#open.lines + 1] = line:sub(1, #open.indent):match("^ *$") and line:sub(#open.indent + 1) or line
      end
    else
      local indent, info = line:match("^( *)```(.*)$")
      if indent and #indent <= 3 then
        local words = {}
        for w in info:gmatch("%S+") do words[#words + 1] = w end
        local b = { lang = words[1] or "", line = n, lines = {}, indent = indent }
        for i = 2, #words do
          local k, v = words[i]:match("^([%w_]+)=(.*)$")
          k = k or words[i]
          if not ATTRS[k] then
            return nil, string.format("%s:%d: unknown attribute '%s' of a ``` block (norun, file=PATH)", page, n, words[i])
          end
          if k == "file" then
            if not v or v == "" or v:sub(1, 1) == "/" or ("/" .. v .. "/"):find("/%.%./") then
              return nil, string.format("%s:%d: file=%s: a path inside the scratch folder is expected", page, n, tostring(v))
            end
            b.file = v
          else
            b.norun = true
          end
        end
        open = b
      end
    end
  end
  if open then return nil, string.format("%s:%d: the ``` block is never closed", page, open.line) end
  return out
end

-- The shell words that give a command the snippets' environment.
local function env_prefix(bin_dir)
  local words = { "timeout -s KILL " .. M.within, "env" }
  for _, name in ipairs(M.UNSET) do words[#words + 1] = "-u " .. name end
  words[#words + 1] = "PATH=" .. quote(bin_dir) .. ':"$PATH"'
  return table.concat(words, " ")
end

-- Runs `cmd` (shell text) in `dir`; returns ok, code, output (stdout and
-- stderr together).
local function sh(dir, cmd)
  local out = os.tmpname()
  local _, _, code = os.execute("cd " .. quote(dir) .. " && (" .. cmd .. ") >" .. quote(out) .. " 2>&1 </dev/null")
  local text = slurp(out) or ""
  os.remove(out)
  return code == 0, code, text
end

-- The last lines of an output, for a failure's message.
local function tail(text, n)
  local lines = {}
  for l in text:gmatch("[^\n]+") do lines[#lines + 1] = l end
  local from = math.max(1, #lines - (n or 20) + 1)
  return table.concat(lines, "\n", from)
end

-- The commands of a sh block: its "$ " lines, a trailing "\" joining the
-- next line; {cmd=, line=}.
local function commands(b)
  local out, cur = {}, nil
  local i = 0
  for l in b.text:gmatch("([^\n]*)\n") do
    i = i + 1
    if cur then
      cur.cmd = cur.cmd .. "\n" .. l
      if not l:match("\\$") then cur = nil end
    elseif l:match("^%$ ") then
      cur = { cmd = l:sub(3), line = b.line + i }
      out[#out + 1] = cur
      if not l:match("\\$") then cur = nil end
    end
  end
  return out
end

-- run_page(path [, opts]) -> true, {ran = N} | nil, "page:line: message".
-- opts: bin (the luagent executable; default build/luagent), name (the
-- page's name in messages; default path), dir (the scratch folder; default
-- a fresh one, removed after).
function M.run_page(path, opts)
  opts = opts or {}
  local name = opts.name or path
  local text = slurp(path)
  if not text then return nil, name .. ": cannot read the page" end
  local blocks, err = M.blocks(text, name)
  if not blocks then return nil, err end
  local bin = opts.bin or "build/luagent"
  if bin:sub(1, 1) ~= "/" then
    local p = io.popen("pwd")
    bin = p:read("l") .. "/" .. bin
    p:close()
  end
  local bin_dir = bin:match("^(.*)/[^/]*$")
  local dir = opts.dir
  local fresh = not dir
  if fresh then
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. quote(dir)))
  end
  local env = env_prefix(bin_dir)
  local ran = 0
  local function fail(line, fmt, ...)
    if fresh then os.execute("rm -rf " .. quote(dir)) end
    return nil, string.format("%s:%d: " .. fmt, name, line, ...)
  end
  for _, b in ipairs(blocks) do
    if b.file then
      local parent = b.file:match("^(.*)/[^/]*$")
      if parent then os.execute("mkdir -p " .. quote(dir .. "/" .. parent)) end
      local ok, werr = write(dir .. "/" .. b.file, b.text)
      if not ok then return fail(b.line, "cannot write %s: %s", b.file, tostring(werr)) end
    elseif b.norun then -- luacheck: ignore 542
    elseif b.lang == "lua" then
      local file = string.format(".snippet-%d.lua", b.line)
      assert(write(dir .. "/" .. file, b.text))
      ran = ran + 1
      local ok, code, out = sh(dir, env .. " " .. quote(bin) .. " run --mock " .. file)
      if not ok then
        return fail(b.line, "the lua block exited %s (luagent run --mock):\n%s", tostring(code), tail(out))
      end
    elseif b.lang == "sh" then
      for _, c in ipairs(commands(b)) do
        ran = ran + 1
        local ok, code, out = sh(dir, env .. " sh -c " .. quote(c.cmd))
        if not ok then
          return fail(c.line, "'%s' exited %s:\n%s", c.cmd, tostring(code), tail(out))
        end
      end
    end
  end
  if fresh then os.execute("rm -rf " .. quote(dir)) end
  return true, { ran = ran }
end

-- pages(root) -> every docs/**/*.md under root, sorted.
function M.pages(root)
  local p = io.popen("cd " .. quote(root or ".") .. " && find docs -name '*.md' -type f 2>/dev/null | sort")
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

return M
