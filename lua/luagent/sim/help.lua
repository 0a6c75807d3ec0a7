-- Help text of `luagent sim`, for `luagent help sim` (the CLI looks for
-- luagent.<topic>.help).
return { sim = require("luagent.sim.cli").help }
