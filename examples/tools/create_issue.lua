-- create_issue: changes the world, so it has neither read_only nor
-- idempotent: it is never retried, and if it times out or dies the run
-- stops with outcome_unknown instead of filing the issue twice. It appends
-- one JSON line per issue to $TRIAGE_ISSUES (default /tmp/luagent-triage-issues.jsonl).
local json = require "luagent.json"

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
    local path = os.getenv("TRIAGE_ISSUES") or "/tmp/luagent-triage-issues.jsonl"
    local f = assert(io.open(path, "a"))
    f:write(json.encode { title = args.title, severity = args.severity, crashes = args.crashes,
                          body = args.body, idempotency_key = ctx.idempotency_key }, "\n")
    f:close()
    return "created issue: " .. args.title
  end,
}
