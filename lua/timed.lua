-- tollgate: a charging decision script's reply as one string of 8-byte
-- big-endian integers, as lua/packed.lua makes it, unless the call came
-- too late. The store puts the decision script before this file, as the
-- function `decide(KEYS, ARGV, dry_run)` (run here with `dry_run` false:
-- it charges), and folds the deadline into the script's own `now`:
--
-- ARGV[1]   -1: read Redis TIME, no deadline; below -1: read Redis TIME, and
--           -ARGV[1] is `until`, the Redis time (µs) after which no one
--           waits for the answer; 0 or more: the store's own clock's now
--           (µs), with no deadline
--
-- A call Redis runs after `until` (Redis was frozen, or busy, while the
-- request's deadline passed and the layer decided without it) writes
-- nothing and replies {-2, now}: its request was already answered, and
-- charging it would count a request twice. Folded into `now`, the deadline
-- costs no argument of its own, and TIME is still read once: the `now`
-- read here is handed on as a number, which the script's `ARGV[1] + 0`
-- takes as it is.
local now = ARGV[1] + 0
if now < -1 then
  local t = redis.call('TIME')
  local at = t[1] * 1000000 + t[2]
  if at > -now then return struct.pack('>ll', -2, at) end
  ARGV[1] = at
end
local reply = decide(KEYS, ARGV, false)
if type(reply) == 'table' and reply.err == nil then
  return struct.pack('>' .. string.rep('l', #reply), unpack(reply))
end
return reply
