-- grep: a command tool. Its child runs in `cwd` (the data folder), in its
-- own process group (killed whole on timeout), with no shell involved in
-- starting it, and its stdout is the result. A command tool gets its
-- arguments as JSON on stdin and in LUAGENT_ARGS, for a program that reads
-- JSON, and each plain argument in a variable of its own, for a shell
-- script: here LUAGENT_ARG_PATTERN.
local data = (...):match("^(.*)/tools/[^/]*$") .. "/data" -- a tool file gets its path as ...

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
  cwd = data,
  -- fixed text, case-insensitively, in every file; "no match" when none
  command = { "sh", "-c", 'grep -rniF -e "$LUAGENT_ARG_PATTERN" -- * || echo "no match"' },
}
