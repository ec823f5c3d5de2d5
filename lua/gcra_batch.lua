-- tollgate: several GCRA decisions in one call, each key read and written
-- once: the `decide` and `flush` that lua/batch.lua (appended by the store)
-- calls. Mirrors lua/gcra.lua; change them together.
--
-- As lua/fixed_window_batch.lua does for its strategy: decisions run one
-- after the other, exactly as lua/gcra.lua would run them alone, but a key's
-- TAT is read on its first use in the call, kept here as a number, and
-- written back once at the end with the expiry of the last pass. Nothing
-- else can run in between, so the result is the same, and a flood of one
-- caller costs Redis one GET and one SET per call, with no table, string or
-- number conversion per decision.
--
-- Each decision's keys and arguments are lua/gcra.lua's.
-- `num` comes from lua/batch_prelude.lua, `kept` and `write_back` from
-- lua/kept.lua.

-- floor(a / b) for integers below 2^53 (see lua/gcra.lua).
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- One decision: KEYS[k + 1], arguments ARGV[a + 1 ..] (see lua/batch.lua),
-- `now` from Redis TIME or nil.
local function decide(k, _, a, _, now)
  now = now or num(ARGV[a + 1])
  local cost, t, limit = num(ARGV[a + 2]), num(ARGV[a + 3]), num(ARGV[a + 4])
  local s = kept(KEYS[k + 1])
  local tolerance = t * limit
  local start = now
  if s.value and s.value > now then start = s.value end
  local used_now = limit - idiv(math.max(tolerance - (start - now), 0), t)
  if cost > limit then
    return struct.pack('>Hlllllll', 7, 0, limit, used_now, start, math.max(start - now, t), now, 0)
  end
  local next = start + cost * t
  if next - now > tolerance then
    return struct.pack('>Hlllllll', 7, 0, limit, used_now, start, next - tolerance - now, now, 0)
  end
  if cost > 0 then
    s.value, s.px = next, math.ceil((next - now) / 1000) + 1000
  end
  local left = idiv(math.max(tolerance - (next - now), 0), t)
  return struct.pack('>Hllllllllll', 10, 1, limit, limit - left, next, -1, now, 0, next, s.given, t)
end

-- Writes back each TAT a pass moved, with the last pass's expiry.
local flush = write_back
