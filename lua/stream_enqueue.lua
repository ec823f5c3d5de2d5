-- tollgate: admit a job into a bounded Redis Stream (the leaky bucket as a
-- work queue). The length check and the append are one atomic step, so two
-- app servers never both take the last place. Entries count until a worker
-- finishes them (XACK + XDEL), so the bound covers waiting and running work.
-- Every push refreshes the stream's expiry; consumer groups live inside the
-- key and expire with it.
--
-- KEYS[1]   stream
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME (recorded as field `at`)
-- ARGV[2]   capacity: entries the stream may hold
-- ARGV[3]   expiry after this push, ms
-- ARGV[4..] field name, value, name, value, ... (binary-safe)
--
-- Reply, integers only:
--   {accepted 1|0, length after the push, now µs,
--    entry id's milliseconds part or -1, entry id's sequence part or -1}

-- A number as Redis should store it: every digit, never an exponent. An
-- integer, nearly every number here, takes '%d': Redis's Lua formats it
-- in half the time '%.0f' takes.
local function int(x)
  if x % 1 == 0 and x < 2^53 and x > -2^53 then return string.format('%d', x) end
  return string.format('%.0f', x)
end

-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local now = ARGV[1] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local capacity = ARGV[2] + 0

local len = redis.call('XLEN', KEYS[1])
if len >= capacity then
  return {0, len, now, -1, -1}
end

local fields = {'at', int(now)}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local ms, seq = string.match(id, '^(%d+)-(%d+)$')
return {1, len + 1, now, tonumber(ms), tonumber(seq)}
