-- tollgate: a bucket's value (GCRA's TAT, the leaky bucket's next_free),
-- read and written by both strategies' scripts: the store puts this file
-- before each.
-- The value is the TAT, µs since epoch, or "TAT:GIVEN" once refunds of
-- charges with others behind them have moved it back GIVEN µs in all since
-- the key was made: a pass's receipt carries GIVEN, so a refund knows how
-- far others may have moved its charge up (src/strategy/bucket.rs says
-- why).

-- The TAT and GIVEN of a value "TAT:GIVEN". A script reads a plain TAT
-- with `tonumber` and calls this only when that fails: most keys never had
-- such a refund, and a call on every decision is measurable in Redis.
local function split_tat(value)
  local tat, given = string.match(value, '^(%d+):(%d+)$')
  return tonumber(tat), tonumber(given) or 0
end

-- The value to SET for `tat` and `given`.
local function tat_value(tat, given)
  if given > 0 then return int(tat) .. ':' .. int(given) end
  return int(tat)
end
