-- tollgate: a worker finished entries: acknowledge them in its group and
-- delete them, so they leave the queue's length, in one round trip. Neither
-- command changes the stream's expiry.
--
-- KEYS[1]   stream
-- ARGV[1]   group name
-- ARGV[2..] entry ids
--
-- Reply: entries deleted (integer).

if #ARGV < 2 then return 0 end
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
return redis.call('XDEL', KEYS[1], unpack(ids))
