-- A small Lua lexer for the specs that read the library's source
-- (spec/layers_spec.lua, spec/module_state_spec.lua): comments and strings
-- skipped correctly, every token with its line.

-- lex(src) -> the tokens of a Lua chunk: { t = "name"|"string"|"number"|"op",
-- v = text (a string's contents, escapes left as written), line = n }.
local OPS3 = { ["..."] = true }
local OPS2 = {
  [".."] = true, ["::"] = true, ["=="] = true, ["~="] = true, ["<="] = true,
  [">="] = true, ["//"] = true, ["<<"] = true, [">>"] = true,
}

local function lex(s)
  local toks, i, n, line = {}, 1, #s, 1
  local function lines_in(a, b)
    local _, c = s:sub(a, b):gsub("\n", "")
    return c
  end
  while i <= n do
    local a, b = s:find("^[ \t\r\f\v\n]+", i)
    if a then
      line = line + lines_in(a, b)
      i = b + 1
    elseif s:find("^%-%-", i) then
      local eq = s:match("^%-%-%[(=*)%[", i)
      if eq then -- a long comment
        local _, e = s:find("]" .. eq .. "]", i + 4 + #eq, true)
        e = e or n
        line = line + lines_in(i, e)
        i = e + 1
      else
        i = s:find("\n", i, true) or n + 1
      end
    elseif s:find("^%[=*%[", i) then -- a long string
      local eq = s:match("^%[(=*)%[", i)
      local open = #eq + 2
      local _, e = s:find("]" .. eq .. "]", i + open, true)
      e = e or n
      toks[#toks + 1] = { t = "string", v = s:sub(i + open, e - open):gsub("^\r?\n", ""), line = line }
      line = line + lines_in(i, e)
      i = e + 1
    else
      local c = s:sub(i, i)
      if c == '"' or c == "'" then
        local j = i + 1
        while j <= n do
          local ch = s:sub(j, j)
          if ch == "\\" then j = j + 2
          elseif ch == c or ch == "\n" then break
          else j = j + 1 end
        end
        toks[#toks + 1] = { t = "string", v = s:sub(i + 1, j - 1), line = line }
        line = line + lines_in(i, j)
        i = j + 1
      else
        local word = s:match("^[%a_][%w_]*", i)
        local num = not word and (s:match("^%d[%w_.]*", i) or s:match("^%.%d[%w_.]*", i))
        if word then
          toks[#toks + 1] = { t = "name", v = word, line = line }
          i = i + #word
        elseif num then
          i = i + #num
          if num:match("[eEpP]$") and s:find("^[+-]", i) then
            i = i + #s:match("^[+-][%w_.]*", i) -- the exponent's sign and digits
          end
          toks[#toks + 1] = { t = "number", v = num, line = line }
        else
          local op = (OPS3[s:sub(i, i + 2)] and s:sub(i, i + 2)) or (OPS2[s:sub(i, i + 1)] and s:sub(i, i + 1)) or c
          toks[#toks + 1] = { t = "op", v = op, line = line }
          i = i + #op
        end
      end
    end
  end
  return toks
end

return lex
