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
-- tollgate: GitHub-style fixed window over one or more quotas, all-or-nothing.
-- Mirrors src/strategy/fixed_window.rs; change both together.
-- lua/fixed_window_batch.lua mirrors it for batches (each key read and
-- written once per call): change that one with it too.
--
-- The window's end (reset-at) is stored beside the counter and read back, so
-- it never wobbles between requests. A stored end that is not after `now`
-- counts as an empty window, expired or not (replicas do not expire keys).
-- Keys expire one second after their window ends; expiry only cleans up.
--
-- KEYS[i]      hash for quota i: c = units spent, r = window end (µs since epoch)
-- ARGV[1]      now, µs since epoch; -1 reads Redis TIME (one clock for all app servers)
-- ARGV[2]      cost in units; 0 looks without writing (the peek reuses this script)
-- ARGV[1+2i]   quota i's limit, in units
-- ARGV[2+2i]   quota i's window, in µs
--
-- Reply, integers only:
--   {allowed 1|0, limit, used, reset_at µs, retry_after µs or -1, now µs,
--    reported quota (0-based), window end of quota 1 .. n (refund stamps)}
--
-- dry_run      true in the store's no-writes twin of this script (peeks and
--              pre-checks, which may run on replicas; lua/peek.lua passes
--              it): it then decides as if charging `cost` and writes nothing
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
local n = #KEYS

-- One quota, the common case: the same steps as below without their tables,
-- which would cost every lone call a good part of its time in Redis.
if n == 1 then
  local limit = ARGV[3] + 0
  local stored = redis.call('HMGET', KEYS[1], 'c', 'r')
  local c, r = tonumber(stored[1]), tonumber(stored[2])
  local open = c and r and r > now
  if not open then c, r = 0, now + (ARGV[4] + 0) end
  if c + cost > limit then
    return {0, limit, math.min(c, limit), r, r - now, now, 0}
  end
  if cost > 0 and not dry_run then
    if open then
      redis.call('HINCRBY', KEYS[1], 'c', ARGV[2])
    else
      redis.call('HSET', KEYS[1], 'c', ARGV[2], 'r', int(r))
      redis.call('PEXPIRE', KEYS[1], int(math.ceil((r - now) / 1000) + 1000))
    end
  end
  return {1, limit, c + cost, r, -1, now, 0, r}
end

local count, reset, limit, open = {}, {}, {}, {}
for i = 1, n do
  limit[i] = ARGV[1 + 2 * i] + 0
  local stored = redis.call('HMGET', KEYS[i], 'c', 'r')
  local c, r = tonumber(stored[1]), tonumber(stored[2])
  if c and r and r > now then
    count[i], reset[i], open[i] = c, r, true
  else
    count[i], reset[i], open[i] = 0, now + (ARGV[2 + 2 * i] + 0), false
  end
end

-- The rejecting quota that frees up last decides Retry-After.
local rejected = nil
for i = 1, n do
  if count[i] + cost > limit[i] then
    if rejected == nil or reset[i] > reset[rejected] then rejected = i end
  end
end
if rejected then
  local i = rejected
  return {0, limit[i], math.min(count[i], limit[i]), reset[i], reset[i] - now, now, i - 1}
end

-- Inside an open window only the count moves: HINCRBY keeps the expiry set
-- when the window opened (its end does not change), and needs no number
-- formatting. That halves the script's cost on the common path.
for i = 1, n do count[i] = count[i] + cost end
if cost > 0 and not dry_run then
  for i = 1, n do
    if open[i] then
      redis.call('HINCRBY', KEYS[i], 'c', ARGV[2])
    else
      redis.call('HSET', KEYS[i], 'c', ARGV[2], 'r', int(reset[i]))
      redis.call('PEXPIRE', KEYS[i], int(math.ceil((reset[i] - now) / 1000) + 1000))
    end
  end
end

-- When all fit, report the quota with the least left.
local report = 1
for i = 2, n do
  if limit[i] - count[i] < limit[report] - count[report] then report = i end
end
local reply = {1, limit[report], count[report], reset[report], -1, now, report - 1}
for i = 1, n do reply[7 + i] = reset[i] end
return reply

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
