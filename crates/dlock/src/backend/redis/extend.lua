-- extend: compare-and-pexpire on the owner token.
-- KEYS: 1 base, 2 exp, 3 meta (a rwlock or semaphore hold's); ARGV: 1 owner, 2 lease ms, 3 '1'
-- to detach (nobody renews it after this: a forced release removes it at once).
-- Returns 1 extended, 0 gone, 2 revoked.
local base, owner = KEYS[1], ARGV[1]
local v = redis.pcall('GET', base)
if type(v) == 'string' then
  -- A mutex: its flag (see hold_fields in holds.lua) follows the owner and the token.
  if string.sub(v, 1, #owner + 1) ~= owner .. '\n' then
    return 0
  end
  local b = string.find(v, '\n', #owner + 2, true)
  if not b then
    return 0
  end
  local flag = string.sub(v, b + 1, b + 1)
  if flag == 'r' then
    return 2
  end
  if ARGV[3] == '1' and flag ~= 'd' then
    redis.call('SET', base, string.sub(v, 1, b) .. 'd' .. string.sub(v, b + 2), 'PX', ARGV[2])
  else
    redis.call('PEXPIRE', base, ARGV[2])
  end
  return 1
end
if type(v) ~= 'table' or not v.err then
  return 0
end
-- @helpers
local exp, meta, lease = KEYS[2], KEYS[3], tonumber(ARGV[2])
if redis.call('TYPE', base)['ok'] ~= 'hash' then
  return 0
end
local now = now_ms()
local s = redis.call('ZSCORE', exp, owner)
if not (s and tonumber(s) > now and redis.call('HEXISTS', base, 'h:' .. owner) == 1) then
  return 0
end
if redis.call('HGET', meta, 'revoked') == '1' then
  return 2
end
redis.call('ZADD', exp, fmt(now + lease), owner)
expire_with_latest(base, exp, now)
if ARGV[3] == '1' then
  redis.call('HSET', meta, 'detached', '1')
end
redis.call('PEXPIRE', meta, fmt(lease))
return 1
