-- tollgate: give back (or, settling, charge) units of a sliding-window
-- pass. The units go back to (or are charged to) the window the pass was
-- charged in, whether it is still the current window or has since become
-- the previous one; never below zero; a charge is not checked against the
-- limit (the units were spent). HINCRBY keeps the key's expiry.
--
-- KEYS[i]      hash for quota i (as in sliding_window.lua)
-- ARGV[1]      units to give back; negative: units to charge
-- ARGV[1+i]    start (µs) of the window quota i was charged in: the receipt's stamp
-- ARGV[1+n+i]  quota i's window, µs
--
-- Reply: number of quotas moved (integer).

-- `ARGV[i] + 0` converts a string to a number once; Lua 5.1's tonumber
-- converts it twice (strtod each time).
local cost = ARGV[1] + 0
local n = #KEYS
local refunded = 0
for i = 1, n do
  local stored = redis.call('HMGET', KEYS[i], 's', 'c', 'p')
  local s, c, p = tonumber(stored[1]), tonumber(stored[2]) or 0, tonumber(stored[3]) or 0
  local stamp, window = ARGV[1 + i] + 0, ARGV[1 + n + i] + 0
  local field, have = nil, 0
  if s and s == stamp then
    field, have = 'c', c
  elseif s and s == stamp + window then
    field, have = 'p', p
  end
  local back = math.min(cost, have)
  if field and back ~= 0 then
    redis.call('HINCRBY', KEYS[i], field, -back)
    refunded = refunded + 1
  end
end
return refunded
