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

-- The store's no-writes twin of this script (for peeks and pre-checks, which
-- may run on replicas) flips the line below to true: it then decides as if
-- charging `cost` and writes nothing.
local dry_run = false

local function int(x) return string.format('%.0f', x) end

local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local id = ARGV[3]

local n, limit, window, cutoff, newest = {}, {}, {}, {}, {}
for i = 1, 2 do
  limit[i] = tonumber(ARGV[2 + 2 * i])
  window[i] = tonumber(ARGV[3 + 2 * i])
  cutoff[i] = now - window[i]
  n[i] = redis.call('ZCOUNT', KEYS[i], '(' .. int(cutoff[i]), '+inf')
  if n[i] > 0 then
    newest[i] = tonumber(redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')[2])
  end
end
local function reset(i)
  if newest[i] then return newest[i] + window[i] end
  return now
end

-- The rejecting log that frees up last decides Retry-After: the wait until
-- enough of its oldest units leave the window. A cost above the limit never
-- fits, and waits for the whole log instead.
local rejected, retry = nil, 0
for i = 1, 2 do
  if n[i] + cost > limit[i] then
    local free = math.min(n[i] + cost - limit[i], n[i])
    local wait = window[i]
    if free > 0 then
      local kth = redis.call('ZRANGEBYSCORE', KEYS[i], '(' .. int(cutoff[i]), '+inf',
        'WITHSCORES', 'LIMIT', free - 1, 1)
      wait = tonumber(kth[2]) + window[i] - now
    end
    if rejected == nil or wait > retry then rejected, retry = i, wait end
  end
end
if rejected then
  local i = rejected
  return {0, limit[i], math.min(n[i], limit[i]), reset(i), retry, now, i - 1}
end

if cost > 0 then
  local score = int(now)
  for i = 1, 2 do
    n[i] = n[i] + cost
    newest[i] = math.max(newest[i] or now, now)
    if not dry_run then
      redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', int(cutoff[i]))
      local batch = {}
      for unit = 0, cost - 1 do
        batch[#batch + 1] = score
        batch[#batch + 1] = score .. ':' .. id .. ':' .. unit
        if #batch >= 1000 or unit == cost - 1 then
          redis.call('ZADD', KEYS[i], unpack(batch))
          batch = {}
        end
      end
      redis.call('PEXPIRE', KEYS[i], int(math.ceil((reset(i) - now) / 1000) + 1000))
    end
  end
end

-- When both fit, report the one with the least left.
local report = 1
if limit[2] - n[2] < limit[1] - n[1] then report = 2 end
return {1, limit[report], n[report], reset(report), -1, now, report - 1, now, tonumber(id)}
