-- tollgate: a decision script's reply as one string of 8-byte big-endian
-- integers. The store puts the decision script before this file, as the
-- function `decide`; batches (lua/batch.lua) keep their lines instead.
--
-- redis-rs parses an array reply value by value, about a thousand
-- instructions each, some eight per decision; a string is one value, and
-- Redis packs it for what converting the array would cost (measured with
-- redis-server under callgrind: 64,059 against 64,124 instructions a call).
local reply = decide(KEYS, ARGV)
if type(reply) == 'table' and reply.err == nil then
  return struct.pack('>' .. string.rep('l', #reply), unpack(reply))
end
return reply
