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
