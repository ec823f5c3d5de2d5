-- tollgate: publish one app server's bloom filter for one slot (minute) of a
-- throttle, with an optimistic version check, or tell it what is stored.
-- See src/throttle/sync.rs.
--
-- The client ORs the stored bits into its own filter (it has to: the bits are
-- LZ4-compressed) and sends the result with the version it merged. If another
-- server wrote in between, nothing is written and the caller gets the new
-- value to merge next round: it gives up this round rather than retrying in a
-- loop, because the retry storm would grow with the number of servers.
--
-- KEYS[1]  hash for one slot: bits = encoded bit array, v = version (integer)
-- ARGV[1]  the version this server last merged; -1 when it saw no value
-- ARGV[2]  this server's merged bits, encoded; empty to only look for news
-- ARGV[3]  expiry in ms (the throttle's window plus one slot)
--
-- Reply:
--   {1, new version}         written
--   {0, version}             nothing sent, nothing new
--   {-1, version, bits}      the version moved: not written; here is the value
--   {-1, -1}                 the value is gone (expired, flushed): not written

-- A number as Redis should store it: every digit, never an exponent. An
-- integer, nearly every number here, takes '%d': Redis's Lua formats it
-- in half the time '%.0f' takes.
local function int(x)
  if x % 1 == 0 and x < 2^53 and x > -2^53 then return string.format('%d', x) end
  return string.format('%.0f', x)
end

local stored = redis.call('HMGET', KEYS[1], 'v', 'bits')
local version = tonumber(stored[1]) or -1
local expected = tonumber(ARGV[1])

if version ~= expected then
  if version < 0 or not stored[2] then return {-1, -1} end
  return {-1, version, stored[2]}
end
if ARGV[2] == '' then return {0, version} end

local next_version = math.max(version, 0) + 1
redis.call('HSET', KEYS[1], 'bits', ARGV[2], 'v', int(next_version))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, next_version}
