-- tollgate: make sure a work queue's consumer group exists, reading from the
-- stream's first entry. MKSTREAM creates an empty stream when there is none;
-- it would have no expiry, so give it the queue's (a key is never left
-- without one). An existing group (BUSYGROUP) is fine.
--
-- KEYS[1]  stream
-- ARGV[1]  group name
-- ARGV[2]  expiry for a stream that has none, ms
--
-- Reply: 1 if the group was created, 0 if it existed (integer).

local created = 1
local r = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
if type(r) == 'table' and r.err then
  if not string.find(r.err, 'BUSYGROUP', 1, true) then
    return redis.error_reply(r.err)
  end
  created = 0
end
if redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return created
