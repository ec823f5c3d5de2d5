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

-- tollgate: several leaky-bucket decisions in one call, each key read and
-- written once: the `decide` and `flush` that lua/batch.lua (appended by the
-- store) calls. Mirrors lua/leaky_bucket.lua; change them together.
--
-- As lua/gcra_batch.lua does for GCRA: decisions run one after the other,
-- exactly as lua/leaky_bucket.lua would run them alone, but a key's
-- next_free is read on its first use in the call, kept here as a number, and
-- written back once at the end with the expiry of the last pass. A flood of
-- one caller costs Redis one GET and one SET per call, with no table, string
-- or number conversion per decision.
--
-- Each decision's keys and arguments are lua/leaky_bucket.lua's.
-- `num`, `kept` and `write_back` come from lua/batch_prelude.lua.

-- ceil(a / b) for non-negative integers below 2^53 (see lua/leaky_bucket.lua).
local function ceil_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  if q * b < a then q = q + 1 end
  return q
end

-- One decision: KEYS[k + 1], arguments ARGV[a + 1 ..] (see lua/batch.lua),
-- `now` from Redis TIME or nil.
local function decide(k, _, a, _, now)
  now = now or num(ARGV[a + 1])
  local cost, capacity, interval = num(ARGV[a + 2]), num(ARGV[a + 3]), num(ARGV[a + 4])
  local s = kept(KEYS[k + 1])
  local free_at = s.value
  if not free_at or free_at <= now then free_at = now end
  local level = free_at - now
  local full = capacity * interval
  local after = level + cost * interval
  if after > full then
    local used = math.min(ceil_div(level, interval), capacity)
    return struct.pack('>Hlllllll', 7, 0, capacity, used, free_at, after - full, now, 0)
  end
  local finish = free_at + cost * interval
  if cost > 0 then
    s.value, s.px = finish, math.ceil((finish - now) / 1000) + 1000
  end
  return struct.pack('>Hlllllllll', 9, 1, capacity, ceil_div(after, interval), finish, -1, now, 0,
    finish, level)
end

-- Writes back each next_free a pass moved, with the last pass's expiry.
local flush = write_back

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
