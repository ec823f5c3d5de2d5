-- tollgate: a write-back cache of the keys a batch's decisions touch, for
-- strategies whose scripts only GET and SET ... PX strings, or HMGET, HSET,
-- HINCRBY and PEXPIRE hashes (GCRA, the sliding-window counter, the leaky
-- bucket). The store puts this file before the decision script, which then
-- sees `cached` as `redis`, and lua/batch.lua calls `flush` after the last
-- decision.
--
-- A key is read from Redis on its first use in the call, kept here while
-- the call's decisions read and change it, and written back once by
-- `flush`: a flood of one caller costs Redis one read and one write per
-- call, not per request. Every other command, and any of these on a key in
-- a state this file does not model (another type, a field not read yet, a
-- key that may not exist), first writes everything back and forgets it, then
-- goes to Redis as is: each decision sees exactly what it would alone, and
-- Redis ends in the state the decisions would have left one by one (the
-- script's clock is frozen, so a PEXPIRE written back at the end sets the
-- same deadline it would have set mid-call).
--
-- Numbers stay numbers here: the store turns the script's `int` (which
-- formats a number for Redis) into the identity, and this file formats the
-- same way, '%.0f', only what it sends. Formatting and parsing a number
-- costs Redis's Lua some 1,500 instructions, and a decision would otherwise
-- do four. The scripts read every stored value with `tonumber`, so a number
-- read back from here is what they would have parsed.

local real = redis
local entries, order = {}, {}

-- A decision's argument as a number, converted once per call: a flood
-- repeats the same few, and Redis's Lua turns each string into a number with
-- strtod, some 1,500 instructions. The scripts behind this cache take only
-- integer arguments below 2^53, which they convert with `tonumber` anyway.
local numbers = {}
local function arg(value)
  local n = numbers[value]
  if n == nil then
    n = tonumber(value)
    numbers[value] = n
  end
  return n
end

-- A value as the script alone would have sent it: its `int` formats numbers
-- so, and its other arguments are the store's integers.
local function text(v)
  if type(v) == 'number' then return string.format('%.0f', v) end
  return v
end

-- A value read from Redis, as a number when it is an integer the scripts
-- will parse anyway: parsed once per call, not once per decision.
local function parsed(v)
  local n = type(v) == 'string' and tonumber(v)
  if n and string.format('%.0f', n) == v then return n end
  return v
end

-- Writes back what changed, and forgets every key.
local function flush()
  for _, key in ipairs(order) do
    local e = entries[key]
    if e.dirty and e.fields == nil then
      real.call('SET', key, text(e.value), 'PX', text(e.px))
    elseif e.dirty then
      local args = {}
      for field in pairs(e.changed) do
        args[#args + 1] = field
        args[#args + 1] = text(e.fields[field])
      end
      if #args > 0 then real.call('HSET', key, unpack(args)) end
      if e.px then real.call('PEXPIRE', key, text(e.px)) end
    end
  end
  entries, order = {}, {}
end

local function remember(key, e)
  if entries[key] == nil then order[#order + 1] = key end
  entries[key] = e
end

-- Anything not modelled: to Redis, after writing everything back.
local function through(...)
  local args = {...}
  for i = 1, select('#', ...) do args[i] = text(args[i]) end
  flush()
  return real.call(unpack(args))
end

local cached = setmetatable({}, {__index = real})

function cached.call(command, key, ...)
  local n = select('#', ...)
  local e = entries[key]
  if command == 'GET' and n == 0 then
    if e == nil then
      local value = parsed(real.call('GET', key))
      remember(key, {value = value})
      return value
    elseif e.fields == nil then
      return e.value
    end
  elseif command == 'SET' and n == 3 then
    local value, px, ms = ...
    ms = tonumber(ms)
    if px == 'PX' and ms and ms > 0 and ms == math.floor(ms) then
      -- Replaces the key whatever it held, and its expiry.
      remember(key, {value = value, px = ms, dirty = true})
      return {ok = 'OK'}
    end
  elseif command == 'HMGET' and n > 0 then
    if e == nil then
      local values = real.call('HMGET', key, ...)
      e = {fields = {}, changed = {}, exists = false}
      for i = 1, n do
        values[i] = parsed(values[i])
        e.fields[select(i, ...)] = values[i]
        if values[i] then e.exists = true end
      end
      remember(key, e)
      return values
    elseif e.fields then
      local values = {}
      for i = 1, n do
        local v = e.fields[select(i, ...)]
        if v == nil then values = nil break end
        values[i] = v
      end
      if values then return values end
    end
  elseif command == 'HSET' and n >= 2 and n % 2 == 0 and e and e.fields then
    local added = 0
    for i = 1, n, 2 do
      local field, value = select(i, ...)
      if not e.fields[field] then added = added + 1 end
      e.fields[field] = value
      e.changed[field] = true
    end
    e.exists, e.dirty = true, true
    return added
  elseif command == 'HINCRBY' and n == 2 and e and e.fields then
    local field, by = ...
    local old = e.fields[field]
    local base = old == false and 0 or tonumber(old)
    by = tonumber(by)
    if old ~= nil and base and by and base == math.floor(base) and by == math.floor(by) then
      local new = base + by
      e.fields[field] = new
      e.changed[field] = true
      e.exists, e.dirty = true, true
      return new
    end
  elseif command == 'PEXPIRE' and n == 1 and e and e.fields and e.exists then
    local ms = tonumber((...))
    if ms and ms > 0 and ms == math.floor(ms) then
      e.px, e.dirty = ms, true
      return 1
    end
  end
  return through(command, key, ...)
end
