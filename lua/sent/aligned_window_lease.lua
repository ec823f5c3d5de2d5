local function decide(KEYS, ARGV, dry_run)
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
-- tollgate: an aligned window's decision that also leases a hot caller a
-- slice of its budget (one quota). Mirrors src/strategy/lease.rs and
-- lua/aligned_window.lua; change them together. As
-- lua/fixed_window_lease.lua, with windows that end at multiples of their
-- length since the epoch; what is unspent goes back with
-- lua/fixed_window_refund.lua.
--
-- KEYS[1]   hash: c = units spent (leases included), r = window end (µs since epoch)
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME (lua/timed.lua folds the
--           deadline in)
-- ARGV[2]   cost in units, at least 1
-- ARGV[3]   the quota's limit, in units
-- ARGV[4]   the quota's window, in µs (windows end at its multiples)
-- ARGV[5]   units wanted for the lease, beyond `cost`
--
-- Reply, integers only:
--   {allowed 1|0, limit, used (the lease included), reset_at µs, retry_after
--    µs or -1, now µs, quota 0, [on a pass: window end (the refund stamp),
--    units leased]}
--
-- `int` comes from lua/prelude.lua, which the store puts first.

local now = ARGV[1] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local cost = ARGV[2] + 0
local limit = ARGV[3] + 0
local window = ARGV[4] + 0
local r = now - now % window + window
local stored = redis.call('HMGET', KEYS[1], 'c', 'r')
local c = tonumber(stored[1])
local open = c and tonumber(stored[2]) == r
if not open then c = 0 end
if c + cost > limit then
  return {0, limit, math.min(c, limit), r, r - now, now, 0}
end
local lease = math.min(ARGV[5] + 0, math.floor((limit - c - cost) / 2))
local charge = cost + lease
if open then
  redis.call('HINCRBY', KEYS[1], 'c', int(charge))
else
  redis.call('HSET', KEYS[1], 'c', int(charge), 'r', int(r))
  redis.call('PEXPIRE', KEYS[1], int(math.ceil((r - now) / 1000) + 1000))
end
return {1, limit, c + charge, r, -1, now, 0, r, lease}

end
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
