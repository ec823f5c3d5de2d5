-- tollgate: a bucket's value (GCRA's TAT, the leaky bucket's next_free),
-- read and written by both strategies' scripts: the store puts this file
-- before each.
-- The value is the TAT, µs since epoch, or "TAT:GIVEN" once refunds of
-- charges with others behind them have moved it back GIVEN µs in all since
-- the key was made: a pass's receipt carries GIVEN, so a refund knows how
-- far others may have moved its charge up (src/strategy/bucket.rs says
-- why).

-- The TAT and GIVEN of a value read with GET: nil and 0 for none.
local function tat_of(value)
  local at = tonumber(value)
  if at or not value then return at, 0 end
  local tat, given = string.match(value, '^(%d+):(%d+)$')
  return tonumber(tat), tonumber(given) or 0
end

-- The value to SET for `tat` and `given`.
local function tat_value(tat, given)
  if given > 0 then return int(tat) .. ':' .. int(given) end
  return int(tat)
end
