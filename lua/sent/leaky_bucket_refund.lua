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
-- tollgate: give a leaky bucket's slot back (a client that left while
-- waiting, or a response the layer's refund predicate frees).
-- Mirrors leaky_bucket::refund and leaky_bucket::charge in
-- src/strategy/leaky_bucket.rs.
--
-- Settling a pass that spent more than it took sends a negative count: the
-- bucket empties extra * interval later (counted from now for an empty
-- bucket), unchecked (the units were spent), with a new expiry; only while
-- that charge would not yet have drained had it come with the pass
-- (stamp + extra * interval > now), so a late settle changes nothing.
--
-- The bucket empties cost intervals sooner, never before now, and only while
-- the refunded slot has not ended and is still in the bucket. Requests already
-- scheduled keep their times. KEEPTTL: the key's expiry only ever needs to
-- shrink here.
--
-- KEYS[1]  string: next_free, µs since epoch (as in leaky_bucket.lua)
-- ARGV[1]  now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]  units to give back; negative: units to charge
-- ARGV[3]  interval between two units, µs
-- ARGV[4]  the slot's end, µs: the receipt's stamp
--
-- Reply: 1 if the bucket moved, else 0 (integer).
--
-- `int` comes from lua/prelude.lua, which the store puts first.

-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local now = ARGV[1] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local cost = ARGV[2] + 0
local interval = ARGV[3] + 0
local stamp = ARGV[4] + 0

local free_at = tonumber(redis.call('GET', KEYS[1]))
if cost < 0 then
  local more = -cost * interval
  if stamp + more <= now then return 0 end
  local moved = math.max(free_at or now, now) + more
  redis.call('SET', KEYS[1], int(moved), 'PX', int(math.ceil((moved - now) / 1000) + 1000))
  return 1
end
if free_at and stamp > now and stamp <= free_at then
  local moved = math.max(free_at - cost * interval, now)
  redis.call('SET', KEYS[1], int(moved), 'KEEPTTL')
  return 1
end
return 0
