-- tollgate: forget a caller's state under one policy, whatever its
-- strategy: the operator's unblock. One DEL of every key named, so the
-- caller's quotas are cleared together or not at all.
--
-- KEYS[i]   a key of the caller's own state (never a key every caller shares)
--
-- Reply: how many keys existed.
return redis.call('DEL', unpack(KEYS))
