-- tollgate: the `decide` that lua/batch.lua calls for a strategy without its
-- own: the store puts the decision script before this file as
-- `run(KEYS, ARGV, dry_run)`, and each decision runs it on its own keys and arguments,
-- exactly as it would run alone. The store adds an empty `flush`.

-- The tables of the decision before, reused when a decision repeats its
-- keys and arguments (a flood of one caller): the scripts only read them.
local last_keys, last_args, last = nil, nil, {}

local function decide(k, nk, a, na, now)
  if last_keys and last[1] == k and last[2] == nk and last[3] == a and last[4] == na
    and last[5] == now then
    return run(last_keys, last_args, false)
  end
  local keys, args = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do args[i] = ARGV[a + i] end
  if now then args[1] = now end
  last_keys, last_args, last = keys, args, {k, nk, a, na, now}
  return run(keys, args, false)
end
