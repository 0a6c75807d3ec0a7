-- `make settings`: rewrites README.md's table of settings from the one
-- table that lists them (lua/luagent/config.lua, M.SETTINGS), between the
-- markers below. spec/settings_spec.lua checks that the two agree.
--   lua5.4 mk/settings.lua [README.md]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local config = require "luagent.config"

local BEGIN = "<!-- settings: generated from lua/luagent/config.lua by `make settings` -->\n"
local END = "<!-- end of settings -->\n"

local path = arg[1] or "README.md"
local fh = assert(io.open(path, "r"))
local text = fh:read("a")
fh:close()
local a, b = text:find(BEGIN, 1, true)
local c = text:find(END, b or 1, true)
if not a or not c then
  io.stderr:write(path .. ": no settings markers (" .. BEGIN:gsub("\n", "") .. " ... " .. END:gsub("\n", "") .. ")\n")
  os.exit(1)
end
local out = text:sub(1, b) .. config.markdown() .. text:sub(c)
if out ~= text then
  fh = assert(io.open(path, "w"))
  fh:write(out)
  fh:close()
  print(path .. ": settings table rewritten")
end
