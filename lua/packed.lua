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
