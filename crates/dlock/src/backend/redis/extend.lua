-- extend: compare-and-pexpire on the owner token.
-- KEYS: 1 base, 2 exp, 3 meta; ARGV: 1 owner, 2 lease ms, 3 '1' to detach (nobody renews it
-- after this: a forced release removes it at once). Returns 1 extended, 0 gone, 2 revoked.
local base, exp, meta, owner, lease = KEYS[1], KEYS[2], KEYS[3], ARGV[1], tonumber(ARGV[2])
local t = redis.call('TYPE', base)['ok']
local live = false
if t == 'string' then
  live = redis.call('GET', base) == owner
elseif t == 'hash' then
  local s = redis.call('ZSCORE', exp, owner)
  live = s and tonumber(s) > now_ms() and redis.call('HEXISTS', base, 'h:' .. owner) == 1
end
if not live then
  return 0
end
if redis.call('HGET', meta, 'revoked') == '1' then
  return 2
end
if t == 'string' then
  redis.call('PEXPIRE', base, fmt(lease))
else
  local now = now_ms()
  redis.call('ZADD', exp, fmt(now + lease), owner)
  expire_with_latest(base, exp, now)
end
if ARGV[3] == '1' then
  redis.call('HSET', meta, 'detached', '1')
end
redis.call('PEXPIRE', meta, fmt(lease))
return 1
