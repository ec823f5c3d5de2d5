-- tollgate: read a throttle's stored filters, once, when an app server starts,
-- so that it knows the callers of the whole window and not only of this slot.
-- Read-only. See src/throttle/sync.rs.
--
-- KEYS[i]  hash for one slot: bits = encoded bit array, v = version (integer)
--
-- Reply: {version 1, bits 1, version 2, bits 2, ...}, with -1 and an empty
-- string for a slot that has no value.

local reply = {}
for i = 1, #KEYS do
  local stored = redis.call('HMGET', KEYS[i], 'v', 'bits')
  local version = tonumber(stored[1])
  if version and stored[2] then
    reply[2 * i - 1], reply[2 * i] = version, stored[2]
  else
    reply[2 * i - 1], reply[2 * i] = -1, ''
  end
end
return reply
