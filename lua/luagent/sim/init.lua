-- luagent.sim: the contention simulation (`luagent sim`), a test bench for
-- retry strategies; the product never requires it. One job per file:
--   model.lua   scenarios, strategies, the provider model and the runner
--   report.lua  the result as a table, CSV and SVG
--   cli.lua     `luagent sim`: help, flags, main
-- This face gathers their public functions.
local model = require "luagent.sim.model"
local report = require "luagent.sim.report"
local cli = require "luagent.sim.cli"

return {
  scenarios = model.scenarios,
  strategies = model.strategies,
  run = model.run,
  format_table = report.format_table,
  csv_columns = report.csv_columns,
  csv = report.csv,
  svg = report.svg,
  help = cli.help,
  parse_args = cli.parse_args,
  main = cli.main,
}
