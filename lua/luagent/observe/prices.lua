-- Model prices for the cost meter (lua/luagent/observe/cost.lua), in US dollars per
-- million tokens: `input` (uncached prompt tokens), `output`, `cache_read`
-- (prompt tokens served from the cache) and `cache_write` (prompt tokens
-- written to it; Anthropic). A missing cache price is the input price.
--
-- These are the providers' list prices as published when this table was
-- written; they change. Override them with `luagent run --prices FILE` (a
-- Lua file returning a table of the same shape; its entries replace these
-- model by model) or a runtime's `rt:meter("cost"):set_prices{...}`. A model
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
  -- Anthropic's list (platform.claude.com/docs/en/about-claude/pricing):
  -- cache_write is the 5-minute write; Opus from 4.5 on costs a third of 4.
  ["claude-3-haiku"] = { input = 0.25, output = 1.25, cache_read = 0.03, cache_write = 0.30 },
  ["claude-3-5-haiku"] = { input = 0.80, output = 4.00, cache_read = 0.08, cache_write = 1.00 },
  ["claude-haiku-4-5"] = { input = 1.00, output = 5.00, cache_read = 0.10, cache_write = 1.25 },
  ["claude-3-5-sonnet"] = { input = 3.00, output = 15.00, cache_read = 0.30, cache_write = 3.75 },
  ["claude-3-7-sonnet"] = { input = 3.00, output = 15.00, cache_read = 0.30, cache_write = 3.75 },
  ["claude-sonnet-4"] = { input = 3.00, output = 15.00, cache_read = 0.30, cache_write = 3.75 },
  ["claude-opus-4"] = { input = 15.00, output = 75.00, cache_read = 1.50, cache_write = 18.75 },
  ["claude-opus-4-1"] = { input = 15.00, output = 75.00, cache_read = 1.50, cache_write = 18.75 },
  ["claude-opus-4-5"] = { input = 5.00, output = 25.00, cache_read = 0.50, cache_write = 6.25 },
  ["claude-opus-4-6"] = { input = 5.00, output = 25.00, cache_read = 0.50, cache_write = 6.25 },
  ["claude-opus-4-7"] = { input = 5.00, output = 25.00, cache_read = 0.50, cache_write = 6.25 },
  ["claude-opus-4-8"] = { input = 5.00, output = 25.00, cache_read = 0.50, cache_write = 6.25 },
  ["claude-opus-5"] = { input = 5.00, output = 25.00, cache_read = 0.50, cache_write = 6.25 },
}
