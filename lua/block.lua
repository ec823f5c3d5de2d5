-- tollgate: an operator's block of one caller: its penalty-box entry (see
-- lua/caller.lua) set blocked until now + block, its strikes cleared and its
-- count of blocks kept, so a later block still doubles.
--
-- KEYS[1]   the caller's penalty-box key
-- ARGV[1]   now, µs since epoch; -1 reads Redis TIME
-- ARGV[2]   the block, µs
-- ARGV[3]   the policy's longest block (cap), µs: the entry is kept a cap
--           after the block ends
local now = ARGV[1] + 0
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local b = now + ARGV[2]
local e = tonumber(redis.call('HGET', KEYS[1], 'e')) or 0
redis.call('HSET', KEYS[1], 'b', string.format('%d', b), 's', 0, 'e', string.format('%d', e))
local keep = math.max(e, b + ARGV[3])
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((keep - now) / 1000) + 1000))
return 1
