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
-- Before those, when `at` > 0: an operator's cap on every caller, its
-- limit per quota, then how many (0: none). An override with a limit above
-- the cap's is set aside while the cap lasts.
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

-- Whether the override `v` has a limit above the cap's (`cap`, a limit
-- per quota): the quotas after `|` read `until limit window ...`, up to a
-- line break (after it, the operator's note, which no script reads).
local function above(v, cap)
  if not cap then return false end
  local i, q = 0, 0
  for x in string.gmatch(string.match(v, '|([^\n]*)') or '', '%S+') do
    i = i + 1
    if i % 2 == 0 then
      q = q + 1
      if cap[q] and x + 0 > cap[q] then return true end
    end
  end
  return false
end

local function with_caller(inner)
  return function(KEYS, ARGV, dry_run)
    local n, nk = #ARGV, #KEYS
    local at, penalty = ARGV[n] + 0, nil
    local last = n - 1
    if at < 0 then at, penalty, last = -at - 1, n - 4, n - 5 end
    local cap = nil
    if at > 0 then
      local count = ARGV[last] + 0
      if count > 0 then
        cap = {}
        for i = 1, count do cap[i] = ARGV[last - count + i - 1] + 0 end
      end
    end
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
        if untl and (untl + 0 == 0 or untl + 0 > now) and not above(v, cap) then
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
