-- tollgate: GCRA's decision that also leases a hot caller a slice of its
-- bucket. Mirrors src/strategy/lease.rs and lua/gcra.lua; change them
-- together. The decision itself is GCRA's: the same check, the same reply.
-- On a pass it moves the TAT on by `cost` plus the lease, never more than
-- half of what the bucket holds after `cost` (the rest stays for the other
-- servers). The server spends the lease in memory while it decays by one
-- unit per emission interval (so the bucket, refilling meanwhile, never
-- holds more than `burst` with the lease counted), and gives back what is
-- left with lua/bucket_refund.lua.
--
-- KEYS[1]   string: TAT, µs since epoch, and GIVEN (as in gcra.lua)
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME (lua/timed.lua folds the
--           deadline in)
-- ARGV[2]   cost in units, at least 1
-- ARGV[3]   T, the emission interval, µs per unit
-- ARGV[4]   burst: the bucket's size in units
-- ARGV[5]   units wanted for the lease, beyond `cost`
-- ARGV[6]   span, µs (unused: a GCRA lease decays as the bucket refills, so
--           it has no window end to be sized to)
--
-- Reply, integers only:
--   {allowed 1|0, limit (burst), used (burst - remaining, the lease
--    included), reset_at µs (TAT), retry_after µs or -1, now µs, quota 0,
--    [on a pass: the TAT set and GIVEN (the refund stamps), T (the µs
--    each unit was charged as), units leased]}
--
-- `int` comes from lua/prelude.lua, which the store puts first;
-- `split_tat` and `tat_value` from lua/tat.lua.

-- floor(a / b) for integers below 2^53 (as in gcra.lua).
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

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

local function remaining(at)
  return idiv(math.max(tolerance - (at - now), 0), t)
end
local used_now = limit - remaining(start)

if cost > limit then
  return {0, limit, used_now, start, math.max(start - now, t), now, 0}
end
local next = start + cost * t
if next - now > tolerance then
  return {0, limit, used_now, start, next - tolerance - now, now, 0}
end
local lease = math.min(ARGV[5] + 0, math.floor(remaining(next) / 2))
next = next + lease * t
redis.call('SET', KEYS[1], tat_value(next, given), 'PX', int(math.ceil((next - now) / 1000) + 1000))
return {1, limit, limit - remaining(next), next, -1, now, 0, next, given, t, lease}
