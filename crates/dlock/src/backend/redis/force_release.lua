-- force_release: delete every hold, its metadata and the queue of a name; keep the fence.
-- KEYS: 1 base, 2 exp, 3 q, 4 qexp, 5 qinfo, 6 qseq; ARGV: 1 channel, 2 meta key prefix.
-- Returns {n} holds removed, or {-1, type} if the key is not a lock.
local base, exp = KEYS[1], KEYS[2]
local now = now_ms()
local t = redis.call('TYPE', base)['ok']
local n = 0
if t == 'string' then
  redis.call('DEL', ARGV[2] .. redis.call('GET', base))
  n = 1
elseif t == 'hash' then
  local kind = redis.call('HGET', base, 'kind')
  if kind ~= 'rwlock' and kind ~= 'semaphore' then
    return {-1, 'hash'}
  end
  local all = redis.call('ZRANGE', exp, 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    if tonumber(all[i + 1]) > now then n = n + 1 end
    redis.call('DEL', ARGV[2] .. all[i])
  end
elseif t ~= 'none' then
  return {-1, t}
end
redis.call('DEL', base, exp, KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('PUBLISH', ARGV[1], 'force-released')
return {n}
