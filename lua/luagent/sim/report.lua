-- luagent.sim.report: a simulation's result as a table for the terminal,
-- CSV and an SVG plot. Pure functions of the result that luagent.sim.model's
-- run returns.
local M = {}

local floor, fmt = math.floor, string.format

------------------------------------------------------------------------------
-- Output: table, CSV, SVG
------------------------------------------------------------------------------

-- Seconds as text: "1.234", or "-" when there is none.
local function secs(v) return v and fmt("%.3f", v) or "-" end

-- Milliseconds or seconds, whichever reads better ("11 ms", "0.1 s").
local function dur(v)
  if v == 0 then return "0 s" end
  if v < 1 then return fmt("%g ms", v * 1000) end
  return fmt("%g s", v)
end

-- One line describing the scenario's parameters.
local function describe(sc)
  local sj = (sc.service_jitter or 0) > 0 and fmt(" ± %g %%", sc.service_jitter * 100) or ""
  local hosts = (sc.hosts or 1) > 1 and fmt(" on %d hosts (guards :shared between them or :local to each)",
    sc.hosts) or ""
  if (sc.spread or 0) > 0 then hosts = hosts .. fmt(" starting over %s", dur(sc.spread)) end
  return fmt("%d clients%s, %d call%s per %s window, %s per call%s; fixed wait %s, "
    .. "backoff base %s, cap %s", sc.clients, hosts, sc.capacity, sc.capacity == 1 and "" or "s",
    dur(sc.window), dur(sc.service), sj, dur(sc.fixed_wait), dur(sc.base), dur(sc.max))
end

-- The width of the strategy column: 21, or the longest name (":shared").
function M.name_width(result)
  local w = 21
  for _, r in ipairs(result.rows) do w = math.max(w, #r.strategy) end
  return w
end

-- The printed comparison table.
function M.format_table(result)
  local sc = result.scenario
  local out = {
    fmt("luagent sim: scenario %s, seed %d", sc.name, result.seed),
    describe(sc),
    "",
    fmt("%-" .. M.name_width(result) .. "s %8s %6s %8s %8s %7s %9s %9s", "strategy", "req/cli", "max",
      "total", "rejected", "gave up", "median s", "worst s"),
  }
  for _, r in ipairs(result.rows) do
    out[#out + 1] = fmt("%-" .. M.name_width(result) .. "s %8.1f %6d %8d %8d %7d %9s %9s", r.strategy,
      r.mean, r.max,
      r.total, r.rejected, r.gave_up, secs(r.median), secs(r.worst))
  end
  return table.concat(out, "\n") .. "\n"
end

M.csv_columns = {
  "scenario", "seed", "strategy", "clients", "capacity", "window_s", "requests_mean",
  "requests_max", "requests_total", "rejected", "served", "gave_up", "median_s", "worst_s",
  "hosts", "sharing",
}

-- The same data as CSV, one row per strategy (empty cells for no value).
function M.csv(result)
  local sc = result.scenario
  local lines = { table.concat(M.csv_columns, ",") }
  for _, r in ipairs(result.rows) do
    lines[#lines + 1] = table.concat({
      sc.name, result.seed, r.strategy, r.clients, sc.capacity, fmt("%g", sc.window),
      fmt("%.3f", r.mean), r.max, r.total, r.rejected, r.served, r.gave_up,
      r.median and fmt("%.4f", r.median) or "", r.worst and fmt("%.4f", r.worst) or "",
      r.hosts or 1, r.sharing or "",
    }, ",")
  end
  return table.concat(lines, "\n") .. "\n"
end

-- Escapes text for SVG.
local function xml(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end

-- A plot: total requests and time to serve per strategy as bars, and each
-- strategy's requests per window over time (the waves and idle windows).
function M.svg(result)
  local rows, sc = result.rows, result.scenario
  local label_w = 50 + 7 * M.name_width(result) -- room for "full_jitter+cooldown:shared"
  local W, bar_w, row_h = 870 + label_w, 260, 22
  local o = {}
  local function add(...) o[#o + 1] = fmt(...) end
  local n = #rows
  local top = 70
  local bars_h = n * row_h
  local line_h = 46
  local tl_top = top + bars_h + 70
  local H = tl_top + n * line_h + 40
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
    .. 'font-family="sans-serif" font-size="12">', W, H, W, H)
  add('<rect width="%d" height="%d" fill="white"/>', W, H)
  add('<text x="10" y="22" font-size="16" font-weight="bold">luagent sim: scenario %s, seed %d</text>',
    xml(sc.name), result.seed)
  add('<text x="10" y="40">%s</text>', xml(describe(sc)))
  local max_total, max_time = 1, 0.001
  for _, r in ipairs(rows) do
    max_total = math.max(max_total, r.total)
    max_time = math.max(max_time, r.worst or 0)
  end
  local x1, x2 = label_w, label_w + bar_w + 130
  add('<text x="%d" y="%d" font-weight="bold">total requests</text>', x1, top - 8)
  add('<text x="%d" y="%d" font-weight="bold">time until served: median (dark), worst (light), s</text>',
    x2, top - 8)
  for i, r in ipairs(rows) do
    local y = top + (i - 1) * row_h
    add('<text x="%d" y="%d" text-anchor="end">%s</text>', label_w - 8, y + 15, xml(r.strategy))
    local w = bar_w * r.total / max_total
    add('<rect x="%d" y="%d" width="%.1f" height="%d" fill="#4a78b5"/>', x1, y + 3, w, row_h - 6)
    add('<text x="%.1f" y="%d">%d (%.1f/client)</text>', x1 + w + 4, y + 15, r.total, r.mean)
    if r.worst then
      local ww, wm = bar_w * r.worst / max_time, bar_w * r.median / max_time
      add('<rect x="%d" y="%d" width="%.1f" height="%d" fill="#f0a35e"/>', x2, y + 3, ww, row_h - 6)
      add('<rect x="%d" y="%d" width="%.1f" height="%d" fill="#c0580f"/>', x2, y + 3, wm, row_h - 6)
      add('<text x="%.1f" y="%d">%s / %s</text>', x2 + ww + 4, y + 15, secs(r.median), secs(r.worst))
    else
      add('<text x="%d" y="%d">nobody served</text>', x2, y + 15)
    end
    if r.gave_up > 0 then
      add('<text x="%d" y="%d" fill="#b00">%d gave up</text>', W - 90, y + 15, r.gave_up)
    end
  end
  add('<text x="10" y="%d" font-weight="bold">requests per %s window over time (the busiest '
    .. 'window where windows share a pixel; each row its own scales; dashed: the capacity, %d)'
    .. '</text>', tl_top - 14, xml(dur(sc.window)), sc.capacity)
  local tw = W - label_w - 160
  for i, r in ipairs(rows) do
    local y = tl_top + (i - 1) * line_h
    local pw, nw = r.per_window, #r.per_window
    local bins = math.min(nw, tw // 2)
    local per = nw / bins
    local sums, peak = {}, 1 -- sums[b]: the busiest window of bin b
    for b = 1, bins do
      local m = 0
      for w = floor((b - 1) * per) + 1, floor(b * per) do m = math.max(m, pw[w]) end
      sums[b] = m
      peak = math.max(peak, m)
    end
    peak = math.max(peak, sc.capacity)
    local h = line_h - 10
    add('<text x="%d" y="%d" text-anchor="end">%s</text>', label_w - 8, y + h - 4, xml(r.strategy))
    add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>', label_w, y + h, label_w + tw, y + h)
    local bw = tw / bins
    for b = 1, bins do
      if sums[b] > 0 then
        local bh = h * sums[b] / peak
        add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>', label_w + (b - 1) * bw,
          y + h - bh, math.max(bw - 0.3, 0.3), bh, sums[b] > sc.capacity and "#d9534f" or "#5cb85c")
      end
    end
    local cy = y + h - h * sc.capacity / peak
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#333" stroke-dasharray="4 3"/>', label_w, cy,
      label_w + tw, cy)
    add('<text x="%d" y="%d">0 .. %s s, peak %d</text>', label_w + tw + 6, y + h - 4,
      fmt("%.3g", nw * sc.window), math.floor(peak + 0.5))
  end
  add('</svg>')
  return table.concat(o, "\n") .. "\n"
end

return M
