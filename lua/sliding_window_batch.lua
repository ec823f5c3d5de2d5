-- tollgate: several sliding-window-counter decisions in one call, each key
-- read and written once: the `decide` and `flush` that lua/batch.lua
-- (appended by the store) calls. Mirrors lua/sliding_window.lua; change them
-- together.
--
-- As lua/fixed_window_batch.lua does for its strategy: decisions run one
-- after the other, exactly as lua/sliding_window.lua would run them alone,
-- but a key's hash (s, c, p) is read on its first use in the call, kept here
-- as numbers, changed as the lone script's writes would change it, and
-- written back once at the end. Nothing else can run in between, so the
-- result is the same, and a flood of one caller costs Redis one HMGET and
-- one write per key per call, not per request.
--
-- What the lone writes leave, and so what `flush` writes: a decision that
-- rolls a key's window over sets s, c and p (HSET) and the expiry (PEXPIRE);
-- one inside the stored window only adds to c (HINCRBY), keeping s, p and
-- the expiry. So a key some decision of the call rolled over gets its final
-- s, c, p and the expiry of the last such decision (a later HINCRBY keeps
-- it; the script's clock is frozen, so the deadline is the one it would have
-- set mid-call); any other key only gets its count raised by what the call
-- added to it.
--
-- Each decision's keys and arguments are lua/sliding_window.lua's.
-- `int` comes from lua/prelude.lua, `num` from lua/batch_prelude.lua.

-- Per key, what Redis would hold after the call's decisions so far: s (nil
-- while the key has none), c, p; `added`, what the call's HINCRBYs would
-- have added (written back alone when no decision rolled the window over);
-- `px`, the expiry of the call's last roll-over, if any.
local state, order = {}, {}

-- The state of `key`, read on its first use in the call. A key of another
-- type fails HMGET here, inside `decide`, as it fails the lone script; it is
-- not remembered, so every decision on it fails.
local function key_state(key)
  local st = state[key]
  if st == nil then
    local stored = redis.call('HMGET', key, 's', 'c', 'p')
    st = {s = tonumber(stored[1]), c = tonumber(stored[2]) or 0, p = tonumber(stored[3]) or 0,
      added = 0}
    state[key] = st
    order[#order + 1] = key
  end
  return st
end

local function weighted(prev, window, elapsed)
  return prev * ((window - elapsed) / window)
end

-- The smallest x in lo..hi with weighted(p, w, x) <= room; it holds at hi
-- and stays true (lua/sliding_window.lua's `first` with its `fits`).
local function first(lo, hi, p, w, room)
  while lo < hi do
    local mid = lo + math.floor((hi - lo) / 2)
    if weighted(p, w, mid) <= room then hi = mid else lo = mid + 1 end
  end
  return lo
end

-- One quota as the lone script sees it at `now`, from the key's state `st`:
-- start, cur, prev, whether the stored window is current (same), used,
-- whether the request fits, and when it does.
local function quota(st, now, cost, limit, w)
  local start = now - math.fmod(now, w)
  local s = st.s
  local elapsed = now - start
  local cur, prev, same = 0, 0, false
  if s and s > start then
    start, cur, prev, elapsed, same = s, st.c, st.p, 0, true
  elseif s == start then
    cur, prev, same = st.c, st.p, true
  elseif s and s + w == start then
    prev = st.c
  end
  local pw = weighted(prev, w, elapsed)
  local used = cur + math.ceil(pw)
  local room = limit - cur - cost
  local fits = room >= 0 and pw <= room
  local fits_at
  if fits then
    fits_at = now
  elseif cost > limit then
    -- Never fits; the counters are clear at the end of the next window.
    fits_at = start + 2 * w
  elseif room >= 0 then
    -- Fits later in this window, once the previous one weighs less.
    fits_at = start + first(elapsed + 1, w, prev, w, room)
  else
    -- Fits in the next window, once this one (then the previous) weighs less.
    fits_at = start + w + first(1, w, cur, w, limit - cost)
  end
  return start, cur, prev, same, used, fits, fits_at
end

-- When the estimate is back to zero.
local function reset(cur, prev, start, w, now)
  if cur > 0 then return start + 2 * w end
  if prev > 0 then return start + w end
  return now
end

-- What the lone script's write for one quota that passed with cost > 0
-- leaves in Redis: inside the stored window HINCRBY adds to c and keeps s,
-- p and the expiry; else HSET sets s, c, p and PEXPIRE the expiry.
local function charge(st, same, start, cur, prev, w, now, cost)
  if same then
    st.c, st.added = st.c + cost, st.added + cost
  else
    st.s, st.c, st.p = start, cur, prev
    st.px = math.ceil((start + 2 * w - now) / 1000) + 1000
  end
end

-- One decision: keys KEYS[k + 1 .. k + n], arguments ARGV[a + 1 ..] (see
-- lua/batch.lua), `now` from Redis TIME or nil.
local function decide(k, n, a, _, now)
  now = now or num(ARGV[a + 1])
  local cost = num(ARGV[a + 2])
  if n == 1 then
    -- One quota, the common case: no tables but the key's, and the reply
    -- packed here (see lua/batch.lua) without a table in between.
    local limit, w = num(ARGV[a + 3]), num(ARGV[a + 4])
    local st = key_state(KEYS[k + 1])
    local start, cur, prev, same, used, fits, fits_at = quota(st, now, cost, limit, w)
    if not fits then
      return struct.pack('>Hlllllll', 7, 0, limit, math.min(used, limit),
        reset(cur, prev, start, w, now), fits_at - now, now, 0)
    end
    if cost > 0 then
      cur = cur + cost
      charge(st, same, start, cur, prev, w, now, cost)
    end
    return struct.pack('>Hllllllll', 8, 1, limit, used + cost, reset(cur, prev, start, w, now),
      -1, now, 0, start)
  end
  -- Every quota is judged on the state before this decision's writes, as the
  -- lone script reads every key before it writes any (a key named twice).
  local limit, window, st, start, cur, prev, same, used, fits, fits_at =
    {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
  for i = 1, n do
    limit[i], window[i] = num(ARGV[a + 1 + 2 * i]), num(ARGV[a + 2 + 2 * i])
    st[i] = key_state(KEYS[k + i])
    start[i], cur[i], prev[i], same[i], used[i], fits[i], fits_at[i] =
      quota(st[i], now, cost, limit[i], window[i])
  end
  -- The rejecting quota that lets this request through last decides.
  local rejected = nil
  for i = 1, n do
    if not fits[i] and (rejected == nil or fits_at[i] > fits_at[rejected]) then rejected = i end
  end
  if rejected then
    local i = rejected
    return {0, limit[i], math.min(used[i], limit[i]),
      reset(cur[i], prev[i], start[i], window[i], now), fits_at[i] - now, now, i - 1}
  end
  if cost > 0 then
    for i = 1, n do
      cur[i] = cur[i] + cost
      charge(st[i], same[i], start[i], cur[i], prev[i], window[i], now, cost)
    end
  end
  -- When all fit, report the quota with the least left.
  local report = 1
  for i = 2, n do
    if limit[i] - used[i] < limit[report] - used[report] then report = i end
  end
  local reply = {1, limit[report], used[report] + cost,
    reset(cur[report], prev[report], start[report], window[report], now), -1, now, report - 1}
  for i = 1, n do reply[7 + i] = start[i] end
  return reply
end

-- Writes back what the call's decisions changed: a key some decision rolled
-- over whole, with the last roll-over's expiry; any other only its count.
local function flush()
  for _, key in ipairs(order) do
    local st = state[key]
    if st.px then
      redis.call('HSET', key, 's', int(st.s), 'c', int(st.c), 'p', int(st.p))
      redis.call('PEXPIRE', key, int(st.px))
    elseif st.added > 0 then
      redis.call('HINCRBY', key, 'c', int(st.added))
    end
  end
end
