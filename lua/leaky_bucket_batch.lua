-- tollgate: several leaky-bucket decisions in one call, each key read and
-- written once: the `decide` and `flush` that lua/batch.lua (appended by the
-- store) calls. Mirrors lua/leaky_bucket.lua; change them together.
--
-- As lua/gcra_batch.lua does for GCRA: decisions run one after the other,
-- exactly as lua/leaky_bucket.lua would run them alone, but a key's
-- next_free is read on its first use in the call, kept here as a number, and
-- written back once at the end with the expiry of the last pass. A flood of
-- one caller costs Redis one GET and one SET per call, with no table, string
-- or number conversion per decision.
--
-- Each decision's keys and arguments are lua/leaky_bucket.lua's.
-- `num` comes from lua/batch_prelude.lua, `kept` and `write_back` from
-- lua/kept.lua.

-- ceil(a / b) for non-negative integers below 2^53 (see lua/leaky_bucket.lua).
local function ceil_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  if q * b < a then q = q + 1 end
  return q
end

-- One decision: KEYS[k + 1], arguments ARGV[a + 1 ..] (see lua/batch.lua),
-- `now` from Redis TIME or nil.
local function decide(k, _, a, _, now)
  now = now or num(ARGV[a + 1])
  local cost, capacity, interval = num(ARGV[a + 2]), num(ARGV[a + 3]), num(ARGV[a + 4])
  local s = kept(KEYS[k + 1])
  local free_at = s.value
  if not free_at or free_at <= now then free_at = now end
  local level = free_at - now
  local full = capacity * interval
  local after = level + cost * interval
  if after > full then
    local used = math.min(ceil_div(level, interval), capacity)
    return struct.pack('>Hlllllll', 7, 0, capacity, used, free_at, after - full, now, 0)
  end
  local finish = free_at + cost * interval
  if cost > 0 then
    s.value, s.px = finish, math.ceil((finish - now) / 1000) + 1000
  end
  return struct.pack('>Hlllllllllll', 11, 1, capacity, ceil_div(after, interval), finish, -1, now, 0,
    finish, s.given, interval, level)
end

-- Writes back each next_free a pass moved, with the last pass's expiry.
local flush = write_back
