-- Context compaction: shortening a conversation that no longer fits the
-- model's context window. A policy's on_context_overflow hook returns the
-- shorter message list and the retry loop resends the call once with it
-- (policies/README.md, "Hooks"). A policy file names a strategy shipped
-- here (`on_context_overflow = "drop_oldest"`); Lua code can also call
-- these functions itself or wrap them with its own options.
--
-- Messages are the history entries of lua/luagent/EVENTS.md: {role=
-- "system" | "user" | "assistant" | "tool", ...}. Nothing here changes the
-- list it is given.
local M = {}

-- The user message put first when what is left would start with an
-- assistant message (providers want the conversation to open with the user).
M.marker = "[Earlier messages of this conversation were dropped to fit the context window.]"

-- Groups `messages` into the leading system messages (kept as they are)
-- and units: one message each, except that the tool results after an
-- assistant message join its unit, so a tool call and its result are
-- always kept or dropped together. Returns the number of leading system
-- messages and the list of units ({first, last} indexes).
local function units(messages)
  local n = #messages
  local head = 0
  while head < n and type(messages[head + 1]) == "table" and messages[head + 1].role == "system" do
    head = head + 1
  end
  local out = {}
  local i = head + 1
  while i <= n do
    local j = i
    while j < n and type(messages[j + 1]) == "table" and messages[j + 1].role == "tool" do j = j + 1 end
    out[#out + 1] = { i, j }
    i = j + 1
  end
  return head, out
end

-- Checks a number option: nil gives `default`, anything else must be a
-- number in [lo, hi] (whole when `whole`).
local function option(opts, name, default, lo, hi, whole)
  local v = opts[name]
  if v == nil then return default end
  if type(v) ~= "number" or not (v >= lo and v <= hi) or (whole and v % 1 ~= 0) then
    error(string.format("compact: opts.%s must be a %s from %g to %g (got %s)", name,
      whole and "whole number" or "number", lo, hi, tostring(v)), 3)
  end
  return v
end

-- drop_oldest(messages, [opts]) -> shorter list, number of messages dropped;
-- or nil when nothing can be dropped. Keeps the leading system messages,
-- then drops the oldest units (a message, or an assistant message with its
-- tool results) after them: `fraction` of the units that may go (default
-- 0.5, at least one), never the first `keep_first` (default 0; 1 keeps the
-- first request, often the task) nor the last `keep_last` (default 2).
-- What is left should open with a user message: the assistant messages
-- right after the cut go too while they may, and when one must stay,
-- M.marker is put before it as a user message.
function M.drop_oldest(messages, opts)
  if type(messages) ~= "table" then error("compact.drop_oldest: messages must be a list", 2) end
  opts = opts or {}
  if type(opts) ~= "table" then error("compact.drop_oldest: opts must be a table", 2) end
  local fraction = option(opts, "fraction", 0.5, 0, 1)
  local keep_first = option(opts, "keep_first", 0, 0, math.huge, true)
  local keep_last = option(opts, "keep_last", 2, 0, math.huge, true)
  local head, us = units(messages)
  local droppable = #us - keep_first - keep_last
  if droppable <= 0 then return nil end
  local drop = math.max(1, math.ceil(droppable * fraction))
  local from, to = keep_first + 1, keep_first + drop -- the units that go
  -- what is left should open with the user: the assistant replies right
  -- after the cut go too, while they may
  local function opens_with_user(u) local m = messages[us[u][1]] return type(m) == "table" and m.role == "user" end
  while from == 1 and to < keep_first + droppable and not opens_with_user(to + 1) do to = to + 1 end
  local out = {}
  for i = 1, head do out[#out + 1] = messages[i] end
  for u = 1, #us do
    if u < from or u > to then
      local first, last = us[u][1], us[u][2]
      local opening = #out == head and u > to
      if opening and not opens_with_user(u) then
        out[#out + 1] = { role = "user", content = M.marker }
      end
      for i = first, last do out[#out + 1] = messages[i] end
    end
  end
  return out, us[to][2] - us[from][1] + 1
end

-- Strategies a policy file names in on_context_overflow: name -> function
-- building the hook. The hook receives the retry loop's ctx ({request=,
-- messages=, error=, attempt=}) and returns the shorter list or nil.
M.strategies = {
  drop_oldest = function(opts)
    return function(ctx) return (M.drop_oldest(ctx.messages or ctx.request.messages, opts)) end
  end,
}

-- hook(name, [opts]) -> an on_context_overflow hook for the named strategy.
function M.hook(name, opts)
  local make = M.strategies[name]
  if not make then error("compact.hook: no strategy named '" .. tostring(name) .. "'", 2) end
  return make(opts)
end

return M
