-- create_issue: changes the world, so it has neither read_only nor
-- idempotent: it is never retried, and if it times out or dies the run
-- stops with outcome_unknown instead of filing the issue twice. It appends
-- one JSON line per issue to $TRIAGE_ISSUES (default /tmp/luagent-triage-issues.jsonl).
-- Its check lets a durable run that stopped while it ran (luagent resume)
-- find out whether the issue was filed: it looks for the call's
-- idempotency key in the tracker.
local json = require("luagent").json

local function tracker() return os.getenv("TRIAGE_ISSUES") or "/tmp/luagent-triage-issues.jsonl" end

return {
  name = "create_issue",
  description = "File a new issue in the tracker.",
  params = {
    type = "object",
    properties = {
      title = { type = "string", minLength = 5, maxLength = 120 },
      severity = { type = "string", enum = { "low", "medium", "high", "critical" } },
      crashes = { type = "array", items = { type = "string" } },
      body = { type = "string", maxLength = 2000 },
    },
    required = { "title", "severity" },
    additionalProperties = false,
  },
  timeout = 10,
  run = function(args, ctx)
    local f = assert(io.open(tracker(), "a"))
    f:write(json.encode { title = args.title, severity = args.severity, crashes = args.crashes,
                          body = args.body, idempotency_key = ctx.idempotency_key }, "\n")
    f:close()
    return "created issue: " .. args.title
  end,
  -- the issue filed with this call's idempotency key, if there is one
  check = function(args, ctx)
    local f = io.open(tracker())
    if not f then return nil end
    for line in f:lines() do
      local issue = json.decode(line)
      if type(issue) == "table" and issue.idempotency_key == ctx.idempotency_key then
        f:close()
        return "created issue: " .. issue.title
      end
    end
    f:close()
    return nil
  end,
}
