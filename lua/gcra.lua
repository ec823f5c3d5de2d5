-- tollgate: GCRA, a token bucket kept as one timestamp, as in redis-cell.
-- Mirrors src/strategy/gcra.rs and lua/gcra_batch.lua mirrors it;
-- change all three together.
--
-- Units are emitted every T µs (the quota's window / limit, rounded up by
-- the caller so the rate is never above the quota); the bucket holds `burst`
-- units. The value is the theoretical arrival time (TAT): when the bucket is
-- full again. A request of `cost` conforms when
-- max(tat, now) + cost * T - now <= burst * T. The key expires one second
-- after the TAT; expiry only cleans up (a TAT in the past is a full bucket).
--
-- KEYS[1]   string: TAT, µs since epoch, and what refunds gave back
--           (lua/tat.lua)
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]   cost in units; 0 looks without writing (the peek reuses this script)
-- ARGV[3]   T, the emission interval, µs per unit
-- ARGV[4]   burst: the bucket's size in units
--
-- Reply, integers only:
--   {allowed 1|0, limit (burst), used (burst - remaining), reset_at µs (TAT:
--    the bucket is full again), retry_after µs or -1, now µs, quota 0,
--    [on a pass: the refund stamps, the TAT set and the key's GIVEN; T,
--    the µs each unit was charged as, which a give-back moves the TAT by]}
--
-- dry_run   true in the store's no-writes twin of this script (peeks and
--           pre-checks, which may run on replicas; lua/peek.lua passes it):
--           it then decides as if charging `cost` and writes nothing
--
-- `int` comes from lua/prelude.lua, which the store puts first;
-- `split_tat` and `tat_value` from lua/tat.lua.

-- floor(a / b) for integers below 2^53: a double quotient can round up to
-- the next integer, so correct it with exact products.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local now = ARGV[1] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local cost = ARGV[2] + 0
local t = ARGV[3] + 0
local limit = ARGV[4] + 0
local tolerance = t * limit

local start = now
local value = redis.call('GET', KEYS[1])
local stored, given = tonumber(value), 0
if value and not stored then stored, given = split_tat(value) end
if stored and stored > now then start = stored end

-- What could pass right now if the TAT were `at`, rounded down.
local function remaining(at)
  return idiv(math.max(tolerance - (at - now), 0), t)
end
local used_now = limit - remaining(start)

if cost > limit then
  -- Never conforms; told to wait until the bucket is full, at least T.
  return {0, limit, used_now, start, math.max(start - now, t), now, 0}
end
local next = start + cost * t
if next - now > tolerance then
  return {0, limit, used_now, start, next - tolerance - now, now, 0}
end
if cost > 0 and not dry_run then
  redis.call('SET', KEYS[1], tat_value(next, given), 'PX', int(math.ceil((next - now) / 1000) + 1000))
end
return {1, limit, limit - remaining(next), next, -1, now, 0, next, given, t}
