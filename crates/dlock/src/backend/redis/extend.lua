-- extend: compare-and-pexpire on the owner token.
-- KEYS: 1 base, 2 exp, 3 meta; ARGV: 1 owner, 2 lease ms. Returns 1 extended, 0 gone.
local base, exp, meta, owner, lease = KEYS[1], KEYS[2], KEYS[3], ARGV[1], tonumber(ARGV[2])
local t = redis.call('TYPE', base)['ok']
if t == 'string' then
  if redis.call('GET', base) == owner then
    redis.call('PEXPIRE', base, fmt(lease))
    redis.call('PEXPIRE', meta, fmt(lease))
    return 1
  end
elseif t == 'hash' then
  local now = now_ms()
  local s = redis.call('ZSCORE', exp, owner)
  if s and tonumber(s) > now and redis.call('HEXISTS', base, 'h:' .. owner) == 1 then
    redis.call('ZADD', exp, fmt(now + lease), owner)
    expire_with_latest(base, exp, now)
    redis.call('PEXPIRE', meta, fmt(lease))
    return 1
  end
end
return 0
