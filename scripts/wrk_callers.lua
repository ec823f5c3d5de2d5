-- wrk: who sends each request, for scripts/load.sh and scripts/callgrind.sh.
-- WRK_CALLERS: empty (no X-Api-Key), hot (one caller) or zipf (a crowd).
local callers = os.getenv("WRK_CALLERS") or ""
if callers == "hot" then
  wrk.headers["X-Api-Key"] = "hot"
elseif callers == "zipf" then
  -- Caller i (1..n) asks with probability proportional to 1 / i^s: a few
  -- hot keys and a long tail of rare ones. The cumulative table is built
  -- once per thread; each request draws with a binary search.
  local n = tonumber(os.getenv("WRK_ZIPF_N") or "10000")
  local s = tonumber(os.getenv("WRK_ZIPF_S") or "1")
  local cdf, total = {}, 0
  for i = 1, n do
    total = total + 1 / i ^ s
    cdf[i] = total
  end
  for i = 1, n do cdf[i] = cdf[i] / total end
  math.randomseed(os.time())
  request = function()
    local u, lo, hi = math.random(), 1, n
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if cdf[mid] < u then lo = mid + 1 else hi = mid end
    end
    wrk.headers["X-Api-Key"] = "caller-" .. lo
    return wrk.format()
  end
end
