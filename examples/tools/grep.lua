-- grep: a command tool. The arguments arrive as JSON on stdin; the child
-- runs in its own process group (killed whole on timeout), no shell is
-- involved in starting it, and its stdout is the result.
local data = (...):match("^(.*)/tools/[^/]*$") .. "/data" -- a tool file gets its path as ...

-- Reads {"pattern": "..."} from stdin and greps the data folder for it as
-- fixed text, case-insensitively; exit 0 with "no match" when none.
local script = [[
pattern=$(sed -n 's/.*"pattern" *: *"\(\([^"\\]\|\\.\)*\)".*/\1/p')
cd "$1" && grep -rniF -e "$pattern" . | sed 's|^\./||' || echo "no match"
]]

return {
  name = "grep",
  description = "Search every crash report and issue (examples/data) for a plain-text pattern.",
  params = {
    type = "object",
    properties = { pattern = { type = "string", minLength = 2, maxLength = 80 } },
    required = { "pattern" },
    additionalProperties = false,
  },
  read_only = true,
  timeout = 10,
  command = { "sh", "-c", script, "grep", data },
}
