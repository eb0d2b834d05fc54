-- dlock: the helpers of the scripts that read or change holds and queues (after common.lua, in
-- those scripts only).

-- A mutex hold's value: owner \n token \n flag \n acquired_at \n client_id \n host \n pid \n
-- ('0' | '1' value); flag is '-', 'r' (revoked) or 'd' (detached). Returns its seven fields
-- (strings) and the position of its value part, or nil for any other value (a foreign lock's
-- token).
local function hold_fields(v)
  local f, pos = {}, 1
  for i = 1, 7 do
    local nl = string.find(v, '\n', pos, true)
    if not nl then return nil end
    f[i] = string.sub(v, pos, nl - 1)
    pos = nl + 1
  end
  if not tonumber(f[2]) or #f[3] ~= 1 then return nil end
  return f, pos
end

-- `v` (with the fields `f` from hold_fields) with its flag set to `flag`.
local function with_flag(v, f, flag)
  return f[1] .. '\n' .. f[2] .. '\n' .. flag .. string.sub(v, #f[1] + #f[2] + 4)
end

-- Rewrites a string key's value, keeping its expiry; false if the key has none left.
local function rewrite(key, v)
  local left = redis.call('PTTL', key)
  if left <= 0 then return false end
  redis.call('SET', key, v, 'PX', left)
  return true
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
-- for 'foreign'), and a list of {owner, mode, token or false, ms left or -1, flag of a mutex
-- hold (nil for a foreign lock's and in a hash)}.
local function load_holds(base, exp, now)
  local t = redis.call('TYPE', base)['ok']
  if t == 'none' then
    return 'none', 0, {}
  end
  if t == 'string' then
    local v = redis.call('GET', base)
    local left = redis.call('PTTL', base)
    local f = hold_fields(v)
    if not f then
      return 'mutex', 0, {{v, 'exclusive', false, left}}
    end
    return 'mutex', 0, {{f[1], 'exclusive', tonumber(f[2]), left, f[3]}}
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
