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
-- tollgate: exact sliding-window log with two limits at once: the resource's
-- (shared by every caller) and this consumer's, checked and charged together.
-- Mirrors src/strategy/sliding_log.rs; change both together.
-- lua/sliding_log_batch.lua mirrors it for batches (each log read and
-- written once per call): change that one with it too.
--
-- Each log holds one member per unit spent, scored by its time in integer µs
-- (never seconds and microseconds glued together as strings) and named
-- "<time>:<request id>:<unit>", so requests in the same microsecond never
-- collapse into one member. A request fits a log when the units inside
-- (now - window, now] plus its cost are at most the limit (a count already
-- above a lowered limit keeps rejecting). When either log rejects, neither
-- is charged. Rejections are not logged, and a pass first drops what left
-- the window, so a log never holds more than its limit. Both keys share the
-- policy's hash tag and get an expiry: one second after their newest entry
-- leaves the window.
--
-- KEYS[1]   sorted set: the resource's log (every caller of the policy)
-- KEYS[2]   sorted set: this consumer's log
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]   cost in units; 0 looks without writing (the peek reuses this script)
-- ARGV[3]   request id: a decimal integer below 2^53, unique per request
-- ARGV[4]   resource limit, units      ARGV[5]   resource window, µs
-- ARGV[6]   consumer limit, units      ARGV[7]   consumer window, µs
--
-- Reply, integers only:
--   {allowed 1|0, limit, used, reset_at µs (the reported log is empty again),
--    retry_after µs or -1, now µs, reported quota (0 resource, 1 consumer),
--    [on a pass: now µs, request id: the refund stamps]}
--
-- dry_run   true in the store's no-writes twin of this script (peeks and
--           pre-checks, which may run on replicas; lua/peek.lua passes it):
--           it then decides as if charging `cost` and writes nothing
--
-- `int` comes from lua/prelude.lua, which the store puts first.

-- Written out for the two logs, without tables: each table, closure and
-- formatted number is work for Redis's Lua, and a lone call of this script
-- spends more there than in its Redis commands.
-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local now = ARGV[1] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local cost = ARGV[2] + 0
local id = ARGV[3]

-- The log `key` with `window`: its cutoff (now - window, a string), the
-- units inside (cutoff, +inf) and its newest entry's time, nil when none is
-- inside. A member's name starts with its score, so the newest is read
-- without WITHSCORES, whose double Redis would format and Lua parse back
-- (scores are times, never negative: `now` is Redis TIME or the app's u64).
local function look(key, window)
  local cutoff = int(now - window)
  local n = redis.call('ZCOUNT', key, '(' .. cutoff, '+inf')
  local newest = nil
  if n > 0 then
    newest = tonumber(string.match(redis.call('ZRANGE', key, '-1', '-1')[1], '^%d+'))
  end
  return cutoff, n, newest
end

local limit1, window1 = ARGV[4] + 0, ARGV[5] + 0
local limit2, window2 = ARGV[6] + 0, ARGV[7] + 0
local cutoff1, n1, newest1 = look(KEYS[1], window1)
local cutoff2, n2, newest2 = look(KEYS[2], window2)

-- When the log is empty again: its newest entry leaves the window.
local function reset(newest, window)
  if newest then return newest + window end
  return now
end

-- How long until `cost` more units fit the log, nil if they fit now: until
-- enough of its oldest units leave the window. A cost above the limit never
-- fits, and waits for the whole log instead.
local function wait(key, cutoff, n, limit, window)
  if n + cost <= limit then return nil end
  local free = math.min(n + cost - limit, n)
  if free <= 0 then return window end
  local kth = redis.call('ZRANGEBYSCORE', key, '(' .. cutoff, '+inf',
    'WITHSCORES', 'LIMIT', int(free - 1), '1')
  return tonumber(kth[2]) + window - now
end

-- The rejecting log that frees up last decides Retry-After (the resource's
-- on a tie). When either rejects, neither is charged.
local wait1 = wait(KEYS[1], cutoff1, n1, limit1, window1)
local wait2 = wait(KEYS[2], cutoff2, n2, limit2, window2)
if wait1 and (wait2 == nil or wait1 >= wait2) then
  return {0, limit1, math.min(n1, limit1), reset(newest1, window1), wait1, now, 0}
elseif wait2 then
  return {0, limit2, math.min(n2, limit2), reset(newest2, window2), wait2, now, 1}
end

-- Charges the log `key`: drops what left the window, adds one member per
-- unit and sets the expiry, one second after the newest entry leaves the
-- window. Returns the newest entry's time.
local score = int(now)
local function charge(key, cutoff, newest, window)
  if newest == nil or newest < now then newest = now end
  if not dry_run then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    if cost == 1 then
      redis.call('ZADD', key, score, score .. ':' .. id .. ':0')
    else
      -- At most 500 members per ZADD: `unpack` has a bounded stack.
      local batch = {}
      for unit = 0, cost - 1 do
        batch[#batch + 1] = score
        batch[#batch + 1] = score .. ':' .. id .. ':' .. unit
        if #batch >= 1000 or unit == cost - 1 then
          redis.call('ZADD', key, unpack(batch))
          batch = {}
        end
      end
    end
    redis.call('PEXPIRE', key, int(math.ceil((newest + window - now) / 1000) + 1000))
  end
  return newest
end
if cost > 0 then
  n1, n2 = n1 + cost, n2 + cost
  newest1 = charge(KEYS[1], cutoff1, newest1, window1)
  newest2 = charge(KEYS[2], cutoff2, newest2, window2)
end

-- When both fit, report the one with the least left (the resource's on a tie).
if limit2 - n2 < limit1 - n1 then
  return {1, limit2, n2, reset(newest2, window2), -1, now, 1, now, tonumber(id)}
end
return {1, limit1, n1, reset(newest1, window1), -1, now, 0, now, tonumber(id)}

end
-- tollgate: a caller's own rules around a strategy's decision: an
-- operator's override of its quotas, and the penalty box. Mirrors
-- src/store/memory/caller.rs; change both together.
--
-- The store puts this file after the strategy's decision function and then
-- wraps it: `decide = with_caller(decide)` before lua/timed.lua or
-- lua/peek.lua, `run = with_caller(run)` before lua/batch_decide.lua. The
-- wrapped function takes the strategy's keys and arguments with these
-- after them, and hands the strategy its own keys (its scripts count
-- KEYS, never ARGV, so the arguments after theirs stay where they are):
--
-- KEYS         the strategy's keys; then the override's key when `at` > 0;
--              then the penalty-box key when the policy has a penalty box
-- ARGV[n]      at: where the strategy's arguments for its quotas start
--              (1-based), which an override replaces; 0: no override key.
--              Negative for a policy with a penalty box: then -ARGV[n] - 1
--              is `at`, and four more come before it:
-- ARGV[n - 4]  strikes: rejections within `span` that start a block
-- ARGV[n - 3]  span, µs
-- ARGV[n - 2]  block, µs: the first block
-- ARGV[n - 1]  cap, µs: the longest block; each block after the first
--              doubles up to it
--
-- The override key holds `until` (µs, 0 for never) and the strategy's
-- quota arguments, then `|` and the quotas as the operator gave them:
-- `until a1 a2 ...|until limit window ...`. The penalty-box key is a hash: b =
-- blocked until, s = strikes, e = end of the strikes' span, n = blocks so
-- far (µs since the epoch); it expires a second after its strikes stop
-- counting and a cap after its block ends, and past that counts as none
-- whether or not it expired (replicas do not expire keys, and a store's own
-- clock may run apart from Redis's).
--
-- Reply: the strategy's, but while the caller is blocked {2, limit, used,
-- passes at, passes at - now, now, reported quota}: refused, nothing
-- written, until a request would pass: the block's end, or later when the
-- request decided as if charged (a dry run) would still wait for its
-- quota. The rejection that starts a block replies so too, with 3 first
-- instead of 2 and its own wait.

-- When a request would pass: the block's end `b`, or later when `r`, the
-- strategy's reply for it, is a rejection that waits longer.
local function passes_at(b, r, now)
  if r[1] == 0 and r[5] > 0 then return math.max(b, now + r[5]) end
  return b
end

local function with_caller(inner)
  return function(KEYS, ARGV, dry_run)
    local n, nk = #ARGV, #KEYS
    local at, penalty = ARGV[n] + 0, nil
    if at < 0 then at, penalty = -at - 1, n - 4 end
    local box, override = nil, nil
    if penalty then box = KEYS[nk]; KEYS[nk] = nil; nk = nk - 1 end
    if at > 0 then override = KEYS[nk]; KEYS[nk] = nil end

    local now = ARGV[1] + 0
    if now < 0 then
      local t = redis.call('TIME')
      now = t[1] * 1000000 + t[2]
      ARGV[1] = now
    end

    if override then
      local v = redis.call('GET', override)
      if v then
        local untl, args = string.match(v, '^(%d+) ([^|]*)|')
        if untl and (untl + 0 == 0 or untl + 0 > now) then
          local i = at
          for a in string.gmatch(args, '%S+') do
            ARGV[i] = a
            i = i + 1
          end
        end
      end
    end

    local reply
    if box then
      local strikes = ARGV[penalty] + 0
      local cap = ARGV[penalty + 3] + 0
      local p = redis.call('HMGET', box, 'b', 's', 'e', 'n')
      local b = tonumber(p[1]) or 0
      if math.max(tonumber(p[3]) or 0, b + cap) <= now then p, b = {}, 0 end
      local cost = ARGV[2]
      if b > now then
        -- A peek (cost 0) asks when a request of one unit would pass.
        if cost + 0 == 0 then ARGV[2] = '1' end
        local r = inner(KEYS, ARGV, true)
        ARGV[2] = cost
        local pass = passes_at(b, r, now)
        reply = {2, r[2], math.min(r[3], r[2]), pass, pass - now, now, r[7]}
      else
        reply = inner(KEYS, ARGV, dry_run)
        if reply[1] == 0 and not dry_run and cost + 0 > 0 then
          local s, e, blocks = tonumber(p[2]) or 0, tonumber(p[3]) or 0, tonumber(p[4]) or 0
          local span, block = ARGV[penalty + 1] + 0, ARGV[penalty + 2] + 0
          if e > now then s = s + 1 else s, e = 1, now + span end
          if s >= strikes then
            b = now + math.floor(math.min(block * 2 ^ blocks, cap))
            blocks, s = blocks + 1, 0
            local pass = passes_at(b, reply, now)
            reply = {3, reply[2], math.min(reply[3], reply[2]), pass, pass - now, now, reply[7]}
          end
          redis.call('HSET', box, 'b', string.format('%d', b), 's', s,
            'e', string.format('%d', e), 'n', blocks)
          local keep = math.max(e, b + cap)
          redis.call('PEXPIRE', box, string.format('%d', math.ceil((keep - now) / 1000) + 1000))
        end
      end
    else
      reply = inner(KEYS, ARGV, dry_run)
    end

    if override then KEYS[#KEYS + 1] = override end
    if box then KEYS[#KEYS + 1] = box end
    return reply
  end
end
decide = with_caller(decide)
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
