-- tollgate: a fixed window's decision that also leases a hot caller a slice
-- of its budget (one quota). Mirrors src/strategy/lease.rs and the fixed
-- window's one-quota path (lua/fixed_window.lua), and the lease branch of
-- lua/fixed_window_batch.lua, which runs it in a batch; change them together.
-- The decision itself is the fixed window's: the same check, the same
-- reply. On a pass it charges `cost` plus the lease, never more than half
-- of what the window has left after `cost` (the rest stays for the other
-- servers); the server then spends the lease in memory until the window
-- ends, and gives back what it did not spend with lua/fixed_window_refund.lua.
--
-- KEYS[1]   hash: c = units spent (leases included), r = window end (µs since epoch)
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME (lua/timed.lua folds the
--           deadline in)
-- ARGV[2]   cost in units, at least 1
-- ARGV[3]   the quota's limit, in units
-- ARGV[4]   the quota's window, in µs
-- ARGV[5]   units wanted for the lease, beyond `cost`: the caller's use on
--           the server over `span`
-- ARGV[6]   span, µs: with less of the window left than that, the lease
--           asks for the share of ARGV[5] the caller would spend before
--           the window ends (what is left unspent then is lost to it)
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
local stored = redis.call('HMGET', KEYS[1], 'c', 'r')
local c, r = tonumber(stored[1]), tonumber(stored[2])
local open = c and r and r > now
if not open then c, r = 0, now + (ARGV[4] + 0) end
if c + cost > limit then
  return {0, limit, math.min(c, limit), r, r - now, now, 0}
end
local want, span = ARGV[5] + 0, ARGV[6] + 0
if r - now < span then want = math.floor(want * (r - now) / span) end
local lease = math.min(want, math.floor((limit - c - cost) / 2))
local charge = cost + lease
if open then
  redis.call('HINCRBY', KEYS[1], 'c', int(charge))
else
  redis.call('HSET', KEYS[1], 'c', int(charge), 'r', int(r))
  redis.call('PEXPIRE', KEYS[1], int(math.ceil((r - now) / 1000) + 1000))
end
return {1, limit, c + charge, r, -1, now, 0, r, lease}
