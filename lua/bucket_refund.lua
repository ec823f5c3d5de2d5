-- tollgate: refund a GCRA or leaky bucket charge (a leaky bucket's
-- next_free is its TAT): move the TAT back by what of the charge is still
-- in the bucket, never before now, and never before the start the
-- charge was stamped with (so refunding one receipt twice cannot hand out
-- other requests' units). The charge ended at its stamp less what refunds
-- of charges with others behind them gave back since (GIVEN now less GIVEN
-- then, lua/tat.lua): a late refund, or one of a charge others' refunds
-- moved up, gives back only what has not drained. KEEPTTL leaves the
-- expiry, which only grows too long, never too short. Mirrors refund and
-- charge in src/strategy/bucket.rs.
--
-- Settling a pass that spent more than it was charged sends a negative
-- count: the TAT moves extra * T past itself (past now for a full bucket),
-- unchecked (the units were spent), with a new expiry; only while that
-- charge would not yet have drained had it come with the pass
-- (stamp + extra * T > now), so a late settle changes nothing.
--
-- KEYS[1]   string: TAT and GIVEN (lua/tat.lua)
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]   units to give back; negative: units to charge
-- ARGV[3]   T, the emission interval, µs per unit, the charge was made in
-- ARGV[4]   the TAT the charge set: the receipt's stamp
-- ARGV[5]   the key's GIVEN when it was charged (absent: 0)
--
-- Reply: 1 if the TAT moved, else 0.
--
-- `int` comes from lua/prelude.lua, which the store puts first;
-- `split_tat` and `tat_value` from lua/tat.lua.

-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local now = ARGV[1] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local units = ARGV[2] + 0
local charged = units * (ARGV[3] + 0)
local stamp = ARGV[4] + 0
local given_then = tonumber(ARGV[5]) or 0
local value = redis.call('GET', KEYS[1])
local at, given = tonumber(value), 0
if value and not at then at, given = split_tat(value) end
if units < 0 then
  if stamp - charged <= now then return 0 end
  local moved = math.max(at or now, now) - charged
  redis.call('SET', KEYS[1], tat_value(moved, given), 'PX', int(math.ceil((moved - now) / 1000) + 1000))
  return 1
end
-- A key made after the charge (GIVEN below the receipt's, or ending
-- before the charge does) holds none of it.
if not at or at <= now or given < given_then then return 0 end
local ends = stamp - (given - given_then)
if ends > at then return 0 end
local back = math.min(charged, math.max(ends - now, 0))
local moved = math.min(math.max(at - back, stamp - charged, now), at)
if moved == at then return 0 end
-- Giving back the last charge moves up nothing charged after it.
if ends < at then given = given + at - moved end
redis.call('SET', KEYS[1], tat_value(moved, given), 'KEEPTTL')
return 1
