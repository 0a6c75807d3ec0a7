-- crash_show: one crash report in full (read-only).
local data = (...):match("^(.*)/tools/[^/]*$") .. "/data" -- a tool file gets its path as ...

return {
  name = "crash_show",
  description = "Show one crash report in full: stack, version, notes.",
  params = {
    type = "object",
    properties = { id = { type = "string", description = "crash id, like c-1041", minLength = 3, maxLength = 20 } },
    required = { "id" },
    additionalProperties = false,
  },
  read_only = true,
  timeout = 5,
  run = function(args)
    if not args.id:match("^c%-%d+$") then return nil, "no crash with id " .. args.id end
    local f = io.open(data .. "/crashes/" .. args.id .. ".txt")
    if not f then return nil, "no crash with id " .. args.id end
    local text = f:read("a")
    f:close()
    return text
  end,
}
