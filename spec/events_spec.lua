-- The event bus (lua/luagent/base/bus.lua): who gets which event in which
-- order, and what happens when a consumer raises: it is removed and
-- reported once, the consumers after it still get the event, and a
-- cancellation goes on to the publisher.
local luagent = require "luagent"
local events = luagent.events
local errors = require "luagent.base.errors"

-- Collects the log's lines while fn runs (the log_sink and log_level
-- settings of the default runtime, restored after).
local function logged(fn)
  local lines = {}
  local old = luagent.configure { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "warn" }
  local ok, err = pcall(fn)
  luagent.configure(old)
  assert(ok, err)
  return lines
end

describe("events.publish", function()
  local stops
  before_each(function() stops = {} end)
  after_each(function() for _, stop in ipairs(stops) do stop() end end)
  local function sub(fn, opts) stops[#stops + 1] = events.subscribe(fn, opts) end

  it("gives annotators every event first, typed consumers their types only", function()
    local seen = {}
    sub(function(ev) seen[#seen + 1] = "all:" .. ev.type end)
    sub(function(ev) seen[#seen + 1] = "typed:" .. ev.type end, { types = { "b" } })
    sub(function(ev)
      ev.note = "annotated"
      seen[#seen + 1] = "annotator:" .. ev.type
    end, { annotate = true, types = { "a", "b" } })
    local ev = { type = "b" }
    events.publish { type = "a" }
    events.publish(ev)
    events.publish { type = "c" }
    assert.same({ "annotator:a", "all:a", "annotator:b", "typed:b", "all:b", "all:c" }, seen)
    assert.equal("annotated", ev.note)
  end)

  it("removes a consumer that raises, reports it once, and still gives the event to the others", function()
    local got, calls = {}, 0
    sub(function(ev) got[#got + 1] = "first:" .. ev.type end)
    sub(function()
      calls = calls + 1
      error("broken consumer")
    end, { types = { "a", "b" } })
    sub(function(ev) got[#got + 1] = "last:" .. ev.type end)
    local lines = logged(function()
      events.publish { type = "a" }
      events.publish { type = "b" } -- gone from every type it asked for
    end)
    assert.equal(1, calls)
    assert.equal(1, #lines)
    assert.matches("an event consumer failed on a a event and was removed: .*broken consumer", lines[1])
    assert.same({ "last:a", "first:a", "last:b", "first:b" }, got)
  end)

  it("blames the consumer that raised, after a publish of its own", function()
    local inner, outer = 0, 0
    sub(function() inner = inner + 1 end, { types = { "inner" } })
    sub(function()
      outer = outer + 1
      events.publish { type = "inner" }
      error("after publishing")
    end, { types = { "outer" } })
    local lines = logged(function()
      events.publish { type = "outer" }
      events.publish { type = "outer" }
      events.publish { type = "inner" }
    end)
    assert.equal(1, outer)
    assert.equal(2, inner)
    assert.equal(1, #lines)
    assert.matches("failed on a outer event", lines[1])
  end)

  it("blames the consumer that raised after waiting while another task published", function()
    luagent.clock.virtual()
    local got = {}
    -- route [P, Q] (the consumer subscribed last runs first)
    sub(function(ev)
      got[#got + 1] = "Q" .. ev.n
      if ev.n == 1 then
        luagent.sleep(0.02)
        error("Q broke")
      end
    end)
    sub(function(ev)
      got[#got + 1] = "P" .. ev.n
      if ev.n == 2 then luagent.sleep(0.03) end -- P waits while Q raises
    end)
    local lines = logged(function()
      local t1 = luagent.spawn(function() events.publish { type = "x", n = 1 } end)
      local t2 = luagent.spawn(function()
        luagent.sleep(0.005)
        events.publish { type = "x", n = 2 }
      end)
      t1:join()
      t2:join()
      events.publish { type = "x", n = 3 }
    end)
    luagent.clock.real()
    assert.equal(1, #lines)
    assert.matches("and was removed: .*Q broke", lines[1])
    -- Q is gone, P stays
    assert.same({ "P1", "Q1", "P2", "Q2", "P3" }, got)
  end)

  it("reports a consumer that raises no message (nil) by what it raised", function()
    sub(function() error(nil) end)
    local lines = logged(function() events.publish { type = "a" } end)
    assert.equal(1, #lines)
    assert.matches("and was removed: nil\"", lines[1])
  end)

  it("removes a consumer that overflows the stack and goes on with the rest", function()
    local got = {}
    sub(function(ev) got[#got + 1] = "last:" .. ev.n end)
    sub(function()
      local function deep(n) return 1 + deep(n + 1) end
      deep(1)
    end)
    sub(function(ev) got[#got + 1] = "first:" .. ev.n end)
    local lines = logged(function()
      events.publish { type = "a", n = 1 }
      events.publish { type = "a", n = 2 }
    end)
    assert.equal(1, #lines)
    assert.matches("stack overflow", lines[1])
    assert.same({ "first:1", "last:1", "first:2", "last:2" }, got)
  end)

  it("reports an error that cannot be printed", function()
    sub(function() error(setmetatable({}, { __tostring = function() error("no") end })) end)
    local after = 0
    sub(function() after = after + 1 end, { types = { "a" } })
    local lines = logged(function() events.publish { type = "a" } end)
    assert.equal(1, #lines)
    assert.matches("an error that cannot be printed", lines[1])
  end)

  it("calls a consumer subscribed twice no more once one subscription raised", function()
    local calls = 0
    local function twice()
      calls = calls + 1
      error("broken")
    end
    sub(twice)
    sub(twice, { types = { "a" } })
    local lines = logged(function() events.publish { type = "a" } end)
    assert.equal(1, calls)
    assert.equal(1, #lines)
  end)

  it("lets a cancellation through to the publisher and keeps the consumer", function()
    local calls, after = 0, 0
    sub(function() after = after + 1 end)
    sub(function()
      calls = calls + 1
      error(errors.new("cancelled", "cancelled"), 0)
    end)
    for _ = 1, 2 do
      local ok, err = pcall(events.publish, { type = "a" })
      assert.is_false(ok)
      assert.is_true(errors.is_cancel(err))
    end
    assert.equal(2, calls)
    assert.equal(0, after) -- subscribed first: it runs after the one that raised
  end)

  it("delivers an event to the consumers there when it was published", function()
    local got = {}
    local stop_b
    sub(function(ev)
      got[#got + 1] = "a:" .. ev.n
      if stop_b then stop_b() stop_b = nil end
    end)
    stop_b = events.subscribe(function(ev) got[#got + 1] = "b:" .. ev.n end)
    -- b was subscribed last, so it runs first: the first event reaches
    -- both, the second only a
    events.publish { type = "x", n = 1 }
    events.publish { type = "x", n = 2 }
    assert.same({ "b:1", "a:1", "a:2" }, got)
  end)
end)

describe("the retry-safe filter", function()
  -- Pushes `evs` (of one call) through a filter, then finishes it; returns
  -- the types released, in order, and the log's lines.
  local function through(evs)
    local out, lines = {}, {}
    local old = luagent.configure { log_level = "warn",
      log_sink = function(lvl, _, record) lines[#lines + 1] = record lines[#lines].lvl = lvl end }
    local ok, err = pcall(function()
      local f = events.retry_safe_filter(function(ev) out[#out + 1] = ev end)
      for _, ev in ipairs(evs) do f:push(ev) end
      f:finish()
    end)
    luagent.configure(old)
    assert(ok, err)
    local types = {}
    for i, ev in ipairs(out) do types[i] = ev.type end
    return table.concat(types, " "), lines, out
  end

  local function start(call) return { type = "message_start", call = call } end
  local function delta(call, text) return { type = "text_delta", call = call, text = text } end

  it("drops an attempt left open when the stream ends, and logs it with the call and attempt", function()
    local types, lines = through { start(7), delta(7, "Hel") }
    assert.equal("", types)
    assert.equal(1, #lines)
    assert.equal("warn", lines[1].lvl)
    assert.equal("retry-safe: dropped attempt 1 of call 7, left open: the stream ended before its message_end",
      lines[1].msg)
    assert.equal(7, lines[1].call)
    assert.equal(1, lines[1].attempt)
  end)

  it("drops and logs an attempt left open when a retry or another attempt starts before it ends", function()
    local types, lines = through { start(3), delta(3, "a"), { type = "provider_retry", call = 3, attempt = 1 },
      start(3), delta(3, "b"), start(3), delta(3, "c"),
      { type = "message_end", call = 3, stop_reason = "stop", message = { content = "c" } } }
    assert.equal("provider_retry message_start text_delta message_end", types)
    assert.equal(2, #lines)
    assert.equal("retry-safe: dropped attempt 1 of call 3, left open: a retry started before its message_end",
      lines[1].msg)
    assert.equal("retry-safe: dropped attempt 2 of call 3, left open: another attempt started before its message_end",
      lines[2].msg)
    assert.same({ 3, 2 }, { lines[2].call, lines[2].attempt })
  end)

  it("releases an aborted attempt as its start and end, without deltas; the end keeps the text", function()
    local types, lines, out = through { start(4), delta(4, "Hello"), delta(4, " wor"),
      { type = "message_end", call = 4, stop_reason = "aborted", final = true,
        message = { role = "assistant", content = "Hello wor", incomplete = true } } }
    assert.equal("message_start message_end", types)
    assert.equal("Hello wor", out[2].message.content)
    assert.equal(0, #lines)
  end)
end)
