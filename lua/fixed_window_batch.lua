-- tollgate: several fixed-window decisions in one call, each key read and
-- written once: the `decide` and `flush` that lua/batch.lua (appended by the
-- store) calls. Mirrors lua/fixed_window.lua; change them together.
--
-- Decisions run one after the other, exactly as lua/fixed_window.lua would
-- run them alone, but a key's state is read on its first use in the call and
-- kept here, and written back once at the end: many requests of one caller
-- (a flood) cost Redis one HMGET and one HINCRBY per call, not per request.
-- Nothing else can run in between, so the result is the same.
--
-- Each decision's keys and arguments are lua/fixed_window.lua's, or
-- lua/fixed_window_lease.lua's (six arguments: a lease request, decided and
-- answered as that script would, so a lease rides in a batch like any
-- decision).
-- `int` comes from lua/prelude.lua, `num` from lua/batch_prelude.lua.

local state, order = {}, {}

-- The state of `key` as a decision at `now` with `window` sees it: the
-- stored window if it has not ended, else a fresh one that opens now.
local function window_of(key, now, window)
  local s = state[key]
  if s == nil then
    local stored = redis.call('HMGET', key, 'c', 'r')
    s = {c = tonumber(stored[1]), r = tonumber(stored[2]), fresh = false, added = 0}
    state[key] = s
    order[#order + 1] = key
  end
  if not (s.c and s.r and s.r > now) then
    s.c, s.r, s.fresh, s.added = 0, now + window, true, 0
    s.px = math.ceil(window / 1000) + 1000
  end
  return s
end

-- One decision: keys KEYS[k + 1 .. k + n], arguments ARGV[a + 1 ..] (see
-- lua/batch.lua), `now` from Redis TIME or nil.
local function decide(k, n, a, na, now)
  now = now or num(ARGV[a + 1])
  local cost = num(ARGV[a + 2])
  if n == 1 then
    -- One quota, the common case: no tables but the window's, and the
    -- reply packed here (see lua/batch.lua) without a table in between.
    local limit = num(ARGV[a + 3])
    local s = window_of(KEYS[k + 1], now, num(ARGV[a + 4]))
    if s.c + cost > limit then
      return struct.pack('>Hlllllll', 7, 0, limit, math.min(s.c, limit), s.r, s.r - now, now, 0)
    end
    if na == 6 then
      local want, span = num(ARGV[a + 5]), num(ARGV[a + 6])
      if s.r - now < span then want = math.floor(want * (s.r - now) / span) end
      local lease = math.min(want, math.floor((limit - s.c - cost) / 2))
      s.c, s.added = s.c + cost + lease, s.added + cost + lease
      return struct.pack('>Hlllllllll', 9, 1, limit, s.c, s.r, -1, now, 0, s.r, lease)
    end
    s.c, s.added = s.c + cost, s.added + cost
    return struct.pack('>Hllllllll', 8, 1, limit, s.c, s.r, -1, now, 0, s.r)
  end
  local s, limit = {}, {}
  for i = 1, n do
    limit[i] = num(ARGV[a + 1 + 2 * i])
    s[i] = window_of(KEYS[k + i], now, num(ARGV[a + 2 + 2 * i]))
  end
  local rejected = nil
  for i = 1, n do
    if s[i].c + cost > limit[i] then
      if rejected == nil or s[i].r > s[rejected].r then rejected = i end
    end
  end
  if rejected then
    local i = rejected
    return {0, limit[i], math.min(s[i].c, limit[i]), s[i].r, s[i].r - now, now, i - 1}
  end
  for i = 1, n do
    s[i].c = s[i].c + cost
    s[i].added = s[i].added + cost
  end
  local report = 1
  for i = 2, n do
    if limit[i] - s[i].c < limit[report] - s[report].c then report = i end
  end
  local reply = {1, limit[report], s[report].c, s[report].r, -1, now, report - 1}
  for i = 1, n do reply[7 + i] = s[i].r end
  return reply
end

-- Writes back what changed: a window opened here is written whole, with its
-- expiry; an open one only moves its count, keeping the expiry it has.
local function flush()
  for _, key in ipairs(order) do
    local s = state[key]
    if s.fresh then
      if s.added > 0 then
        redis.call('HSET', key, 'c', int(s.c), 'r', int(s.r))
        redis.call('PEXPIRE', key, int(s.px))
      end
    elseif s.added > 0 then
      redis.call('HINCRBY', key, 'c', int(s.added))
    end
  end
end
