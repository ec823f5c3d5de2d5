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
-- closing is left alone. Mirrors uniform_gate::refund and
-- uniform_gate::settle in src/strategy/uniform_gate.rs.
--
-- Settling the pass to its actual cost sends ARGV[2] and ARGV[3]: while the
-- gate is still closed by that pass and its key lives (one second past its
-- reopening, as the memory store keeps it), the gate reopens at the settled
-- time instead, or at once if that has passed.
--
-- KEYS[1]   string: when the gate opens again (as in uniform_gate.lua)
-- ARGV[1]   the pass's reopening time, µs: the receipt's stamp
-- ARGV[2]   settling only: now, µs since epoch; -1 reads Redis TIME
-- ARGV[3]   settling only: the settled reopening time, µs
--
-- Reply: 1 if the gate moved, else 0.
--
-- `int` comes from lua/prelude.lua, which the store puts first.

local at = tonumber(redis.call('GET', KEYS[1]))
-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
if not (at and at == (ARGV[1] + 0)) then return 0 end
if ARGV[2] == nil then
  redis.call('DEL', KEYS[1])
  return 1
end
local now = ARGV[2] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
if at + 1000000 <= now then return 0 end
local reopening = ARGV[3] + 0
if reopening <= now then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], int(reopening), 'PX', int(math.ceil((reopening - now) / 1000) + 1000))
end
return 1
