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

-- tollgate: several sliding-log decisions in one call, each log read and
-- written once: the `decide` and `flush` that lua/batch.lua (appended by the
-- store) calls. Mirrors lua/sliding_log.lua; change them together.
--
-- As lua/fixed_window_batch.lua does for its strategy: decisions run one
-- after the other, exactly as lua/sliding_log.lua would run them alone, but
-- what a log holds is read on its first use in the call (ZCOUNT of the
-- units inside the window and, if any, ZRANGE of the newest), kept here,
-- moved as the lone script's writes would move it, and written once at the
-- end. Nothing else can run in between, so the result is the same, and a
-- flood of one caller costs Redis one read and one write of each log per
-- call, not per request.
--
-- What the lone writes leave, and so what `flush` writes: each pass drops
-- the members at or below its cutoff, now - window (ZREMRANGEBYSCORE), adds
-- one member per unit scored `now` (ZADD) and sets the expiry, one second
-- after the newest entry leaves the window (PEXPIRE). Passes with one
-- cutoff add members above it, so together they leave what one
-- ZREMRANGEBYSCORE, one ZADD of all their members and the last one's
-- PEXPIRE leave: newest + window - now, that is newest - cutoff, with the
-- newest entry after the last pass (the script's clock is frozen, so that
-- deadline is the one it would have set mid-call).
--
-- A log's state here holds for the cutoff (now - window) it was read at:
-- every decision on Redis TIME shares one `now`, but one on the app's clock
-- may bring another cutoff, and then the log's pending writes go out and it
-- is read again. A rejection's Retry-After needs the k-th oldest unit inside
-- the window, which only Redis has: the log's pending writes go out first,
-- and the answer is kept until a pass moves the log, so a flood's
-- rejections ask once per call.
--
-- A key of another type fails its first read (ZCOUNT), inside `decide`,
-- before anything of that decision is kept, as it fails the lone script;
-- it is not remembered, so every decision on it fails. What a decision keeps
-- or charges, it does only after both logs are read.
--
-- Each decision's keys and arguments are lua/sliding_log.lua's; its two
-- keys are always two logs (the resource's and a consumer's).
-- `int` comes from lua/prelude.lua, `num` from lua/batch_prelude.lua.

-- Per log key: n, the units inside (cutoff, +inf); newest, the newest
-- entry's time while n > 0; cutoff, the one the state holds for (low, the
-- same as the ZCOUNT/ZRANGEBYSCORE bound, a string); adds, the members
-- the call's passes added, flat score/member pairs not yet written (none:
-- nothing to write); kth, the k-th oldest unit's time by k, since the last
-- pass.
local state, order = {}, {}

-- Writes what passes on `key` (state `s`) left pending, as their lone writes
-- would have left it. ZADD takes at most 500 members at a time, as alone:
-- `unpack` has a bounded stack.
local function write_out(key, s)
  local adds = s.adds
  local n = #adds
  if n == 0 then return end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(s.cutoff))
  for i = 1, n, 1000 do
    redis.call('ZADD', key, unpack(adds, i, math.min(i + 999, n)))
  end
  redis.call('PEXPIRE', key, int(math.ceil((s.newest - s.cutoff) / 1000) + 1000))
  s.adds = {}
end

-- The log `key` as a decision with cutoff `cutoff` sees it: read on first
-- use, and again (after writing what is pending) when the decision's cutoff
-- differs from the one it was read at.
local function log_of(key, cutoff)
  local s = state[key]
  if s ~= nil then
    if s.cutoff == cutoff then return s end
    write_out(key, s)
  end
  local low = '(' .. int(cutoff)
  local n = redis.call('ZCOUNT', key, low, '+inf')
  local newest = nil
  if n > 0 then
    newest = tonumber(redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2])
  end
  if s == nil then order[#order + 1] = key end
  s = {n = n, newest = newest, cutoff = cutoff, low = low, adds = {}}
  state[key] = s
  return s
end

-- How long until `cost` more units fit the log `key` (state `s`) with
-- `limit` and `window` at `now`, nil if they fit now: until enough of its
-- oldest units leave the window; a cost above the limit never fits, and
-- waits for the whole log instead (lua/sliding_log.lua).
local function wait_for(key, s, cost, limit, window, now)
  local n = s.n
  if n + cost <= limit then return nil end
  local free = math.min(n + cost - limit, n)
  if free <= 0 then return window end
  local kth = s.kth
  if kth == nil then
    kth = {}
    s.kth = kth
  end
  local at = kth[free]
  if at == nil then
    write_out(key, s)
    at = tonumber(redis.call('ZRANGEBYSCORE', key, s.low, '+inf',
      'WITHSCORES', 'LIMIT', int(free - 1), '1')[2])
    kth[free] = at
  end
  return at + window - now
end

-- A log (state `s`) that `cost` units at `now` went into.
local function grown(s, now, cost)
  s.n = s.n + cost
  if s.newest == nil or s.newest < now then s.newest = now end
  s.kth = nil
end

-- Strings that every pass of a flood would format again, each formatted
-- once (a number's formatting costs Redis's Lua a C sprintf): the score of
-- the last `now` charged, and each unit's number.
local last_now, last_score, units = nil, nil, {}

-- What a pass's lone writes do to both logs (states `s1`, `s2`): `cost`
-- members each, scored `now` and named "<time>:<request id>:<unit>" (the
-- expiry follows from the newest entry: see above).
local function charge(s1, s2, now, cost, id)
  if now ~= last_now then last_now, last_score = now, int(now) end
  local score = last_score
  local stem = score .. ':' .. id .. ':'
  local adds1, adds2 = s1.adds, s2.adds
  local m1, m2 = #adds1, #adds2
  for unit = 0, cost - 1 do
    local name = units[unit]
    if name == nil then
      name = tostring(unit)
      units[unit] = name
    end
    local member = stem .. name
    adds1[m1 + 1], adds1[m1 + 2] = score, member
    adds2[m2 + 1], adds2[m2 + 2] = score, member
    m1, m2 = m1 + 2, m2 + 2
  end
  grown(s1, now, cost)
  grown(s2, now, cost)
end

-- When the log is empty again.
local function reset(s, window, now)
  if s.newest then return s.newest + window end
  return now
end

-- One decision: KEYS[k + 1] (the resource's log) and KEYS[k + 2] (this
-- consumer's), arguments ARGV[a + 1 ..] (see lua/batch.lua), `now` from
-- Redis TIME or nil, and `fresh`, the request id when it is not the
-- argument's.
local function decide(k, _, a, _, now, fresh)
  now = now or num(ARGV[a + 1])
  local cost = num(ARGV[a + 2])
  local id = fresh or ARGV[a + 3]
  local limit1, window1 = num(ARGV[a + 4]), num(ARGV[a + 5])
  local limit2, window2 = num(ARGV[a + 6]), num(ARGV[a + 7])
  local key1, key2 = KEYS[k + 1], KEYS[k + 2]
  local s1 = log_of(key1, now - window1)
  local s2 = log_of(key2, now - window2)

  -- The rejecting log that frees up last decides Retry-After; on a tie, the
  -- resource's.
  local wait1 = wait_for(key1, s1, cost, limit1, window1, now)
  local wait2 = wait_for(key2, s2, cost, limit2, window2, now)
  if wait2 and not (wait1 and wait1 >= wait2) then
    return struct.pack('>Hlllllll', 7, 0, limit2, math.min(s2.n, limit2),
      reset(s2, window2, now), wait2, now, 1)
  end
  if wait1 then
    return struct.pack('>Hlllllll', 7, 0, limit1, math.min(s1.n, limit1),
      reset(s1, window1, now), wait1, now, 0)
  end

  if cost > 0 then charge(s1, s2, now, cost, id) end

  -- When both fit, report the one with the least left.
  if limit2 - s2.n < limit1 - s1.n then
    return struct.pack('>Hlllllllll', 9, 1, limit2, s2.n, reset(s2, window2, now), -1, now, 1,
      now, tonumber(id))
  end
  return struct.pack('>Hlllllllll', 9, 1, limit1, s1.n, reset(s1, window1, now), -1, now, 0,
    now, tonumber(id))
end

-- Writes what the call's passes left pending on each log.
local function flush()
  for _, key in ipairs(order) do write_out(key, state[key]) end
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
