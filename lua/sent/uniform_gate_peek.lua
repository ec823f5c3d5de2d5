#!lua flags=no-writes
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
-- tollgate: the uniform gate, one call per caller per span.
-- Mirrors src/strategy/uniform_gate.rs; change both together.
--
-- The value is when the gate opens again, in µs, and that value decides, to
-- the microsecond. (Published versions test `TTL key > 0`, which Redis
-- rounds to whole seconds, letting callers in up to a second early, and check
-- then set in two round trips.) One `GET` decides and, for a pass, one
-- `SET PX` closes, both inside this atomic script; a value whose time has
-- passed while its key lives on (the second of grace, a replica, an injected
-- clock) counts as open.
-- The key expires one second after the gate opens; expiry only cleans up.
--
-- KEYS[1]   string: when the gate opens again, µs since epoch
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]   cost: a pass closes the gate for cost × span; 0 looks without writing
-- ARGV[3]   span, µs
-- ARGV[4]   the longest the gate may close, µs (cost × span is capped there)
--
-- Reply, integers only:
--   {allowed 1|0, limit 1, used 1 when closed else 0, reopens at µs (now when
--    open), retry_after µs or -1, now µs, quota 0, [on a pass: reopens at µs,
--    the refund stamp]}
--
-- dry_run   true in the store's no-writes twin of this script (peeks and
--           pre-checks, which may run on replicas; lua/peek.lua passes it):
--           it then decides as if charging `cost` and writes nothing
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

local at = now + math.min(cost * (ARGV[3] + 0), (ARGV[4] + 0))
if cost == 0 or dry_run then
  local opens_at = tonumber(redis.call('GET', KEYS[1]))
  local closed = opens_at and opens_at > now
  if cost == 0 then
    if closed then return {1, 1, 1, opens_at, -1, now, 0} end
    return {1, 1, 0, now, -1, now, 0}
  end
  if closed then return {0, 1, 1, opens_at, opens_at - now, now, 0} end
  return {1, 1, 1, at, -1, now, 0, at}
end

-- A `GET` then a `SET`: inside the script nothing runs between the two, so
-- this is as atomic as `SET NX GET` (Redis 7.0 only).
local was = tonumber(redis.call('GET', KEYS[1]))
if was and was > now then return {0, 1, 1, was, was - now, now, 0} end
redis.call('SET', KEYS[1], int(at), 'PX', int(math.ceil((at - now) / 1000) + 1000))
return {1, 1, 1, at, -1, now, 0, at}

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
