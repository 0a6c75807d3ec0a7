-- Busted output handler for `make test`: a dot per test, the details of every
-- failure and error, the reason of every skipped spec, and one closing line
-- "N passed, N failed[, N skipped]"
-- (errors count as failures: a spec that crashed did not pass).
local pretty = require "pl.pretty"

return function(options)
  local busted = require "busted"
  local handler = require "busted.outputHandlers.base"()
  local marks = { success = ".", pending = "s", failure = "F", error = "E" }

  local function describe(item, label)
    local where = item.element and item.element.trace
    local msg = item.message
    if type(msg) ~= "string" then msg = msg == nil and "nil error" or pretty.write(msg) end
    local out = { "", label .. ": " .. (item.name or "?") }
    if where and where.short_src then
      out[#out + 1] = "  at " .. where.short_src .. ":" .. tostring(where.currentline)
    end
    out[#out + 1] = "  " .. msg:gsub("\n", "\n  ")
    if options.verbose and item.trace and item.trace.traceback then
      out[#out + 1] = item.trace.traceback
    end
    return table.concat(out, "\n")
  end

  handler.testEnd = function(element, parent, status)
    io.write(marks[status] or "?")
    io.flush()
    return nil, true
  end

  handler.suiteEnd = function()
    io.write("\n")
    for _, f in ipairs(handler.failures) do io.write(describe(f, "FAILED"), "\n") end
    for _, e in ipairs(handler.errors) do io.write(describe(e, "ERROR"), "\n") end
    -- a skipped spec says why (a peer not installed, ...)
    for _, p in ipairs(handler.pendings) do
      io.write("SKIPPED: ", tostring(p.name), type(p.message) == "string" and (": " .. p.message) or "", "\n")
    end
    local failed = handler.failuresCount + handler.errorsCount
    local line = string.format("%d passed, %d failed", handler.successesCount, failed)
    if handler.pendingsCount > 0 then
      line = line .. string.format(", %d skipped", handler.pendingsCount)
    end
    io.write(string.format("(%.1f s)\n", handler.getDuration()))
    io.write(line, "\n")
    io.flush()
    return nil, true
  end

  handler.fileError = function()
    io.write("E")
    io.flush()
    return nil, true
  end

  busted.subscribe({ "test", "end" }, handler.testEnd, { predicate = handler.cancelOnPending })
  busted.subscribe({ "suite", "end" }, handler.suiteEnd)
  busted.subscribe({ "error", "file" }, handler.fileError)
  busted.subscribe({ "failure", "file" }, handler.fileError)
  return handler
end
