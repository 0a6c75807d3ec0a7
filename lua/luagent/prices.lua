-- Model prices for the cost meter (lua/luagent/cost.lua), in US dollars per
-- million tokens: `input` (uncached prompt tokens), `output`, `cache_read`
-- (prompt tokens served from the cache) and `cache_write` (prompt tokens
-- written to it; Anthropic). A missing cache price is the input price.
--
-- These are the providers' list prices as published when this table was
-- written; they change. Override them with `luagent run --prices FILE` (a
-- Lua file returning a table of the same shape; its entries replace these
-- model by model) or `require("luagent.cost").set_prices{...}`. A model
-- found nowhere is reported as "no price", never as free.
--
-- Keys are model names as sent in requests. A dated name
-- ("claude-3-5-haiku-20241022", "gpt-4o-mini-2024-07-18", "...-latest")
-- takes the price of the longest key it starts with; an OpenRouter name
-- ("openai/gpt-4o-mini") is looked up whole, then without its vendor prefix.
return {
  ["gpt-4o"] = { input = 2.50, output = 10.00, cache_read = 1.25 },
  ["gpt-4o-mini"] = { input = 0.15, output = 0.60, cache_read = 0.075 },
  ["gpt-4.1"] = { input = 2.00, output = 8.00, cache_read = 0.50 },
  ["gpt-4.1-mini"] = { input = 0.40, output = 1.60, cache_read = 0.10 },
  ["gpt-4.1-nano"] = { input = 0.10, output = 0.40, cache_read = 0.025 },
  ["o3"] = { input = 2.00, output = 8.00, cache_read = 0.50 },
  ["o3-mini"] = { input = 1.10, output = 4.40, cache_read = 0.55 },
  ["o4-mini"] = { input = 1.10, output = 4.40, cache_read = 0.275 },
  ["claude-3-5-haiku"] = { input = 0.80, output = 4.00, cache_read = 0.08, cache_write = 1.00 },
  ["claude-haiku"] = { input = 0.80, output = 4.00, cache_read = 0.08, cache_write = 1.00 },
  ["claude-3-5-sonnet"] = { input = 3.00, output = 15.00, cache_read = 0.30, cache_write = 3.75 },
  ["claude-3-7-sonnet"] = { input = 3.00, output = 15.00, cache_read = 0.30, cache_write = 3.75 },
  ["claude-sonnet-4"] = { input = 3.00, output = 15.00, cache_read = 0.30, cache_write = 3.75 },
  ["claude-opus-4"] = { input = 15.00, output = 75.00, cache_read = 1.50, cache_write = 18.75 },
}
