-- tollgate: what every strategy's batch (lua/*_batch.lua) shares, beside
-- lua/prelude.lua; the store puts it after that one.

-- An ARGV string as a number, converted once per call: a flood sends the same
-- few numbers over and over, and Redis's Lua turns a string into a number
-- with strtod, which costs more than a table lookup. `arg + 0` converts once;
-- Lua 5.1's tonumber converts twice.
local numbers = {}

local function num(arg)
  local n = numbers[arg]
  if n == nil then
    n = arg + 0
    numbers[arg] = n
  end
  return n
end
