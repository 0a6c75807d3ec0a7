-- issue_search: the known issues whose line mentions every word (read-only).
local data = (...):match("^(.*)/tools/[^/]*$") .. "/data" -- a tool file gets its path as ...

return {
  name = "issue_search",
  description = "Search the issue tracker; returns the issues mentioning every word of the query.",
  params = {
    type = "object",
    properties = { query = { type = "string", minLength = 1, maxLength = 100 } },
    required = { "query" },
    additionalProperties = false,
  },
  read_only = true,
  timeout = 5,
  run = function(args)
    local found = {}
    for line in io.lines(data .. "/issues.txt") do
      local all = true
      for word in args.query:lower():gmatch("%S+") do
        if not line:lower():find(word, 1, true) then all = false break end
      end
      if all then found[#found + 1] = line end
    end
    return #found > 0 and table.concat(found, "\n") or "no issue matches '" .. args.query .. "'"
  end,
}
