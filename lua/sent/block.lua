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
local cap = ARGV[3] + 0
local p = redis.call('HMGET', KEYS[1], 'b', 'e')
local e = tonumber(p[2]) or 0
-- An entry past its keeping is none, its count of blocks forgotten.
if math.max(e, (tonumber(p[1]) or 0) + cap) <= now then
  redis.call('DEL', KEYS[1])
  e = 0
end
local b = now + ARGV[2]
redis.call('HSET', KEYS[1], 'b', string.format('%d', b), 's', 0, 'e', string.format('%d', e))
local keep = math.max(e, b + cap)
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((keep - now) / 1000) + 1000))
return 1
