-- Nothing of a running host lives in module upvalues (issue 25): the state
-- of a running host hangs off its runtime (lua/luagent/runtime.lua), so two
-- runtimes in one process share nothing they did not mean to share.
--
-- Read from the source of every library module (lua/luagent/**, the test
-- bench mock/ and sim/ aside): a variable of the module's top level (a
-- `local` outside any function, the module table M among them) that a
-- function assigns is state that changes at run time, and it is shared by
-- every runtime of the process. Assigning means any of
--   NAME = v          NAME.x = v      NAME[k] = v      NAME.a[k].b = v
--   function NAME.f() ... end          (inside a function)
--   table.insert(NAME, v)  table.remove(NAME)  table.sort(NAME)  rawset(NAME, k, v)
-- (and the same with a field, table.insert(NAME.list, v)), also through a
-- function's local bound to it (local list = M.fields; list[#list + 1] = v);
-- an assignment to an undeclared name (a global) inside a function counts
-- too. What the top
-- level does as the file loads (filling a constant table, M.f = function)
-- is not run-time state. A method call on a module-level object (x:set())
-- cannot be told from a read, and is not seen.
--
-- What is process-wide on purpose is in MODULE_STATE_OK below, each entry
-- with its reason; an entry that no longer matches anything fails, so the
-- list does not outlive what it excuses.
--
-- How it is read: the lexer of spec/layers_spec.lua (spec/support/lua_lex.lua)
-- and a parser that follows blocks, brackets and scopes (locals, parameters,
-- loop variables, `self`), so a local or a parameter that shadows a
-- module-level name is not taken for it, and `{ key = v }` is not an
-- assignment.

local lex = require "spec.support.lua_lex"

local ROOT = "lua/luagent"

-- The allow-list: module-level variables that functions may assign, because
-- they are process-wide by design. path and name name the variable: a
-- module-level local or global (registered), or one field of it (M.kinds:
-- writes to that field only); why says why it is not a runtime's. An entry
-- whose why starts with "TODO(issue 25)" is state still to be moved onto the
-- runtime, or a decision still to take (none today).
local B = ROOT .. "/base/"
local MODULE_STATE_OK = {
  -- Registered keys: a key any runtime registered is scrubbed from every
  -- output of the process (over-scrubbing never leaks; a key left out of one
  -- runtime's scrubber would). The C scrubber they feed (scrubber:add) is a
  -- method call, not seen here, and is the same registry.
  { path = B .. "secrets.lua", name = "registered",
    why = "the keys registered by any runtime: scrubbed from every output of the process, on purpose" },
  { path = B .. "secrets.lua", name = "nforms", why = "the count of registered keys (see registered)" },
  { path = B .. "secrets.lua", name = "M.margin",
    why = "the longest form of a registered key, how far a cut body is read on (see registered)" },

  -- The registry of wire formats: code, like package.loaded. An adapter
  -- registers once, and what it adds (its kinds, error codes, overflow
  -- phrases, the headers a cassette never writes, the fields a replay
  -- compares) is the same for every runtime.
  { path = ROOT .. "/model/provider.lua", name = "adapters", why = "the registered adapters (wire formats): code" },
  { path = ROOT .. "/model/provider.lua", name = "by_name", why = "the registered adapters by name: code" },
  { path = ROOT .. "/model/provider.lua", name = "M.kinds", why = "the provider kinds the adapters registered: code" },
  { path = ROOT .. "/model/provider.lua", name = "M.wire",
    why = "what the registered adapters add to the classifier's lists: code" },
  { path = B .. "cassette.lua", name = "M.secret_headers",
    why = "the headers a registered adapter says carry keys (provider.register): code" },
  { path = B .. "cassette.lua", name = "M.compared_fields",
    why = "the body fields a registered adapter says a replay compares (provider.register): code" },

  -- Weak-keyed tables of per-object private data: the state is the
  -- object's (it goes with it), kept off the object so that it cannot leak
  -- or be encoded.
  { path = ROOT .. "/model/provider.lua", name = "keys",
    why = "weak-keyed: each provider's key, off the object so printing or encoding it cannot reveal it" },
  { path = B .. "json.lua", name = "key_order",
    why = "weak-keyed: the key order of each table json.object made, the table's own" },

  -- A call's own option held for the length of the call.
  { path = B .. "json.lua", name = "nonfinite",
    why = "json.encode's opts.nonfinite, set and reset around one encode (nothing in it yields): no call sees another's" },

  -- The composition root's own, one per process by design.
  { path = ROOT .. "/init.lua", name = "default",
    why = "the face's default runtime, made on first use (luagent.default_runtime): what luagent.stream{...} etc. use" },
  { path = ROOT .. "/cli/init.lua", name = "M.root",
    why = "the executable's install directory (where its policies/ are), given once to main by host/main.c" },
  { path = ROOT .. "/cli/init.lua", name = "_G.arg",
    why = "`luagent run FILE args`: the script's arguments, the global `arg` as lua(1) sets it; one script per process" },
  { path = ROOT .. "/cli/init.lua", name = "os.exit",
    why = "`luagent run`: a script's os.exit ends its run first (outputs written, claim let go), restored after the run" },
}

-- Scanning ----------------------------------------------------------------

local KEYWORDS = {}
for w in ([[and break do else elseif end false for function goto if in local nil not or repeat return then
  true until while]]):gmatch("%a+") do KEYWORDS[w] = true end

local MUTATORS = { insert = true, remove = true, sort = true }

local function is_op(tok, v) return tok ~= nil and tok.t == "op" and tok.v == v end
local function is_name(tok, v) return tok ~= nil and tok.t == "name" and (v == nil or tok.v == v) end

-- scan(src) -> { writes = { {name=, line=, decl=, fn=, how=} }, balanced = bool }.
-- decl is the line declaring the module-level local, or nil for a global; fn
-- the name of the function doing the write; how the form of the write.
local function scan(src)
  local toks = lex(src)
  local writes = {}
  -- The stack of what is open: the chunk, blocks and functions (each with
  -- its scope: name -> line declared), and brackets ( [ {; fnnames the
  -- names of the functions open, innermost last.
  local chunk = { kind = "chunk", scope = {}, infn = false }
  local stack, fnnames, pending_do = { chunk }, {}, 0
  local skip = {} -- token indexes that declare a name (local, parameter, loop variable)

  local function top() return stack[#stack] end
  local function in_function() return #fnnames > 0 end
  local function push_block(kind)
    stack[#stack + 1] = { kind = kind, scope = {}, infn = in_function() }
    return stack[#stack]
  end
  local function scope_of_top()
    for i = #stack, 1, -1 do
      if stack[i].scope then return stack[i].scope end
    end
  end
  -- A scope maps a name to the line declaring it, or, for a function's
  -- local bound to a module-level table (local list = M.fields), to
  -- { line =, of = the module-level name, decl = its line }: writing into
  -- the alias writes into the module's table.
  -- resolve(name) -> "module", line | "local"[, alias] | "global"
  local function resolve(name)
    for i = #stack, 1, -1 do
      local e = stack[i]
      local d = e.scope and e.scope[name]
      if d then
        if e.infn then return "local", type(d) == "table" and d or nil, e.scope end
        return "module", d
      end
    end
    return "global"
  end
  -- the field named after the name at toks[at] (M.field...), or nil
  local function field_after(at)
    return is_op(toks[at + 1], ".") and is_name(toks[at + 2]) and toks[at + 2].v or nil
  end
  -- record(at, how, into): a write to the name at toks[at] (into: into a
  -- field of it, not the name itself). A write's var is the name, or the
  -- name and its first field (M.kinds) when there is one.
  local function record(at, how, into)
    if not in_function() then return end -- the file loading: not run-time state
    local name, field = toks[at].v, field_after(at)
    local where, decl, scope = resolve(name)
    if where == "local" then
      -- the alias bound to another table: its writes are no longer the module's
      if decl and not into then scope[name] = decl.line end
      if not (decl and into) then return end
      name, field, how = decl.of, decl.field or field, how .. ", through the local " .. name
      decl = decl.decl
    end
    writes[#writes + 1] = { name = name, var = field and name .. "." .. field or name, line = toks[at].line,
      decl = decl, fn = fnnames[#fnnames], how = how }
  end

  -- the index after the bracket matching toks[j] ("[" or "(")
  local function after_match(j)
    local open, close = toks[j].v, toks[j].v == "[" and "]" or ")"
    local depth = 0
    while toks[j] do
      if is_op(toks[j], open) then depth = depth + 1
      elseif is_op(toks[j], close) then
        depth = depth - 1
        if depth == 0 then return j + 1 end
      end
      j = j + 1
    end
    return j
  end
  -- the index after a chain of fields from toks[j] (.x, [k])
  local function after_chain(j)
    while true do
      if is_op(toks[j], ".") and is_name(toks[j + 1]) then j = j + 2
      elseif is_op(toks[j], "[") then j = after_match(j)
      else return j end
    end
  end
  -- toks[k], a name, heads the target of an assignment: NAME chain
  -- [, target]* =. Returns the form of the write and whether it writes into
  -- a field (not the name itself), or nil.
  local function assigned(k)
    local j = after_chain(k + 1)
    local into = j > k + 1
    local text = {}
    for i = k, j - 1 do text[#text + 1] = toks[i].t == "string" and string.format("%q", toks[i].v) or toks[i].v end
    local how = table.concat(text):gsub("^(" .. ("."):rep(40) .. ").+$", "%1...") .. " = ..."
    while is_op(toks[j], ",") and is_name(toks[j + 1]) and not KEYWORDS[toks[j + 1].v] do
      j = after_chain(j + 2)
    end
    if is_op(toks[j], "=") then return how, into end
  end

  -- whether `tok` may follow `local a = NAME.x` whose right-hand side is
  -- just that: a name starting the next statement, `;`, the end
  local CONTINUES = { ["and"] = true, ["or"] = true }
  local function ends_expression(tok)
    if tok == nil or is_op(tok, ";") then return true end
    return tok.t == "name" and not CONTINUES[tok.v]
  end

  -- declare the names of a `local` statement starting at toks[k]
  local function declare_locals(k)
    local scope, j = scope_of_top(), k + 1
    -- local a = NAME[.x...]: an alias when NAME is module-level (or one)
    local alias
    if is_name(toks[j]) and is_op(toks[j + 1], "=") and is_name(toks[j + 2]) and not KEYWORDS[toks[j + 2].v]
        and ends_expression(toks[after_chain(j + 3)]) and in_function() then
      local where, decl = resolve(toks[j + 2].v)
      if where == "module" then
        alias = { line = toks[j].line, of = toks[j + 2].v, decl = decl, field = field_after(j + 2) }
      elseif where == "local" and decl then
        alias = { line = toks[j].line, of = decl.of, decl = decl.decl, field = decl.field or field_after(j + 2) }
      end
    end
    while is_name(toks[j]) do
      scope[toks[j].v], skip[j] = alias or toks[j].line, true
      j = j + 1
      if is_op(toks[j], "<") then j = j + 3 end -- <const>, <close>
      if not is_op(toks[j], ",") then break end
      j = j + 1
    end
  end

  -- a function's header at toks[k] (the keyword): its name, its parameters;
  -- returns the index of the header's last token
  local function open_function(k)
    local name, j, method = nil, k + 1, false
    local local_fn = is_name(toks[k - 1], "local")
    if is_name(toks[j]) then
      local j0, parts = j, { toks[j].v }
      j = j + 1
      while (is_op(toks[j], ".") or is_op(toks[j], ":")) and is_name(toks[j + 1]) do
        method = method or toks[j].v == ":"
        parts[#parts + 1] = toks[j].v .. toks[j + 1].v
        j = j + 2
      end
      name = table.concat(parts)
      if not local_fn then record(j0, "function " .. name .. "()", #parts > 1) end
    elseif is_op(toks[k - 1], "=") and is_name(toks[k - 2]) then
      local parts, i = { toks[k - 2].v }, k - 3
      while is_op(toks[i], ".") and is_name(toks[i - 1]) do
        table.insert(parts, 1, toks[i - 1].v .. ".")
        i = i - 2
      end
      name = table.concat(parts)
    end
    local f = push_block("function")
    f.infn = true
    fnnames[#fnnames + 1] = name or "(anonymous)"
    if method then f.scope.self = toks[k].line end
    if is_op(toks[j], "(") then
      j = j + 1
      while toks[j] and not is_op(toks[j], ")") do
        if is_name(toks[j]) then f.scope[toks[j].v], skip[j] = toks[j].line, true end
        j = j + 1
      end
    end
    return j
  end

  local k = 1
  while toks[k] do
    local tok, prev = toks[k], toks[k - 1]
    if tok.t == "op" then
      local v = tok.v
      if v == "(" or v == "[" or v == "{" then
        stack[#stack + 1] = { kind = v }
      elseif v == ")" or v == "]" or v == "}" then
        if not top().scope then stack[#stack] = nil end
      end
    elseif tok.t == "name" and not (is_op(prev, ".") or is_op(prev, ":") or is_op(prev, "::")) then
      local v = tok.v
      if v == "local" then
        if not is_name(toks[k + 1], "function") then declare_locals(k)
        else scope_of_top()[toks[k + 2].v], skip[k + 2] = toks[k + 2].line, true end
      elseif v == "function" then
        k = open_function(k)
      elseif v == "if" or v == "repeat" then
        push_block(v)
      elseif v == "elseif" or v == "else" then
        if top().kind == "if" then top().scope = {} end
      elseif v == "while" or v == "for" then
        local b = push_block(v)
        pending_do = pending_do + 1
        if v == "for" then
          local j = k + 1
          while is_name(toks[j]) or is_op(toks[j], ",") do
            if is_name(toks[j]) then b.scope[toks[j].v], skip[j] = toks[j].line, true end
            j = j + 1
          end
        end
      elseif v == "do" then
        if pending_do > 0 then pending_do = pending_do - 1 else push_block("do") end
      elseif v == "end" or v == "until" then
        while #stack > 1 and not top().scope do stack[#stack] = nil end -- brackets left open: not Lua
        local b = top()
        if #stack > 1 then stack[#stack] = nil end
        if b.kind == "function" then fnnames[#fnnames] = nil end
      elseif v == "table" and is_op(toks[k + 1], ".") and is_name(toks[k + 2]) and MUTATORS[toks[k + 2].v]
          and is_op(toks[k + 3], "(") and is_name(toks[k + 4]) then
        record(k + 4, "table." .. toks[k + 2].v .. "(" .. toks[k + 4].v .. ", ...)", true)
      elseif v == "rawset" and is_op(toks[k + 1], "(") and is_name(toks[k + 2]) then
        record(k + 2, "rawset(" .. toks[k + 2].v .. ", ...)", true)
      elseif not KEYWORDS[v] and not skip[k] and top().scope and not is_op(prev, "goto") then
        -- a statement can start here only outside brackets ({ key = v } is a field)
        local how, into = assigned(k)
        if how then record(k, how, into) end
      end
    end
    k = k + 1
  end
  return { writes = writes, balanced = #stack == 1 and #fnnames == 0 and pending_do == 0 }
end

-- The tree ------------------------------------------------------------------

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local paths = {}
do
  local p = io.popen("find " .. ROOT .. " -name '*.lua' | sort")
  for path in p:lines() do
    if not path:find("^" .. ROOT .. "/mock/") and not path:find("^" .. ROOT .. "/sim/") then
      paths[#paths + 1] = path
    end
  end
  p:close()
end

local scans = {}
for _, path in ipairs(paths) do scans[path] = scan(read(path)) end

local function allowed(path, w)
  for _, ok in ipairs(MODULE_STATE_OK) do
    if ok.path == path and (ok.name == w.name or ok.name == w.var) then return ok end
  end
end

local function describe_write(path, w)
  return string.format("%s:%d: %s (%s) assigned in %s: %s", path, w.line, w.var,
    w.decl and "module-level, declared at line " .. w.decl or "a global", w.fn, w.how)
end

describe("module-level state in lua/luagent", function()
  it("is read by parsing: scopes, shadowing, fields and the forms of a write", function()
    local src = table.concat({
      'local M = {}',                                          -- 1
      'local cache, count = {}, 0',                            -- 2
      'local CONST = { a = 1 }',                               -- 3
      'CONST.b = 2  -- the file loading: not run-time state',  -- 4
      'function M.f(cache) cache.x = 1 end  -- a parameter',   -- 5
      'function M.g() count = count + 1 end',                  -- 6
      'local function h() local count = 0; count = 1; return { count = 2, cache = 3 } end', -- 7
      'M.i = function() cache[#cache + 1] = 1 end',            -- 8
      'function M.j() table.insert(M.list, 1) end',            -- 9
      'function M:k() self.x = 1; M.state = "s" end',          -- 10
      'local s = "count = 1" --[[ count = 2 ]]',               -- 11
      'function M.l() for count in pairs(CONST) do count = 1 end end', -- 12
      'function M.m() x, CONST.c = 1, 2 end',                  -- 13
      'do local inner = {} function M.n() inner[1] = 1; function M.late() end end end', -- 14
      'function M.o() local t <const> = {}; t.x = 1; if a then local CONST = 1 else CONST = 2 end end', -- 15
      'function M.p() local l = M.list local n = l.x; n[1] = 1; l = {}; local c = M.f(); c.x = 1 end', -- 16
      'function M.q() local v = cache or {}; v.x = 1; local w = CONST table.insert(w, 1) end', -- 17
      'function M.r() local k = cache; k = {}; k[1] = 1 end', -- 18
      'return M',
    }, "\n")
    local sc = scan(src)
    local got = {}
    for _, w in ipairs(sc.writes) do
      got[#got + 1] = w.line .. " " .. w.var .. " " .. tostring(w.decl) .. " " .. w.fn
    end
    assert.same({
      "6 count 2 M.g",
      "8 cache 2 M.i",
      "9 M.list 1 M.j",
      "10 M.state 1 M:k",
      "13 x nil M.m",
      "13 CONST.c 3 M.m",
      "14 inner 14 M.n",
      "14 M.late 1 M.n",
      "15 CONST 3 M.o",
      "16 M.list 1 M.p",
      "17 CONST 3 M.q",
    }, got)
    assert.truthy(sc.balanced)
  end)

  it("parses every library module to the end, blocks balanced", function()
    local bad = {}
    for _, path in ipairs(paths) do
      if not scans[path].balanced then bad[#bad + 1] = path end
    end
    assert.same({}, bad)
    assert.truthy(scans[ROOT .. "/runtime.lua"], "runtime.lua is scanned")
  end)

  it("has no module-level state assigned at run time but what MODULE_STATE_OK names", function()
    local bad = {}
    for _, path in ipairs(paths) do
      for _, w in ipairs(scans[path].writes) do
        if not allowed(path, w) then bad[#bad + 1] = describe_write(path, w) end
      end
    end
    assert(#bad == 0, "state of a running host lives in module upvalues; hang it off the runtime"
      .. " (lua/luagent/runtime.lua), or, if it is process-wide by design, name it in MODULE_STATE_OK"
      .. " (spec/module_state_spec.lua) with the reason:\n  " .. table.concat(bad, "\n  ")
      .. "\n(" .. #bad .. (#bad == 1 and " write)" or " writes)"))
  end)

  it("keeps MODULE_STATE_OK to what is still there, each entry with its reason", function()
    local bad = {}
    for _, ok in ipairs(MODULE_STATE_OK) do
      local used = false
      for _, w in ipairs(scans[ok.path] and scans[ok.path].writes or {}) do
        if w.name == ok.name or w.var == ok.name then used = true end
      end
      if not used then bad[#bad + 1] = ok.path .. ": " .. ok.name .. " is no longer assigned at run time: drop its entry" end
      if type(ok.why) ~= "string" or #ok.why < 10 then bad[#bad + 1] = ok.path .. ": " .. ok.name .. " has no reason" end
    end
    assert(#bad == 0, "MODULE_STATE_OK:\n  " .. table.concat(bad, "\n  "))
  end)
end)
