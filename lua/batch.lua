-- tollgate: several decisions of one strategy in one script call.
--
-- The store puts a decision script before this file, wrapped as
-- `decide(KEYS, ARGV)` with an empty `flush()`, so each decision runs exactly
-- the code it would run alone, one after the other, atomically. A strategy
-- may instead bring its own `decide(keys, args)` and `flush()` (called once,
-- after every decision), as lua/fixed_window_batch.lua does.
-- Redis TIME is read once for the whole call and given to every decision
-- that asked for it (its ARGV[1] is -1): one clock for all of them.
--
-- KEYS         every decision's keys, one decision after the other
-- ARGV[1]      n, the number of decisions
-- then for each decision: its key count, its argument count, its arguments
--
-- Reply: n replies, each what the decision script returns alone (integers
-- only), or {'err', message} if it failed; the others still count. (Not an
-- error reply: clients fail a whole reply that holds one.)

local now = nil
local out, k, a = {}, 0, 2
for c = 1, tonumber(ARGV[1]) do
  local nk, na = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local keys, args = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do args[i] = ARGV[a + i - 1] end
  k, a = k + nk, a + na
  if args[1] == '-1' then
    if now == nil then
      local t = redis.call('TIME')
      now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
    end
    args[1] = now
  end
  local ok, reply = pcall(decide, keys, args)
  if ok then
    out[c] = reply
  elseif type(reply) == 'table' and reply.err then
    out[c] = {'err', reply.err}
  else
    out[c] = {'err', tostring(reply)}
  end
end
flush()
return out
