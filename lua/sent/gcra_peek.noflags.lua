local function decide(KEYS, ARGV, dry_run)
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
-- KEYS[1]   string: TAT, µs since epoch
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]   cost in units; 0 looks without writing (the peek reuses this script)
-- ARGV[3]   T, the emission interval, µs per unit
-- ARGV[4]   burst: the bucket's size in units
--
-- Reply, integers only:
--   {allowed 1|0, limit (burst), used (burst - remaining), reset_at µs (TAT:
--    the bucket is full again), retry_after µs or -1, now µs, quota 0,
--    [on a pass: the TAT set, the refund stamp]}
--
-- dry_run   true in the store's no-writes twin of this script (peeks and
--           pre-checks, which may run on replicas; lua/peek.lua passes it):
--           it then decides as if charging `cost` and writes nothing
--
-- `int` comes from lua/prelude.lua, which the store puts first.

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
local stored = tonumber(redis.call('GET', KEYS[1]))
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
  redis.call('SET', KEYS[1], int(next), 'PX', int(math.ceil((next - now) / 1000) + 1000))
end
return {1, limit, limit - remaining(next), next, -1, now, 0, next}

end
-- tollgate: the no-writes twin of a decision script, for peeks and replica
-- pre-checks. The store puts the decision script before this file as the
-- function `decide(KEYS, ARGV, dry_run)`, flags the whole `no-writes`, and
-- passes `dry_run` true here: the script then decides as if charging the
-- cost it is given and writes nothing. Its reply is packed as
-- lua/packed.lua packs it.
local reply = decide(KEYS, ARGV, true)
if type(reply) == 'table' and reply.err == nil then
  return struct.pack('>' .. string.rep('l', #reply), unpack(reply))
end
return reply
