-- tollgate: the `decide` that lua/batch.lua calls for a strategy without its
-- own: the store puts the decision script before this file as
-- `run(KEYS, ARGV)`, and each decision runs it on its own keys and arguments,
-- exactly as it would run alone. The store adds `flush`: an empty one, or
-- lua/batch_cache.lua's.

local function decide(k, nk, a, na, now)
  local keys, args = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do args[i] = ARGV[a + i] end
  if now then args[1] = now end
  return run(keys, args)
end
