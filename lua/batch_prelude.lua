-- tollgate: what every strategy's batch (lua/*_batch.lua) shares, beside
-- lua/prelude.lua; the store puts it after that one.

-- An ARGV string as a number, converted once per call: a flood sends the same
-- few numbers over and over, and Redis's Lua turns a string into a number
-- with strtod, which costs more than a table lookup. `arg + 0` converts once;
-- Lua 5.1's tonumber converts twice.
local numbers = {}

local function num(arg)
  local n = numbers[arg]
  if n == nil then
    n = arg + 0
    numbers[arg] = n
  end
  return n
end

-- For a strategy that keeps one number per key as a string (GCRA's TAT, with
-- what refunds gave back, lua/tat.lua; the leaky bucket's next_free):
-- `kept(key)` is the key's state in this call, its `value` (and `given`) read
-- with GET on first use; a pass sets `value` and `px`, and `write_back` then
-- SETs each moved value once, with the last pass's expiry.
local kept_state, kept_order = {}, {}

local function kept(key)
  local s = kept_state[key]
  if s == nil then
    local value, given = tat_of(redis.call('GET', key))
    s = {value = value, given = given}
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
