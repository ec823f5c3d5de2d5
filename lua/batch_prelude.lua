-- tollgate: what every strategy's batch (lua/*_batch.lua) shares; the store
-- puts it first.

-- A number as Redis should store it: every digit, never an exponent.
local function int(x) return string.format('%.0f', x) end

-- An ARGV string as a number, converted once per call: a flood sends the same
-- few numbers over and over, and Redis's Lua turns a string into a number
-- with strtod, some 1,500 instructions.
local numbers = {}

local function num(arg)
  local n = numbers[arg]
  if n == nil then
    n = tonumber(arg)
    numbers[arg] = n
  end
  return n
end
