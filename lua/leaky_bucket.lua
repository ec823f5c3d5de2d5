-- tollgate: leaky bucket that shapes traffic ("virtual scheduling").
-- Mirrors src/strategy/leaky_bucket.rs and lua/leaky_bucket_batch.lua mirrors it;
-- change all three together.
--
-- The key holds the time the bucket empties (next_free). A request leaves at
-- max(now, next_free) and pushes next_free on by cost intervals; it fits when
-- the queue after it (next_free - now) is at most capacity intervals. A stored
-- next_free that is not after `now` is an empty bucket, expired or not.
-- The key expires one second after the bucket empties; expiry only cleans up.
--
-- KEYS[1]  string: next_free, µs since epoch, with what refunds gave back
--          (lua/tat.lua: a leaky bucket's next_free is its TAT)
-- ARGV[1]  now, µs since epoch; -1 reads Redis TIME (one clock for all app servers)
-- ARGV[2]  cost in units; 0 looks without writing (the peek reuses this script)
-- ARGV[3]  capacity, in units
-- ARGV[4]  interval between two units, µs (window / limit, rounded up)
--
-- Reply, integers only:
--   {allowed 1|0, limit (= capacity), used, reset_at µs (bucket empty),
--    retry_after µs or -1, now µs, reported quota (always 0),
--    and on a pass: slot end µs and the key's GIVEN (the refund stamps),
--    the interval (the µs
--    each unit was charged as, which a give-back moves the bucket by), delay
--    µs before leaving}
--
-- dry_run  true in the store's no-writes twin of this script (peeks and
--          pre-checks, which may run on replicas; lua/peek.lua passes it): it
--          then decides as if charging `cost` and writes nothing
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
local cost = ARGV[2] + 0
local capacity = ARGV[3] + 0
local interval = ARGV[4] + 0

-- ceil(a / b) for non-negative integers below 2^53, exactly: the float
-- quotient may round up to the next integer, so check with products.
local function ceil_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  if q * b < a then q = q + 1 end
  return q
end

local value = redis.call('GET', KEYS[1])
local free_at, given = tonumber(value), 0
if value and not free_at then free_at, given = split_tat(value) end
if not free_at or free_at <= now then free_at = now end
local level = free_at - now
local full = capacity * interval
local after = level + cost * interval

if after > full then
  local used = math.min(ceil_div(level, interval), capacity)
  return {0, capacity, used, free_at, after - full, now, 0}
end

local finish = free_at + cost * interval
if cost > 0 and not dry_run then
  redis.call('SET', KEYS[1], tat_value(finish, given), 'PX', int(math.ceil((finish - now) / 1000) + 1000))
end
return {1, capacity, ceil_div(after, interval), finish, -1, now, 0, finish, given, interval, level}
