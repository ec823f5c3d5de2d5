-- tollgate: the helpers every strategy's script shares (its decision, the
-- no-writes twin, the batch and the refund). The store puts this file first
-- (in a lone decision, first inside its function `decide`).

-- A number as Redis should store it: every digit, never an exponent. An
-- integer, nearly every number here, takes '%d': Redis's Lua formats it
-- in half the time '%.0f' takes.
local function int(x)
  if x % 1 == 0 and x < 2^53 and x > -2^53 then return string.format('%d', x) end
  return string.format('%.0f', x)
end
-- tollgate: refund a uniform gate's pass: open the gate again, but only if
-- it is still closed by that pass (compare-and-delete); a later pass's
-- closing is left alone.
--
-- KEYS[1]   string: when the gate opens again (as in uniform_gate.lua)
-- ARGV[1]   the pass's reopening time, µs: the receipt's stamp
--
-- Reply: 1 if the gate was opened, else 0.

local at = tonumber(redis.call('GET', KEYS[1]))
-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
if at and at == (ARGV[1] + 0) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
