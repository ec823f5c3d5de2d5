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
