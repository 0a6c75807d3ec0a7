-- What the mock provider says in `luagent chat` (mock.start{chat = true}):
-- replies that make a chat without a key worth trying. A prompt that names
-- a tool offered (as a word: "weather", "issue_search" or "issue search")
-- gets a call of that tool, its string arguments taken from the words after
-- the name ("the weather in Paris" -> city = "Paris"); a tool's result gets
-- an answer quoting it; anything else is echoed, with a word on how to see a
-- tool call. Pure: a script for lua/luagent/mock/state.lua.
local replies = require "luagent.mock.replies"

local M = {}

-- Words that do not start an argument ("weather in Paris": "Paris").
local SMALL = { ["in"] = true, ["for"] = true, ["of"] = true, ["on"] = true, ["about"] = true, ["the"] = true,
  ["a"] = true, ["an"] = true, ["at"] = true, ["to"] = true, ["with"] = true, ["is"] = true, ["me"] = true }

-- Where `name` stands in `text` as a word (underscores may be spaces):
-- the index just after it, or nil.
local function named(text, name)
  for _, form in ipairs({ name, (name:gsub("_", " ")) }) do
    local pat = "%f[%w_]" .. form:lower():gsub("%p", "%%%0") .. "%f[^%w_]"
    local _, e = text:lower():find(pat)
    if e then return e + 1 end
  end
end

-- The words after the tool's name, small words and end punctuation off.
local function argument_text(rest, whole)
  local words = {}
  for w in rest:gmatch("%S+") do words[#words + 1] = w end
  while words[1] and SMALL[words[1]:lower()] do table.remove(words, 1) end
  local text = table.concat(words, " "):gsub("[%.%?!,;:]+$", "")
  if text == "" then return whole end
  return text
end

-- script(view, n) -> the content of reply n (see replies.content).
function M.script(view, n)
  if view.last_is_tool_result then
    return { text = "The tool answered: " .. (view.last_text or "") }
  end
  local text = view.user_text or view.last_text or ""
  local names = {}
  for _, tool in ipairs(view.tools) do
    names[#names + 1] = tool.name
    local after = named(text, tool.name)
    if after then
      local args = replies.arguments_for(tool.schema, argument_text(text:sub(after), text))
      return { tool = { id = "call_" .. n, name = tool.name, arguments = args } }
    end
  end
  local reply = string.format('You said: "%s". I am the embedded mock provider: I echo what you write', text)
  if #names > 0 then
    reply = reply .. ", and I call a tool when you name one (" .. table.concat(names, ", ") .. ")."
  else
    reply = reply .. "; give the chat a tool folder (--tools DIR) and name a tool to see a call."
  end
  return { text = reply }
end

return M
