-- luagent.fs: read, write, list and stat on the libuv loop (host/fs.c,
-- host/fs_lua.c): real files in a scratch folder; failures as records that
-- name the path; a task waiting on a file lets the others run; a
-- cancellation (an agent's abort) ends the wait at once.
local luagent = require "luagent"
local core = require "luagent.core"
local helpers = require "helpers"

local fs = luagent.fs
local dir

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

before_each(function() dir = helpers.tempdir() end)
after_each(function() os.execute("chmod -R u+rwx " .. helpers.quote(dir) .. "; rm -rf " .. helpers.quote(dir)) end)

-- How many descriptors this process has open on `path`.
local function open_on(path)
  local f = assert(io.open("/proc/self/stat"))
  local pid = f:read("a"):match("^%d+")
  f:close()
  local n = 0
  local ls = assert(io.popen("ls -l /proc/" .. pid .. "/fd"))
  for line in ls:lines() do
    if line:sub(-#path - 4) == " -> " .. path then n = n + 1 end
  end
  ls:close()
  return n
end

-- Waits (on the loop) until no fs operation is held in flight any more.
local function settle()
  for _ = 1, 2000 do
    if core.stats().held == 0 then return end
    core.sleep(0.005)
  end
  error("an fs operation stayed in flight")
end

describe("luagent.fs", function()
  it("reads, writes (and appends), lists sorted with types, and stats", function()
    assert.is_true(fs.write(dir .. "/a.txt", "hello"))
    assert.is_true(fs.write(dir .. "/a.txt", ", world\n", { append = true }))
    assert.equal("hello, world\n", fs.read(dir .. "/a.txt"))
    assert.is_true(fs.write(dir .. "/a.txt", "new")) -- truncates
    assert.equal("new", fs.read(dir .. "/a.txt"))
    assert.equal("", (fs.write(dir .. "/empty", "") and fs.read(dir .. "/empty")))
    os.execute("mkdir " .. helpers.quote(dir .. "/sub") .. " && ln -s a.txt " .. helpers.quote(dir .. "/link"))
    local list = assert(fs.list(dir))
    assert.same({ { name = "a.txt", type = "file" }, { name = "empty", type = "file" },
                  { name = "link", type = "link" }, { name = "sub", type = "directory" } }, list)
    local st = assert(fs.stat(dir .. "/a.txt"))
    assert.equal("file", st.type)
    assert.equal(3, st.size)
    assert.is_true(math.abs(st.mtime - os.time()) < 60)
    assert.equal("directory", fs.stat(dir .. "/sub").type)
    assert.equal("file", fs.stat(dir .. "/link").type) -- stat follows links; list does not
    assert.same({}, fs.list(dir .. "/sub"))
    -- bytes as they are
    local bytes = "\0\1\2\255 x\r\n"
    assert.is_true(fs.write(dir .. "/bin", bytes))
    assert.equal(bytes, fs.read(dir .. "/bin"))
  end)

  it("returns a record naming the path for a missing file, a folder given to read, a file given to list", function()
    local missing = dir .. "/nope.txt"
    local none, err = fs.read(missing)
    assert.is_nil(none)
    assert.equal("fs", err.kind)
    assert.equal("missing", err.reason)
    assert.equal(missing, err.path)
    assert.equal("read", err.op)
    assert.equal("ENOENT", err.code)
    assert.matches(missing, err.message, 1, true)
    -- the kind, then the message: what could not be done to which path
    assert.equal("fs: cannot read '" .. missing .. "': no such file or directory", tostring(err))
    assert.equal("missing", select(2, fs.stat(missing)).reason)
    assert.equal("missing", select(2, fs.list(missing)).reason)
    assert.equal("missing", select(2, fs.write(dir .. "/no/such/dir/x", "y")).reason)

    local _, derr = fs.read(dir)
    assert.equal("directory", derr.reason)
    assert.matches(dir, derr.message, 1, true)
    assert.matches("is a folder", derr.message, 1, true)
    assert.equal("fs: cannot read '" .. dir .. "': it is a folder, not a file", tostring(derr))
    assert.equal("directory", select(2, fs.write(dir, "x")).reason)

    write(dir .. "/f", "x")
    local _, lerr = fs.list(dir .. "/f")
    assert.equal("not_directory", lerr.reason)
    assert.matches(dir .. "/f", lerr.message, 1, true)
    assert.equal("fs: cannot list '" .. dir .. "/f': not a directory", tostring(lerr))

    -- a FIFO is refused unread: it would hold a thread of the pool for good
    os.execute("mkfifo " .. helpers.quote(dir .. "/fifo"))
    local _, ferr = fs.read(dir .. "/fifo")
    assert.equal("not_regular", ferr.reason)
    assert.matches("FIFO", ferr.message, 1, true)
    assert.equal("fifo", fs.stat(dir .. "/fifo").type)
    -- nor written, nor a device opened: opening some has effects
    assert.equal("not_regular", select(2, fs.write(dir .. "/fifo", "x")).reason)
    local _, nerr = fs.write("/dev/null", "x")
    assert.equal("not_regular", nerr.reason)
    assert.matches("a character device", nerr.message, 1, true)
    assert.equal("fs: cannot write '/dev/null': it is not a regular file (a character device)", tostring(nerr))
    assert.equal("char_device", fs.stat("/dev/null").type)
  end)

  it("returns permission_denied for a file it may not read or write", function()
    local secret = dir .. "/secret"
    write(secret, "s")
    os.execute("chmod 000 " .. helpers.quote(secret) .. " && chmod 755 " .. helpers.quote(dir))
    local script = [[
      local fs = require("luagent").fs
      local _, r = fs.read(arg[1])
      local _, w = fs.write(arg[1], "x")
      local _, c = fs.write(arg[2] .. "/new", "x")
      io.write(r.reason, " ", r.code, " ", w.reason, " ", c.reason, "\n", r.message, "\n")
    ]]
    local r
    local id = io.popen("id -u")
    local root = id:read("l") == "0"
    id:close()
    if root then
      -- root reads everything: the case runs as nobody
      os.execute("chmod 555 " .. helpers.quote(dir))
      local path = helpers.tempfile(script, ".lua")
      os.execute("chmod 644 " .. helpers.quote(path))
      local out = os.tmpname()
      os.execute("setpriv --reuid=65534 --regid=65534 --clear-groups " .. helpers.quote(helpers.bin) .. " run "
        .. helpers.quote(path) .. " " .. helpers.quote(secret) .. " " .. helpers.quote(dir) .. " >" .. out .. " 2>&1")
      r = helpers.slurp(out)
      os.remove(out)
      os.remove(path)
    else
      os.execute("chmod 555 " .. helpers.quote(dir))
      r = helpers.run_script(script, secret, dir).stdout
    end
    assert.matches("^permission_denied EACCES permission_denied permission_denied\n", r)
    assert.matches(secret, r, 1, true)
  end)

  it("reads and writes a large file whole, bounded by max_bytes", function()
    local big = string.rep("0123456789abcdef", 512 * 1024) -- 8 MiB
    assert.is_true(fs.write(dir .. "/big", big))
    assert.equal(#big, fs.stat(dir .. "/big").size)
    local back = assert(fs.read(dir .. "/big"))
    assert.equal(#big, #back)
    assert.is_true(back == big)
    local none, err = fs.read(dir .. "/big", { max_bytes = 1024 })
    assert.is_nil(none)
    assert.equal("too_large", err.reason)
    assert.matches(dir .. "/big", err.message, 1, true)
    assert.equal(#big, #assert(fs.read(dir .. "/big", { max_bytes = #big })))
    -- a file that reports no size (procfs) is read to its end
    assert.matches("^%d", assert(fs.read("/proc/self/stat")))
  end)

  it("does not hold the loop: other tasks run while a task waits on a file", function()
    local big = string.rep("x", 4 * 1024 * 1024)
    write(dir .. "/big", big)
    local other_ran, seen_before_end
    local reader = core.spawn(function()
      local text = assert(fs.read(dir .. "/big"))
      seen_before_end = other_ran
      return #text
    end)
    core.spawn(function() other_ran = true end)
    assert.equal(#big, reader:join())
    assert.is_true(seen_before_end)
  end)

  it("raises for misuse: a path that is not a string, an unknown option", function()
    assert.has_error(function() fs.read(42) end, "fs.read: path must be a string (got number)")
    assert.has_error(function() fs.read(dir .. "/x", { max_byte = 3 }) end,
      "fs.read: unknown option 'max_byte' (fs.read takes max_bytes)")
    assert.has_error(function() fs.write(dir .. "/x", 3) end, "fs.write: data must be a string (got number)")
    assert.has_error(function() fs.write(dir .. "/x", "d", { apend = true }) end,
      "fs.write: unknown option 'apend' (fs.write takes append)")
    assert.has_error(function() fs.list(nil) end, "fs.list: path must be a string (got nil)")
    assert.has_error(function() fs.stat(dir .. "/a\0b") end, "fs.stat: path must not hold a NUL byte")
  end)

  it("ends a wait at once when its task is cancelled, and lets go of the operation", function()
    write(dir .. "/big", string.rep("y", 16 * 1024 * 1024))
    local reads, raised = 0, nil
    local t = core.spawn(function()
      local ok, err = pcall(function()
        while true do
          reads = reads + 1
          assert(fs.read(dir .. "/big"))
        end
      end)
      raised = err
      error(err, 0)
    end)
    core.spawn(function()
      while reads < 2 do coroutine.yield() end
      t:cancel("stop reading")
    end)
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    assert.equal("cancelled", raised.kind)
    settle()
    assert.equal(0, open_on(dir .. "/big"), "the abandoned read's descriptor was closed")
  end)

  it("closes the descriptor of an operation abandoned at any step", function()
    -- cancelled after 0, 1, 2, ... loop passes: at the stat, the open, the
    -- read, the close; none may leave the file open
    write(dir .. "/big", string.rep("v", 4 * 1024 * 1024))
    write(dir .. "/out", "")
    for passes = 0, 60 do
      for _, op in ipairs { function() fs.read(dir .. "/big") end,
                            function() fs.write(dir .. "/out", string.rep("w", 1024 * 1024)) end } do
        local t = core.spawn(op)
        for _ = 1, passes do coroutine.yield() end
        t:cancel("stop")
        pcall(t.join, t)
      end
    end
    settle()
    assert.equal(0, open_on(dir .. "/big"), "no abandoned read left its file open")
    assert.equal(0, open_on(dir .. "/out"), "no abandoned write left its file open")
  end)

  it("is cancelled with a Lua tool when its agent is aborted", function()
    local mock = require "luagent.mock"
    write(dir .. "/big", string.rep("z", 16 * 1024 * 1024))
    local srv = assert(mock.start { seed = 1, script = function(_, n)
      if n == 1 then return { tools = { { id = "1", name = "slurp", arguments = {} } } } end
      return { text = "done" }
    end })
    local reading, seen = false, nil
    local slurp = { name = "slurp", description = "reads a big file again and again", read_only = true,
      run = function()
        local ok, err = pcall(function()
          while true do
            reading = true
            assert(luagent.fs.read(dir .. "/big"))
          end
        end)
        seen = err
        error(err, 0)
      end }
    local a = luagent.agent { model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" },
      tools = { slurp }, policy = { tool = { timeout = 60 } } }
    core.spawn(function()
      while not reading do coroutine.yield() end
      coroutine.yield()
      a:abort("enough")
    end)
    local _, last = helpers.drain(a, "go")
    srv:close()
    assert.equal("aborted", last.stop_reason)
    assert.equal("cancelled", seen.kind)
    settle()
  end)

  it("is reachable from a tool file, and its waits count against the tool's timeout as waits", function()
    local tools = require "luagent.agent.tools"
    local policy = require "luagent.model.policy"
    write(dir .. "/big", string.rep("w", 8 * 1024 * 1024))
    os.execute("mkdir " .. helpers.quote(dir .. "/tools"))
    write(dir .. "/tools/reader.lua", [[
      local luagent = require "luagent"
      local big = (...):match("^(.*)/tools/[^/]*$") .. "/big"
      return {
        { name = "size", description = "the size of a file, and what wc says", read_only = true,
          params = { type = "object", properties = { path = { type = "string" } } },
          run = function(args)
            local st = assert(luagent.fs.stat(args.path))
            local r = assert(luagent.exec { argv = { "wc", "-c", args.path } })
            return st.size .. " " .. r.stdout:match("^%d+")
          end },
        { name = "forever", description = "reads for ever", read_only = true, timeout = 0.3,
          run = function() while true do assert(luagent.fs.read(big)) end end },
      }
    ]])
    local set = assert(tools.dir(dir .. "/tools", { watch = false }))
    local t = set:snapshot().tools
    local pol = policy.tool_section { max_retries = 0, grace = 5 }
    local out = tools.execute(t.size, { id = "1", name = "size", arguments = { path = dir .. "/big" } }, { policy = pol })
    assert.equal("8388608 8388608", out.content)
    local t0 = core.now()
    out = tools.execute(t.forever, { id = "2", name = "forever", arguments = {} }, { policy = pol })
    -- at its timeout (cancelled at a wait, or stopped on the wall clock
    -- as it resumed), not after the grace, nor never: the waits count
    assert.equal("tool_timeout", out.error.kind)
    assert.is_true(core.now() - t0 < 3, "it ended at its timeout, not at the grace")
    settle()
  end)
end)
