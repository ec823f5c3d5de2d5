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
-- tollgate: what every strategy's batch (lua/*_batch.lua) shares, beside
-- lua/prelude.lua; the store puts it after that one.

-- An ARGV string as a number, converted once per call: a flood sends the same
-- few numbers over and over, and Redis's Lua turns a string into a number
-- with strtod, which costs more than a table lookup. `arg + 0` converts once;
-- Lua 5.1's tonumber converts twice.
local numbers = {}

local function num(arg)
  local n = numbers[arg]
  if n == nil then
    n = arg + 0
    numbers[arg] = n
  end
  return n
end

-- For a strategy that keeps one number per key as a string (GCRA's TAT, the
-- leaky bucket's next_free): `kept(key)` is the key's state in this call,
-- its `value` read with GET on first use; a pass sets `value` and `px`, and
-- `write_back` then SETs each moved value once, with the last pass's expiry.
local kept_state, kept_order = {}, {}

local function kept(key)
  local s = kept_state[key]
  if s == nil then
    s = {value = tonumber(redis.call('GET', key))}
    kept_state[key] = s
    kept_order[#kept_order + 1] = key
  end
  return s
end

local function write_back()
  for _, key in ipairs(kept_order) do
    local s = kept_state[key]
    if s.px then redis.call('SET', key, int(s.value), 'PX', int(s.px)) end
  end
end

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

-- tollgate: several decisions of one strategy in one script call.
--
-- The store puts a strategy's `decide(k, nk, a, na, now, id)` and `flush()`
-- before this file. A decision's keys are KEYS[k + 1 .. k + nk], its
-- arguments ARGV[a + 1 .. a + na]; `now` is Redis TIME (µs) when the decision
-- asked for it (its first argument is -1), else nil. For most strategies
-- `decide` wraps the decision script and `flush` is empty, so each decision
-- runs exactly the code it would run alone, one after the other, atomically;
-- lua/fixed_window_batch.lua brings its own, which reads and writes each key
-- once per call (`flush` runs once, after every decision). Redis TIME is read
-- once for the whole call: one clock for every decision.
--
-- KEYS         every decision's keys, one decision after the other; a
--              decision that repeats the keys before it sends none
-- ARGV[1]      n, the number of decisions
-- ARGV[2]      until: the store time (µs, the decisions' clock) after which
--              no one waits for the earliest of them; 0 when the store
--              cannot tell. A charging decision the call reaches after it
--              writes nothing and replies {-2, now} (late), as
--              lua/timed.lua does for a lone call: the whole batch is then
--              late, as its first request's answer would be. A give-back
--              (a concurrency release: two arguments and no time) always
--              runs: giving back only lowers a count.
-- then for each decision: '=' when it has the keys and arguments of the
-- decision before (a flood of one caller); '#' and a request id when it
-- has them but for its own id (a flood of the sliding log or the
-- concurrency limit, whose `decide` takes the id given, if any, over its
-- argument's); else its key count (-1: the keys of the decision before,
-- sent once), its argument count (-1: the arguments of the decision
-- before, sent once) and arguments.
--
-- Reply: one string, each decision's reply packed after the one before: n
-- (2 bytes, big-endian, at least 1) and the n integers its script returns
-- alone, 8-byte big-endian; or, if it failed, a zero (2 bytes), the
-- message's length (2 bytes) and the message, its code first (e.g.
-- `WRONGTYPE ...`); the
-- other decisions still count. One string, not an array of arrays, because
-- Redis and the client then convert and parse one value per call instead of
-- some eight per decision, and an error reply would fail the whole call in
-- the client; packed, not formatted, because the client then reads each
-- integer with a load instead of parsing its digits.

local now = nil
local formats = {}

-- A reply table packed by one C call; a strategy's own `decide` may return
-- its reply packed already.
local function packed(reply)
  if type(reply) ~= 'table' then return reply end
  local n = #reply
  local f = formats[n]
  if f == nil then
    f = '>H' .. string.rep('l', n)
    formats[n] = f
  end
  return struct.pack(f, n, unpack(reply))
end

-- k: the keys used so far; a: the next decision's first argument. A
-- decision's keys are KEYS[kn + 1 .. kn + nk], its arguments ARGV[an + 1 ..
-- an + na].
local out, k, a = {}, 0, 3
local until_ = num(ARGV[2])
local kn, nk, an, na = 0, 0, 0, 0
-- id: the request id a '#' gave, kept by the '=' after it (the same
-- decision again), dropped by a decision that sends its arguments.
local id = nil
for c = 1, num(ARGV[1]) do
  local marker = ARGV[a]
  if marker == '=' then
    a = a + 1
  elseif marker == '#' then
    id = ARGV[a + 1]
    a = a + 2
  else
    id = nil
    if marker ~= '-1' then
      kn, nk = k, num(ARGV[a])
      k = k + nk
    end
    local count = num(ARGV[a + 1])
    a = a + 2
    if count >= 0 then
      an, na = a - 1, count
      a = a + count
    end
  end
  local t = nil
  if ARGV[an + 1] == '-1' then
    if now == nil then
      local time = redis.call('TIME')
      now = time[1] * 1000000 + time[2]
    end
    t = now
  end
  local ok, reply
  if until_ > 0 and na ~= 2 and (t or num(ARGV[an + 1])) > until_ then
    ok, reply = true, {-2, t or num(ARGV[an + 1])}
  else
    ok, reply = pcall(decide, kn, nk, an, na, t, id)
  end
  if ok then
    out[c] = packed(reply)
  else
    local message = type(reply) == 'table' and reply.err or tostring(reply)
    message = string.sub(message, 1, 65535)
    out[c] = struct.pack('>HHc0', 0, #message, message)
  end
end
flush()
return table.concat(out)
