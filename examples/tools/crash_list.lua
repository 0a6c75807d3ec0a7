-- crash_list: the crash reports waiting for triage (read-only).
local data = (...):match("^(.*)/tools/[^/]*$") .. "/data" -- a tool file gets its path as ...

return {
  name = "crash_list",
  description = "List the crash reports waiting for triage: id, service, signal and count.",
  params = { type = "object", properties = {}, additionalProperties = false },
  read_only = true,
  timeout = 5,
  run = function()
    local lines = {}
    for _, name in ipairs(assert(require("luagent").list_dir(data .. "/crashes"))) do
      local f = io.open(data .. "/crashes/" .. name)
      if f then
        local text = f:read("a")
        f:close()
        lines[#lines + 1] = string.format("%s %s %s x%s", text:match("id: (%S+)"), text:match("service: (%S+)"),
          text:match("signal: ([^\n]+)"), text:match("count: (%d+)"))
      end
    end
    table.sort(lines)
    return table.concat(lines, "\n")
  end,
}
