-- tollgate: admit a job into a bounded Redis List (the gate only: a worker
-- that pops an element owns it; nothing is reclaimed if it crashes). The
-- length check and the push are one atomic step. Every push refreshes the
-- list's expiry. Workers RPOP / BRPOP from the other end (first in, first out).
--
-- KEYS[1]  list
-- ARGV[1]  now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]  capacity: elements the list may hold
-- ARGV[3]  expiry after this push, ms
-- ARGV[4]  the element (binary-safe)
--
-- Reply, integers only: {accepted 1|0, length after the push, now µs}

-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local now = ARGV[1] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end

local len = redis.call('LLEN', KEYS[1])
if len >= (ARGV[2] + 0) then
  return {0, len, now}
end
redis.call('LPUSH', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, len + 1, now}
