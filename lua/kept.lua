-- tollgate: a bucket's state in a batch (lua/gcra_batch.lua,
-- lua/leaky_bucket_batch.lua; the store puts it after lua/tat.lua, before
-- the batch's own file).
--
-- GCRA's TAT or the leaky bucket's next_free, with what refunds gave back
-- (lua/tat.lua): `kept(key)` is the key's state in this call, its `value`
-- and `given` read with GET on first use; a pass sets `value` and `px`, and
-- `write_back` then SETs each moved value once, with the last pass's expiry.
local kept_state, kept_order = {}, {}

local function kept(key)
  local s = kept_state[key]
  if s == nil then
    local value = redis.call('GET', key)
    s = {value = tonumber(value), given = 0}
    if value and not s.value then s.value, s.given = split_tat(value) end
    kept_state[key] = s
    kept_order[#kept_order + 1] = key
  end
  return s
end

local function write_back()
  for _, key in ipairs(kept_order) do
    local s = kept_state[key]
    if s.px then redis.call('SET', key, tat_value(s.value, s.given), 'PX', int(s.px)) end
  end
end
