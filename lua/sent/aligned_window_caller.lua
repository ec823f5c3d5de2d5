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
-- tollgate: a fixed window aligned on the Unix epoch, over one or more
-- quotas, all-or-nothing, as limits (Python) and Upstash ship it.
-- Mirrors src/strategy/aligned_window.rs; change both together.
--
-- A quota's windows start at multiples of its length since the epoch, so
-- every server and every client knows `Reset` in advance ("1,000 per UTC
-- day, reset at midnight"). The window's end is stored beside its counter,
-- and a stored count belongs to the window whose end is stored: a count of
-- an earlier window reads as zero, expired or not (replicas do not expire
-- keys). Keys expire one second after their window ends; expiry only
-- cleans up. A refund is the fixed window's (lua/fixed_window_refund.lua).
--
-- KEYS[i]      hash for quota i: c = units spent, r = window end (µs since epoch)
-- ARGV[1]      now, µs since epoch; -1 reads Redis TIME (one clock for all app servers)
-- ARGV[2]      cost in units; 0 looks without writing (the peek reuses this script)
-- ARGV[1+2i]   quota i's limit, in units
-- ARGV[2+2i]   quota i's window, in µs (windows end at its multiples)
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

local now = ARGV[1] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local cost = ARGV[2] + 0
local n = #KEYS

-- Each quota's current window ends at the next multiple of its length.
local count, reset, limit, open = {}, {}, {}, {}
for i = 1, n do
  limit[i] = ARGV[1 + 2 * i] + 0
  local window = ARGV[2 + 2 * i] + 0
  reset[i] = now - now % window + window
  local stored = redis.call('HMGET', KEYS[i], 'c', 'r')
  local c = tonumber(stored[1])
  if c and tonumber(stored[2]) == reset[i] then
    count[i], open[i] = c, true
  else
    count[i], open[i] = 0, false
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
-- tollgate: a charging decision script's reply as one string of 8-byte
-- big-endian integers, as lua/packed.lua makes it, unless the call came
-- too late. The store puts the decision script before this file, as the
-- function `decide(KEYS, ARGV, dry_run)` (run here with `dry_run` false:
-- it charges), and folds the deadline into the script's own `now`:
--
-- ARGV[1]   -1: read Redis TIME, no deadline; below -1: read Redis TIME, and
--           -ARGV[1] is `until`, the Redis time (µs) after which no one
--           waits for the answer; 0 or more: the store's own clock's now
--           (µs), with no deadline
--
-- A call Redis runs after `until` (Redis was frozen, or busy, while the
-- request's deadline passed and the layer decided without it) writes
-- nothing and replies {-2, now}: its request was already answered, and
-- charging it would count a request twice. Folded into `now`, the deadline
-- costs no argument of its own, and TIME is still read once: the `now`
-- read here is handed on as a number, which the script's `ARGV[1] + 0`
-- takes as it is.
local now = ARGV[1] + 0
if now < -1 then
  local t = redis.call('TIME')
  local at = t[1] * 1000000 + t[2]
  if at > -now then return struct.pack('>ll', -2, at) end
  ARGV[1] = at
end
local reply = decide(KEYS, ARGV, false)
if type(reply) == 'table' and reply.err == nil then
  return struct.pack('>' .. string.rep('l', #reply), unpack(reply))
end
return reply
