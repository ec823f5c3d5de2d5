-- tollgate: the operator's side of overrides, one command on one key: a
-- caller's override (a string in the caller's hash slot, which decisions
-- read; see lua/caller.lua) or the policy's list of overrides (a hash from
-- caller to override, which only operators read). The two live in
-- different slots, so each is its own call, and a write goes list first:
-- the list marks the caller pending ('?'), the override key is written,
-- then the list entry is confirmed. A write that stops half-way leaves a
-- pending entry, which a listing settles by reading the override key: the
-- list never misses an override in force.
--
-- KEYS[1]   the key
-- ARGV[1]   get | set | del (the override's key); list | add | remove (the list)
-- set:      ARGV[2] the value, ARGV[3] its expiry in ms (0: none; an
--           override without an end is configuration and never expires)
-- del:      the value deleted (nil if none)
-- add:      ARGV[2] the caller, ARGV[3] the override ('?' alone: pending)
-- remove:   ARGV[2] the caller
local op = ARGV[1]
if op == 'get' then return redis.call('GET', KEYS[1]) end
if op == 'set' then
  if ARGV[3] ~= '0' then return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
  return redis.call('SET', KEYS[1], ARGV[2])
end
if op == 'del' then
  local old = redis.call('GET', KEYS[1])
  redis.call('DEL', KEYS[1])
  return old
end
if op == 'list' then return redis.call('HGETALL', KEYS[1]) end
if op == 'add' then return redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]) end
if op == 'remove' then return redis.call('HDEL', KEYS[1], ARGV[2]) end
return redis.error_reply('override.lua: unknown operation ' .. tostring(op))
