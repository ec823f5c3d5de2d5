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
-- tollgate: release a concurrency-limit slot (the response body ended or was
-- dropped, or the request was cancelled). Mirrors concurrency::release.
-- ZREM keeps the key's expiry; an emptied set is deleted by Redis.
--
-- KEYS[1]  sorted set (as in concurrency.lua)
-- ARGV[1]  the request's id: the receipt's stamp
-- ARGV[2]  cost: how many members "<id>:0" .. "<id>:cost-1" it added
--
-- Reply: {members removed} (0 when they timed out already), integers as a
-- decision's, so releases batch as decisions do: lua/concurrency_batch.lua
-- runs this same release beside the checks, and a crowd's releases and
-- checks cost Redis one call, not one each. Change the two together.

-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local cost = ARGV[2] + 0
-- One slot, the common case, without a table to unpack.
if cost == 1 then return {redis.call('ZREM', KEYS[1], ARGV[1] .. ':0')} end

-- At most 1,000 members per ZREM: `unpack` has a bounded stack.
local removed, members = 0, {}
for i = 0, cost - 1 do
  members[#members + 1] = ARGV[1] .. ':' .. i
  if #members >= 1000 or i == cost - 1 then
    removed = removed + redis.call('ZREM', KEYS[1], unpack(members))
    members = {}
  end
end
return {removed}

end
-- tollgate: a give-back script's reply (the concurrency release) as one
-- string of 8-byte big-endian integers. The store puts the script before
-- this file, as the function `decide`; batches (lua/batch.lua) keep their
-- lines instead.
--
-- redis-rs parses an array reply value by value, some eight values per
-- decision; a string is one value, and Redis packs it for about what
-- converting the array would cost (see BENCHMARKS.md).
local reply = decide(KEYS, ARGV)
if type(reply) == 'table' and reply.err == nil then
  return struct.pack('>' .. string.rep('l', #reply), unpack(reply))
end
return reply
