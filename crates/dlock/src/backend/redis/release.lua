-- release: compare-and-delete on the owner token.
-- KEYS: 1 base, 2 exp, 3 meta; ARGV: 1 owner, 2 channel ('' for a quiet release that wakes
-- nobody: Redlock's clean-up of a partial grant). Returns 1 released, 0 not held.
local base, exp, meta, owner = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
-- A mutex is a string: GET answers it in one command (a hash answers WRONGTYPE: see below).
local v = redis.pcall('GET', base)
local released = 0
if type(v) == 'string' then
  if v == owner then
    redis.call('DEL', base, meta)
    released = 1
  end
elseif type(v) == 'table' and v.err and redis.call('TYPE', base)['ok'] == 'hash' then
  local now = now_ms()
  local s = redis.call('ZSCORE', exp, owner)
  if s then
    if tonumber(s) > now and redis.call('HEXISTS', base, 'h:' .. owner) == 1 then
      released = 1
    end
    redis.call('HDEL', base, 'h:' .. owner)
    redis.call('ZREM', exp, owner)
    if redis.call('ZCARD', exp) == 0 then
      redis.call('DEL', base, exp)
    else
      expire_with_latest(base, exp, now)
    end
  end
  if released == 1 then
    redis.call('DEL', meta)
  end
end
if released == 1 and ARGV[2] ~= '' then
  redis.call('PUBLISH', ARGV[2], 'released')
end
return released
