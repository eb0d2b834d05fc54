-- set_value: compare-and-set of a hold's value on the owner token.
-- KEYS: 1 base, 2 exp, 3 meta (a rwlock or semaphore hold's); ARGV: 1 owner, 2 value, 3 channel
-- (the observers' one: no waiter is let in by a new value).
-- Returns 1 set, 0 not held (gone, another owner's, revoked: then nothing is written).
local base, exp, meta, owner = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local v = redis.pcall('GET', base)
if type(v) == 'string' then
  -- A mutex: the value is the last part of the hold's string (hold_fields in holds.lua).
  local f, pos = hold_fields(v)
  if not f or f[1] ~= owner or f[3] == 'r' then
    return 0
  end
  if not rewrite(base, string.sub(v, 1, pos - 1) .. '1' .. ARGV[2]) then
    return 0
  end
elseif type(v) == 'table' and v.err and redis.call('TYPE', base)['ok'] == 'hash' then
  -- The liveness check of extend.lua.
  local s = redis.call('ZSCORE', exp, owner)
  local live = s and tonumber(s) > now_ms() and redis.call('HEXISTS', base, 'h:' .. owner) == 1
  -- The meta hash lives exactly as long as the hold: never create one without its expiry.
  if not live or redis.call('EXISTS', meta) == 0 or redis.call('HGET', meta, 'revoked') == '1' then
    return 0
  end
  redis.call('HSET', meta, 'value', ARGV[2])
else
  return 0
end
redis.call('PUBLISH', ARGV[3], 'value')
return 1
