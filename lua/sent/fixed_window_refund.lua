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
-- tollgate: give back (or, settling, charge) units of a fixed-window pass:
-- a 304, any response the layer's refund predicate frees, or a response
-- whose actual cost differs from what was charged. Only the window that
-- was charged moves; a window that rolled over since is left alone. Never
-- below zero; a charge is not checked against the limit (the units were
-- spent). HINCRBY keeps the key's expiry.
--
-- KEYS[i]    hash for quota i (as in fixed_window.lua)
-- ARGV[1]    units to give back; negative: units to charge
-- ARGV[1+i]  window end (µs) that quota i was charged in: the receipt's stamp
--
-- Reply: number of quotas moved (integer).

-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local cost = ARGV[1] + 0
local refunded = 0
for i = 1, #KEYS do
  local stored = redis.call('HMGET', KEYS[i], 'c', 'r')
  local c, r = tonumber(stored[1]), tonumber(stored[2])
  if c and r and r == (ARGV[1 + i] + 0) then
    local back = math.min(cost, c)
    if back ~= 0 then
      redis.call('HINCRBY', KEYS[i], 'c', -back)
      refunded = refunded + 1
    end
  end
end
return refunded
