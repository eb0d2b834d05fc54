-- dlock: the helpers of the scripts that read or change holds and queues (after common.lua, in
-- those scripts only).

-- A mutex hold's value: owner \n token \n flag \n acquired_at \n client_id \n host \n pid \n
-- ('0' | '1' value); flag is '-', 'r' (revoked) or 'd' (detached). Returns the owner, the
-- token, the flag and the flag's position, or nil for any other value (a foreign lock's token).
local function parse_hold(v)
  local a = string.find(v, '\n', 1, true)
  if not a then return nil end
  local b = string.find(v, '\n', a + 1, true)
  if not b or string.sub(v, b + 2, b + 2) ~= '\n' then return nil end
  local tok = tonumber(string.sub(v, a + 1, b - 1))
  if not tok then return nil end
  return string.sub(v, 1, a - 1), tok, string.sub(v, b + 1, b + 1), b + 1
end

-- `v` with the flag at `p` (from parse_hold) set to `flag`.
local function with_flag(v, p, flag)
  return string.sub(v, 1, p - 1) .. flag .. string.sub(v, p + 1)
end

-- Rewrites a string key's value, keeping its expiry.
local function rewrite(key, v)
  local left = redis.call('PTTL', key)
  if left > 0 then
    redis.call('SET', key, v, 'PX', left)
  end
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
    local owner, tok, flag = parse_hold(v)
    if not owner then
      return 'mutex', 0, {{v, 'exclusive', false, left}}
    end
    return 'mutex', 0, {{owner, 'exclusive', tok, left, flag}}
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
