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
-- tollgate: Cloudflare's sliding-window counter over one or more quotas,
-- all-or-nothing. Mirrors src/strategy/sliding_window.rs line for line;
-- change both together. lua/sliding_window_batch.lua mirrors it for batches
-- (each key read and written once per call): change that one with it too.
--
-- Fixed windows are aligned on the epoch. Each key keeps the count of the
-- current window and of the previous one; the previous is weighted by how
-- much of it the sliding window still covers: a request fits when
-- prev * ((window - elapsed) / window) <= limit - cur - cost. That weight is
-- the one floating-point step, done in the same IEEE-754 operations as the
-- Rust model, so both stores decide alike. A stored window later than now's
-- (a clock that went back) stays current, with nothing of it elapsed.
-- Keys expire one second after the end of the next window; expiry only
-- cleans up.
--
-- KEYS[i]      hash for quota i: s = start of the current window (µs since
--              epoch), c = units spent in it, p = units spent in the one before
-- ARGV[1]      now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]      cost in units; 0 looks without writing (the peek reuses this script)
-- ARGV[1+2i]   quota i's limit, in units
-- ARGV[2+2i]   quota i's window, in µs
--
-- Reply, integers only:
--   {allowed 1|0, limit, used (current + weighted previous, rounded up),
--    reset_at µs (when the estimate is back to zero), retry_after µs or -1,
--    now µs, reported quota (0-based), [on a pass: window start of quota
--    1 .. n, the refund stamps]}
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

local function weighted(prev, window, elapsed)
  return prev * ((window - elapsed) / window)
end

-- The smallest x in lo..hi with fits(x); fits(hi) holds and stays true.
local function first(lo, hi, fits)
  while lo < hi do
    local mid = lo + math.floor((hi - lo) / 2)
    if fits(mid) then hi = mid else lo = mid + 1 end
  end
  return lo
end

local limit, window, start, cur, prev, used, fits, fits_at = {}, {}, {}, {}, {}, {}, {}, {}
-- Whether quota i's stored window is the current one.
local same = {}
for i = 1, n do
  limit[i] = ARGV[1 + 2 * i] + 0
  window[i] = ARGV[2 + 2 * i] + 0
  local w = window[i]
  start[i] = now - math.fmod(now, w)
  local stored = redis.call('HMGET', KEYS[i], 's', 'c', 'p')
  local s, c, p = tonumber(stored[1]), tonumber(stored[2]) or 0, tonumber(stored[3]) or 0
  local elapsed = now - start[i]
  cur[i], prev[i], same[i] = 0, 0, false
  if s and s > start[i] then
    start[i], cur[i], prev[i], elapsed, same[i] = s, c, p, 0, true
  elseif s == start[i] then
    cur[i], prev[i], same[i] = c, p, true
  elseif s and s + w == start[i] then
    prev[i] = c
  end
  local pw = weighted(prev[i], w, elapsed)
  used[i] = cur[i] + math.ceil(pw)
  local room = limit[i] - cur[i] - cost
  fits[i] = room >= 0 and pw <= room
  if fits[i] then
    fits_at[i] = now
  elseif cost > limit[i] then
    -- Never fits; the counters are clear at the end of the next window.
    fits_at[i] = start[i] + 2 * w
  elseif room >= 0 then
    -- Fits later in this window, once the previous one weighs less.
    local p0 = prev[i]
    fits_at[i] = start[i] + first(elapsed + 1, w, function(x) return weighted(p0, w, x) <= room end)
  else
    -- Fits in the next window, once this one (then the previous) weighs less.
    local c0, r = cur[i], limit[i] - cost
    fits_at[i] = start[i] + w + first(1, w, function(x) return weighted(c0, w, x) <= r end)
  end
end

-- When the estimate is back to zero.
local function reset(i)
  if cur[i] > 0 then return start[i] + 2 * window[i] end
  if prev[i] > 0 then return start[i] + window[i] end
  return now
end

-- The rejecting quota that lets this request through last decides.
local rejected = nil
for i = 1, n do
  if not fits[i] and (rejected == nil or fits_at[i] > fits_at[rejected]) then rejected = i end
end
if rejected then
  local i = rejected
  return {0, limit[i], math.min(used[i], limit[i]), reset(i), fits_at[i] - now, now, i - 1}
end

if cost > 0 then
  for i = 1, n do
    cur[i] = cur[i] + cost
  end
end
-- Inside the stored window only its count moves: HINCRBY keeps its start,
-- the previous count and the expiry set when it opened (its end does not
-- change), and formats no numbers: a fifth of a lone call in Redis.
-- The state written is the Rust model's either way.
if cost > 0 and not dry_run then
  for i = 1, n do
    if same[i] then
      redis.call('HINCRBY', KEYS[i], 'c', ARGV[2])
    else
      redis.call('HSET', KEYS[i], 's', int(start[i]), 'c', int(cur[i]), 'p', int(prev[i]))
      redis.call('PEXPIRE', KEYS[i], int(math.ceil((start[i] + 2 * window[i] - now) / 1000) + 1000))
    end
  end
end

-- When all fit, report the quota with the least left.
local report = 1
for i = 2, n do
  if limit[i] - used[i] < limit[report] - used[report] then report = i end
end
local reply = {1, limit[report], used[report] + cost, reset(report), -1, now, report - 1}
for i = 1, n do reply[7 + i] = start[i] end
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
