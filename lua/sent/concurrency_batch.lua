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

-- tollgate: several concurrency-limit decisions in one call, each key read
-- and written once: the `decide` and `flush` that lua/batch.lua (appended by
-- the store) calls. Mirrors lua/concurrency.lua; change them together.
--
-- Decisions run one after the other, exactly as lua/concurrency.lua would
-- run them alone, but a key's live count and newest start are read on its
-- first use in the call and kept here; the members a pass adds wait here
-- too, and go out in one ZADD at the end, with the stale entries' removal
-- and the expiry the last pass would set. Nothing else can run in between,
-- so the result is the same, and a crowd costs Redis a few calls per script
-- call rather than five per decision. A decision at another `now` (an app
-- clock) or timeout first writes out what waits and reads the key afresh.
--
-- Each decision's keys and arguments are lua/concurrency.lua's, or
-- lua/concurrency_release.lua's for a release (two arguments), which runs
-- here as it would alone.
-- `int` comes from lua/prelude.lua, `num` from lua/batch_prelude.lua.

local state, order = {}, {}

-- Writes out what the decisions so far left for key `s`: the removal of
-- stale entries (any decision that charges makes it), the members passes
-- added, and their expiry.
local function write_out(key, s)
  if s.remove then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(s.floor))
  end
  local members = s.members
  for first = 1, #members, 1000 do
    local args = {}
    for i = first, math.min(first + 999, #members) do
      args[#args + 1] = s.score
      args[#args + 1] = members[i]
    end
    redis.call('ZADD', key, unpack(args))
  end
  if s.px then
    redis.call('PEXPIRE', key, s.px)
  end
  s.remove, s.members, s.px = false, {}, nil
end

-- The state of `key` for a decision at `now` with `timeout`: read once, then
-- kept; read afresh (after writing out) when either differs.
local function state_of(key, now, timeout)
  local s = state[key]
  if s and s.now == now and s.timeout == timeout then return s end
  if s then write_out(key, s) end
  local floor = math.max(now - timeout, 0)
  local live = '(' .. int(floor)
  local count = redis.call('ZCOUNT', key, live, '+inf')
  local newest = nil
  if count > 0 then
    newest = tonumber(redis.call('ZREVRANGEBYSCORE', key, '+inf', live, 'WITHSCORES', 'LIMIT', '0', '1')[2])
  end
  -- stored: live entries in Redis (not waiting here); oldest: theirs, read
  -- when a rejection first needs it.
  -- score and ttl: what a pass writes, formatted once per state (a number's
  -- formatting costs Redis's Lua a C sprintf).
  local fresh = {now = now, timeout = timeout, floor = floor, live = live, score = int(now),
    ttl = int(math.ceil(timeout / 1000)), count = count, stored = count, newest = newest,
    remove = false, members = {}}
  if s == nil then order[#order + 1] = key end
  state[key] = fresh
  return fresh
end

-- A release (lua/concurrency_release.lua's keys and two arguments), run
-- as alone: what the decisions before it left waiting goes out first, and
-- the key is read afresh by the next decision on it. The store puts a
-- batch's releases ahead of its checks, so a crowd's releases and checks
-- share one script call.
local function release(key, id, cost)
  local s = state[key]
  if s then
    write_out(key, s)
    s.now = nil
  end
  if cost == 1 then return struct.pack('>Hl', 1, redis.call('ZREM', key, id .. ':0')) end
  local removed, members = 0, {}
  for i = 0, cost - 1 do
    members[#members + 1] = id .. ':' .. i
    if #members >= 1000 or i == cost - 1 then
      removed = removed + redis.call('ZREM', key, unpack(members))
      members = {}
    end
  end
  return struct.pack('>Hl', 1, removed)
end

-- One decision: KEYS[k + 1], arguments ARGV[a + 1 ..] (see lua/batch.lua),
-- `now` from Redis TIME or nil, and `fresh`, the request id when it is not
-- the argument's; or, with two arguments, a release.
local function decide(k, _, a, na, now, fresh)
  if na == 2 then return release(KEYS[k + 1], fresh or ARGV[a + 1], num(ARGV[a + 2])) end
  now = now or num(ARGV[a + 1])
  local cost, limit, timeout = num(ARGV[a + 2]), num(ARGV[a + 3]), num(ARGV[a + 4])
  local key = KEYS[k + 1]
  local s = state_of(key, now, timeout)
  if cost > 0 then s.remove = true end

  if s.count + cost > limit then
    local reset, retry = now, 1000000
    if s.newest then reset = s.newest + timeout end
    if s.count > 0 then
      -- The oldest live entry: Redis's, or one waiting here (started now).
      if s.stored > 0 and s.oldest == nil then
        s.oldest = tonumber(redis.call('ZRANGEBYSCORE', key, s.live, '+inf', 'WITHSCORES', 'LIMIT', '0', '1')[2])
      end
      local oldest = s.oldest
      if #s.members > 0 and now > s.floor and (oldest == nil or now < oldest) then
        oldest = now
      end
      retry = math.min(oldest + timeout - now, 1000000)
    end
    return struct.pack('>Hlllllll', 7, 0, limit, math.min(s.count, limit), reset, retry, now, 0)
  end

  local id = fresh or ARGV[a + 5]
  local count, newest = s.count, s.newest
  if cost == 1 then
    -- One slot, the common case: no number to format.
    s.members[#s.members + 1] = id .. ':0'
  elseif cost > 0 then
    local members = s.members
    for i = 0, cost - 1 do
      members[#members + 1] = id .. ':' .. i
    end
  end
  if cost > 0 then
    s.px = s.ttl
    count = count + cost
    if not newest or now > newest then newest = now end
    -- Entries started at the floor never count (now 0 on an app clock):
    -- the next decision does not see these, as alone it would not.
    if now > s.floor then s.count, s.newest = count, newest end
  end
  local reset = now
  if newest then reset = newest + timeout end
  -- Packed here, as lua/batch.lua would pack the table lua/concurrency.lua
  -- returns, without the table.
  return struct.pack('>Hllllllll', 8, 1, limit, count, reset, -1, now, 0, tonumber(id))
end

-- Writes out each key the decisions touched.
local function flush()
  for _, key in ipairs(order) do
    write_out(key, state[key])
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
