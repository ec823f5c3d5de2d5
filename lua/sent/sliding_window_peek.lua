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
