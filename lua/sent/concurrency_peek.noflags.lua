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
-- tollgate: Stripe's concurrent-request limiter.
-- Mirrors src/strategy/concurrency.rs and, for batches, lua/concurrency_batch.lua;
-- change all three together.
--
-- A sorted set of the key's requests in flight, scored by start (µs). A
-- request of cost c adds members "<id>:0" .. "<id>:c-1", so ZCOUNT counts
-- units. Entries started at or before now - timeout belong to app servers that
-- crashed before releasing them: they never count, and a writing call removes
-- them. The key expires one timeout after the last admission, when every
-- entry in it is stale.
--
-- KEYS[1]  sorted set: member "<id>:<i>", score = start µs
-- ARGV[1]  now, µs since epoch; -1 reads Redis TIME (one clock for all app servers)
-- ARGV[2]  cost in units (slots); 0 looks without writing (the peek reuses this script)
-- ARGV[3]  limit: slots in flight at most
-- ARGV[4]  timeout, µs: how long an entry counts before it is presumed crashed
-- ARGV[5]  this request's id: a random integer below 2^53, made by the app
--
-- Reply, integers only:
--   {allowed 1|0, limit, used (in flight), reset_at µs (newest start + timeout,
--    or now), retry_after µs or -1, now µs, reported quota (always 0),
--    and on a pass: the id (the release stamp)}
--
-- dry_run  true in the store's no-writes twin of this script (peeks and
--          pre-checks, which may run on replicas; lua/peek.lua passes it): it
--          then decides as if charging `cost` and writes nothing
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
local limit = ARGV[3] + 0
local timeout = ARGV[4] + 0
local id = ARGV[5]

local floor = int(math.max(now - timeout, 0))
if cost > 0 and not dry_run then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', floor)
end
local live = '(' .. floor
local count = redis.call('ZCOUNT', KEYS[1], live, '+inf')
local newest = nil
if count > 0 then
  newest = tonumber(redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', live, 'WITHSCORES', 'LIMIT', '0', '1')[2])
end

if count + cost > limit then
  local reset, retry = now, 1000000
  if newest then reset = newest + timeout end
  -- The oldest entry only matters to a rejection: a pass skips the read.
  if count > 0 then
    local oldest = tonumber(redis.call('ZRANGEBYSCORE', KEYS[1], live, '+inf', 'WITHSCORES', 'LIMIT', '0', '1')[2])
    retry = math.min(oldest + timeout - now, 1000000)
  end
  return {0, limit, math.min(count, limit), reset, retry, now, 0}
end

if cost > 0 then
  if not dry_run then
    local score = int(now)
    if cost == 1 then
      -- One slot, the common case, without a table to unpack.
      redis.call('ZADD', KEYS[1], score, id .. ':0')
    else
      -- At most 500 members per ZADD: `unpack` has a bounded stack.
      local args = {}
      for i = 0, cost - 1 do
        args[#args + 1] = score
        args[#args + 1] = id .. ':' .. i
        if #args >= 1000 or i == cost - 1 then
          redis.call('ZADD', KEYS[1], unpack(args))
          args = {}
        end
      end
    end
    redis.call('PEXPIRE', KEYS[1], int(math.ceil(timeout / 1000)))
  end
  count = count + cost
  if not newest or now > newest then newest = now end
end
local reset = now
if newest then reset = newest + timeout end
return {1, limit, count, reset, -1, now, 0, tonumber(id)}

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
