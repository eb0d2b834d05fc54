-- set_value: compare-and-hset of a hold's value on the owner token.
-- KEYS: 1 base, 2 exp, 3 meta; ARGV: 1 owner, 2 value, 3 channel (the observers' one: no waiter
-- is let in by a new value).
-- Returns 1 set, 0 not held (gone, another owner's, revoked: then nothing is written).
local base, exp, meta, owner = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
-- The liveness check of extend.lua.
local t = redis.call('TYPE', base)['ok']
local live = false
if t == 'string' then
  live = redis.call('GET', base) == owner
elseif t == 'hash' then
  local s = redis.call('ZSCORE', exp, owner)
  live = s and tonumber(s) > now_ms() and redis.call('HEXISTS', base, 'h:' .. owner) == 1
end
-- The meta hash lives exactly as long as the hold: never create one without its expiry.
if not live or redis.call('EXISTS', meta) == 0 or redis.call('HGET', meta, 'revoked') == '1' then
  return 0
end
redis.call('HSET', meta, 'value', ARGV[2])
redis.call('PUBLISH', ARGV[3], 'value')
return 1
