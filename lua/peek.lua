-- tollgate: the no-writes twin of a decision script, for peeks and replica
-- pre-checks. The store puts the decision script before this file as the
-- function `decide(KEYS, ARGV, dry_run)`, flags the whole `no-writes`, and
-- passes `dry_run` true here: the script then decides as if charging the
-- cost it is given and writes nothing. Its reply is packed as
-- lua/packed.lua packs it.
local reply = decide(KEYS, ARGV, true)
if type(reply) == 'table' and reply.err == nil then
  return struct.pack('>' .. string.rep('l', #reply), unpack(reply))
end
return reply
