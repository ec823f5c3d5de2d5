-- tollgate: several concurrency-limit decisions in one call, each key read
-- and written once: the `decide` and `flush` that lua/batch.lua (appended by
-- the store) calls. Mirrors lua/concurrency.lua; change them together.
--
-- Decisions run one after the other, exactly as lua/concurrency.lua would
-- run them alone, but a key's live count and newest start are read on its
-- first use in the call and kept here; the members a pass adds wait here
-- too, and go out in one ZADD at the end, with the stale entries' removal
-- and the expiry the last pass would set. Nothing else can run in between,
-- so the result is the same, and a crowd costs Redis a few calls per script
-- call rather than five per decision. A decision at another `now` (an app
-- clock) or timeout first writes out what waits and reads the key afresh.
--
-- Each decision's keys and arguments are lua/concurrency.lua's, or
-- lua/concurrency_release.lua's for a release (two arguments), which runs
-- here as it would alone.
-- `int` comes from lua/prelude.lua, `num` from lua/batch_prelude.lua.

local state, order = {}, {}

-- Writes out what the decisions so far left for key `s`: the removal of
-- stale entries (any decision that charges makes it), the members passes
-- added, and their expiry.
local function write_out(key, s)
  if s.remove then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(s.floor))
  end
  local members = s.members
  for first = 1, #members, 1000 do
    local args = {}
    for i = first, math.min(first + 999, #members) do
      args[#args + 1] = s.score
      args[#args + 1] = members[i]
    end
    redis.call('ZADD', key, unpack(args))
  end
  if s.px then
    redis.call('PEXPIRE', key, s.px)
  end
  s.remove, s.members, s.px = false, {}, nil
end

-- The state of `key` for a decision at `now` with `timeout`: read once, then
-- kept; read afresh (after writing out) when either differs.
local function state_of(key, now, timeout)
  local s = state[key]
  if s and s.now == now and s.timeout == timeout then return s end
  if s then write_out(key, s) end
  local floor = math.max(now - timeout, 0)
  local live = '(' .. int(floor)
  local count = redis.call('ZCOUNT', key, live, '+inf')
  local newest = nil
  if count > 0 then
    newest = tonumber(redis.call('ZREVRANGEBYSCORE', key, '+inf', live, 'WITHSCORES', 'LIMIT', '0', '1')[2])
  end
  -- stored: live entries in Redis (not waiting here); oldest: theirs, read
  -- when a rejection first needs it.
  -- score and ttl: what a pass writes, formatted once per state (a number's
  -- formatting costs Redis's Lua a C sprintf).
  local fresh = {now = now, timeout = timeout, floor = floor, live = live, score = int(now),
    ttl = int(math.ceil(timeout / 1000)), count = count, stored = count, newest = newest,
    remove = false, members = {}}
  if s == nil then order[#order + 1] = key end
  state[key] = fresh
  return fresh
end

-- A release (lua/concurrency_release.lua's keys and two arguments), run
-- as alone: what the decisions before it left waiting goes out first, and
-- the key is read afresh by the next decision on it. The store puts a
-- batch's releases ahead of its checks, so a crowd's releases and checks
-- share one script call.
local function release(key, id, cost)
  local s = state[key]
  if s then
    write_out(key, s)
    s.now = nil
  end
  if cost == 1 then return struct.pack('>Hl', 1, redis.call('ZREM', key, id .. ':0')) end
  local removed, members = 0, {}
  for i = 0, cost - 1 do
    members[#members + 1] = id .. ':' .. i
    if #members >= 1000 or i == cost - 1 then
      removed = removed + redis.call('ZREM', key, unpack(members))
      members = {}
    end
  end
  return struct.pack('>Hl', 1, removed)
end

-- One decision: KEYS[k + 1], arguments ARGV[a + 1 ..] (see lua/batch.lua),
-- `now` from Redis TIME or nil, and `fresh`, the request id when it is not
-- the argument's; or, with two arguments, a release.
local function decide(k, _, a, na, now, fresh)
  if na == 2 then return release(KEYS[k + 1], fresh or ARGV[a + 1], num(ARGV[a + 2])) end
  now = now or num(ARGV[a + 1])
  local cost, limit, timeout = num(ARGV[a + 2]), num(ARGV[a + 3]), num(ARGV[a + 4])
  local key = KEYS[k + 1]
  local s = state_of(key, now, timeout)
  if cost > 0 then s.remove = true end

  if s.count + cost > limit then
    local reset, retry = now, 1000000
    if s.newest then reset = s.newest + timeout end
    if s.count > 0 then
      -- The oldest live entry: Redis's, or one waiting here (started now).
      if s.stored > 0 and s.oldest == nil then
        s.oldest = tonumber(redis.call('ZRANGEBYSCORE', key, s.live, '+inf', 'WITHSCORES', 'LIMIT', '0', '1')[2])
      end
      local oldest = s.oldest
      if #s.members > 0 and now > s.floor and (oldest == nil or now < oldest) then
        oldest = now
      end
      retry = math.min(oldest + timeout - now, 1000000)
    end
    return struct.pack('>Hlllllll', 7, 0, limit, math.min(s.count, limit), reset, retry, now, 0)
  end

  local id = fresh or ARGV[a + 5]
  local count, newest = s.count, s.newest
  if cost == 1 then
    -- One slot, the common case: no number to format.
    s.members[#s.members + 1] = id .. ':0'
  elseif cost > 0 then
    local members = s.members
    for i = 0, cost - 1 do
      members[#members + 1] = id .. ':' .. i
    end
  end
  if cost > 0 then
    s.px = s.ttl
    count = count + cost
    if not newest or now > newest then newest = now end
    -- Entries started at the floor never count (now 0 on an app clock):
    -- the next decision does not see these, as alone it would not.
    if now > s.floor then s.count, s.newest = count, newest end
  end
  local reset = now
  if newest then reset = newest + timeout end
  -- Packed here, as lua/batch.lua would pack the table lua/concurrency.lua
  -- returns, without the table.
  return struct.pack('>Hllllllll', 8, 1, limit, count, reset, -1, now, 0, tonumber(id))
end

-- Writes out each key the decisions touched.
local function flush()
  for _, key in ipairs(order) do
    write_out(key, state[key])
  end
end
