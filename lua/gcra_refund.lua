-- tollgate: refund a GCRA charge: move the TAT back by cost * T, never
-- before now, and never before the start of the charge being refunded (so
-- refunding one receipt twice cannot hand out other requests' units).
-- KEEPTTL leaves the expiry, which only grows too long, never too short.
--
-- KEYS[1]   string: TAT, µs since epoch (as in gcra.lua)
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]   units to give back
-- ARGV[3]   T, the emission interval, µs per unit
-- ARGV[4]   the TAT the charge set: the receipt's stamp
--
-- Reply: 1 if the TAT moved back, else 0.

-- A number as Redis should store it: every digit, never an exponent. An
-- integer, nearly every number here, takes '%d': Redis's Lua formats it
-- in half the time '%.0f' takes.
local function int(x)
  if x % 1 == 0 and x < 2^53 and x > -2^53 then return string.format('%d', x) end
  return string.format('%.0f', x)
end

local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local back = tonumber(ARGV[2]) * tonumber(ARGV[3])
local stamp = tonumber(ARGV[4])
local at = tonumber(redis.call('GET', KEYS[1]))
if at and at > now then
  redis.call('SET', KEYS[1], int(math.max(at - back, stamp - back, now)), 'KEEPTTL')
  return 1
end
return 0
