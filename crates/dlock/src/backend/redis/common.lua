-- dlock: helpers shared by every script (prepended to each one at build time).
-- Key layout and contract: see the docs of crates/dlock/src/backend/redis.rs.
if redis.replicate_commands then
  redis.replicate_commands()
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Integers as exact decimal strings (tostring would print 1.7e+12).
local function fmt(n)
  return string.format('%d', n)
end

-- Sets the hash key and its expiry zset to expire with the latest holder.
local function expire_with_latest(base, exp, now)
  local last = redis.call('ZRANGE', exp, -1, -1, 'WITHSCORES')
  if #last == 2 then
    local left = tonumber(last[2]) - now
    if left < 1 then left = 1 end
    redis.call('PEXPIRE', base, fmt(left))
    redis.call('PEXPIRE', exp, fmt(left))
  end
end

-- Drops expired queue places; deletes the queue keys once empty.
local function prune_queue(q, qexp, qinfo, qseq, now)
  local dead = redis.call('ZRANGEBYSCORE', qexp, '-inf', fmt(now))
  for _, o in ipairs(dead) do
    redis.call('ZREM', q, o)
    redis.call('ZREM', qexp, o)
    redis.call('HDEL', qinfo, o)
  end
  if #dead > 0 and redis.call('ZCARD', q) == 0 then
    redis.call('DEL', q, qexp, qinfo, qseq)
  end
end

local function leave_queue(q, qexp, qinfo, qseq, owner)
  local removed = redis.call('ZREM', q, owner)
  redis.call('ZREM', qexp, owner)
  redis.call('HDEL', qinfo, owner)
  if redis.call('ZCARD', q) == 0 then
    redis.call('DEL', q, qexp, qinfo, qseq)
  end
  return removed
end

-- The live holds of a name, pruning expired rwlock/semaphore holders.
-- Returns kind ('none', 'mutex', 'rwlock', 'semaphore' or 'foreign'), permits (the Redis type
-- for 'foreign'), and a list of {owner, mode, token or false, ms left or -1}.
local function load_holds(base, exp, now)
  local t = redis.call('TYPE', base)['ok']
  if t == 'none' then
    return 'none', 0, {}
  end
  if t == 'string' then
    local owner = redis.call('GET', base)
    local left = redis.call('PTTL', base)
    return 'mutex', 0, {{owner, 'exclusive', false, left}}
  end
  if t ~= 'hash' then
    return 'foreign', t, {}
  end
  local kind = redis.call('HGET', base, 'kind')
  if kind ~= 'rwlock' and kind ~= 'semaphore' then
    return 'foreign', 'hash', {}
  end
  local permits = tonumber(redis.call('HGET', base, 'permits') or '0')
  local dead = redis.call('ZRANGEBYSCORE', exp, '-inf', fmt(now))
  for _, o in ipairs(dead) do
    redis.call('HDEL', base, 'h:' .. o)
    redis.call('ZREM', exp, o)
  end
  local holds = {}
  local live = redis.call('ZRANGE', exp, 0, -1, 'WITHSCORES')
  for i = 1, #live, 2 do
    local o = live[i]
    local v = redis.call('HGET', base, 'h:' .. o)
    if v then
      local sp = string.find(v, ' ', 1, true)
      holds[#holds + 1] = {o, string.sub(v, 1, sp - 1), tonumber(string.sub(v, sp + 1)),
        tonumber(live[i + 1]) - now}
    else
      redis.call('ZREM', exp, o)
    end
  end
  if #holds == 0 then
    redis.call('DEL', base, exp)
    return 'none', 0, {}
  end
  return kind, permits, holds
end

-- Hands a free mutex to the first waiter registered in `w` (a zset of waiter records, see
-- grab.lua) whose client still listens on its hand-off channel: the hold, a new fence token and
-- the metadata are written for it, and it alone is told (channel_prefix .. client key, message
-- "owner token"). A record whose client does not listen (it died) is dropped and the next one
-- tried. Observers are told on `changed`. Returns true if the lock was handed on; the caller
-- has deleted the old hold's metadata and deletes the base key if not.
local function hand_off(base, fence, w, meta_prefix, channel_prefix, changed)
  while true do
    local e = redis.call('ZPOPMIN', w)
    if #e == 0 then
      return false
    end
    -- owner \n lease ms \n client key \n client_id \n host \n pid \n ('0' | '1' value)
    local f, pos = {}, 1
    for i = 1, 6 do
      local nl = string.find(e[1], '\n', pos, true)
      if not nl then
        f = nil
        break
      end
      f[i] = string.sub(e[1], pos, nl - 1)
      pos = nl + 1
    end
    if f and tonumber(f[2]) then
      local rest = string.sub(e[1], pos)
      local meta = meta_prefix .. f[1]
      redis.call('SET', base, f[1], 'PX', f[2])
      local tok = redis.call('INCR', fence)
      if string.sub(rest, 1, 1) == '1' then
        redis.call('HSET', meta, 'client_id', f[4], 'host', f[5], 'pid', f[6], 'acquired_at',
          fmt(now_ms()), 'token', fmt(tok), 'mode', 'exclusive', 'value', string.sub(rest, 2))
      else
        redis.call('HSET', meta, 'client_id', f[4], 'host', f[5], 'pid', f[6], 'acquired_at',
          fmt(now_ms()), 'token', fmt(tok), 'mode', 'exclusive')
      end
      redis.call('PEXPIRE', meta, f[2])
      if redis.call('PUBLISH', channel_prefix .. f[3], f[1] .. ' ' .. fmt(tok)) > 0 then
        redis.call('PUBLISH', changed, 'handed')
        return true
      end
      redis.call('DEL', base, meta)
    end
  end
end
