-- tollgate: the `decide` and `flush` that lua/batch.lua calls for a strategy
-- without its own: the store puts the decision script before this file as
-- `run(KEYS, ARGV)`, and each decision runs it on its own keys and arguments,
-- exactly as it would run alone.

local function decide(k, nk, a, na, now)
  local keys, args = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do args[i] = ARGV[a + i] end
  if now then args[1] = now end
  return run(keys, args)
end

local function flush() end
