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
-- tollgate: refund a sliding-log charge: remove the members that one pass
-- added to both logs. Members that already left a window are gone anyway.
-- Settling a pass to a smaller actual cost removes its members from that
-- unit on (ARGV[4]), so a later refund of the rest finds its own.
--
-- KEYS[1]   sorted set: the resource's log (as in sliding_log.lua)
-- KEYS[2]   sorted set: the consumer's log
-- ARGV[1]   units to give back (the pass's cost)
-- ARGV[2]   the pass's time, µs: the receipt's first stamp
-- ARGV[3]   the pass's request id: the receipt's second stamp
-- ARGV[4]   optional: the first unit to remove (default 0)
--
-- Reply: number of members removed (integer).

-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local cost = ARGV[1] + 0
local first = tonumber(ARGV[4]) or 0
local last = first + cost - 1
local removed = 0
for i = 1, #KEYS do
  local batch = {}
  for unit = first, last do
    batch[#batch + 1] = ARGV[2] .. ':' .. ARGV[3] .. ':' .. unit
    if #batch >= 1000 or unit == last then
      removed = removed + redis.call('ZREM', KEYS[i], unpack(batch))
      batch = {}
    end
  end
end
return removed
