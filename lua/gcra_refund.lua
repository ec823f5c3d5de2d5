-- tollgate: refund a GCRA charge: move the TAT back by cost * T, never
-- before now, and never before the start of the charge being refunded (so
-- refunding one receipt twice cannot hand out other requests' units).
-- KEEPTTL leaves the expiry, which only grows too long, never too short.
-- Mirrors gcra::refund and gcra::charge in src/strategy/gcra.rs.
--
-- Settling a pass that spent more than it was charged sends a negative
-- count: the TAT moves extra * T past itself (past now for a full bucket),
-- unchecked (the units were spent), with a new expiry; only while that
-- charge would not yet have drained had it come with the pass
-- (stamp + extra * T > now), so a late settle changes nothing.
--
-- KEYS[1]   string: TAT, µs since epoch (as in gcra.lua)
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]   units to give back; negative: units to charge
-- ARGV[3]   T, the emission interval, µs per unit
-- ARGV[4]   the TAT the charge set: the receipt's stamp
--
-- Reply: 1 if the TAT moved, else 0.
--
-- `int` comes from lua/prelude.lua, which the store puts first.

-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local now = ARGV[1] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local units = ARGV[2] + 0
local back = units * (ARGV[3] + 0)
local stamp = ARGV[4] + 0
local at = tonumber(redis.call('GET', KEYS[1]))
if units < 0 then
  if stamp - back <= now then return 0 end
  local moved = math.max(at or now, now) - back
  redis.call('SET', KEYS[1], int(moved), 'PX', int(math.ceil((moved - now) / 1000) + 1000))
  return 1
end
if at and at > now then
  redis.call('SET', KEYS[1], int(math.max(at - back, stamp - back, now)), 'KEEPTTL')
  return 1
end
return 0
