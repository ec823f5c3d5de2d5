-- tollgate: a charging decision script's reply as one string of 8-byte
-- big-endian integers, as lua/packed.lua makes it, unless the call came
-- too late. The store puts the decision script before this file, as the
-- function `decide`, and sends one argument more than the script takes:
--
-- ARGV[#ARGV]  until: the store time (µs, the clock of ARGV[1]) after which
--              no one waits for the answer; 0 when the store cannot tell
--
-- A call Redis runs after `until` (Redis was frozen, or busy, while the
-- request's deadline passed and the layer decided without it) writes
-- nothing and replies {-2, now}: its request was already answered, and
-- charging it would count a request twice. The check is one comparison
-- against the `now` the script reads anyway: a `now` of -1 (Redis TIME) is
-- read here and handed on, so TIME is still read once.
local n = #ARGV
local until_ = ARGV[n] + 0
ARGV[n] = nil
if until_ > 0 then
  local now = ARGV[1] + 0
  if now < 0 then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
  if now > until_ then return struct.pack('>ll', -2, now) end
  -- Converted once: the script's own `ARGV[1] + 0` finds a number.
  ARGV[1] = now
end
local reply = decide(KEYS, ARGV)
if type(reply) == 'table' and reply.err == nil then
  return struct.pack('>' .. string.rep('l', #reply), unpack(reply))
end
return reply
