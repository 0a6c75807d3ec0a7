-- Help text of `luagent sim`, for `luagent help sim` (the CLI looks for
-- luagent.<topic>.help). The text lives with the simulation.
return { sim = require("luagent.sim").help }
