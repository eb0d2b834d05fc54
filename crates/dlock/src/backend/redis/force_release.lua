-- force_release: revoke or break every hold of a name (break also deletes its queue); keep the
-- fence.
-- KEYS: 1 base, 2 exp, 3 q, 4 qexp, 5 qinfo, 6 qseq; ARGV: 1 channel, 2 meta key prefix,
-- 3 'revoke' or 'break'.
-- Revoke: a hold whose metadata says `detached` (renewed by nobody) is deleted; every other
-- live hold gets `revoked` in its metadata (a mutex's: the flag in its value; its next extend
-- answers 2; it keeps others out until its owner releases it or it expires). Break: every hold
-- is deleted.
-- Returns {removed, revoked, longest ms left of a revoked hold or -1}, or {-1, type} if the key
-- is not a lock.
local base, exp = KEYS[1], KEYS[2]
local now = now_ms()
local revoke = ARGV[3] == 'revoke'
local removed, revoked, longest = 0, 0, -1
-- What to do with the live hold of `owner` with `left` ms to go: true to delete it.
local function judge(owner, left)
  local meta = ARGV[2] .. owner
  if not revoke or redis.call('HGET', meta, 'detached') == '1' then
    redis.call('DEL', meta)
    removed = removed + 1
    return true
  end
  -- A holder without metadata (a foreign `SET NX PX` lock) is marked too, for listings.
  local fresh = redis.call('EXISTS', meta) == 0
  redis.call('HSET', meta, 'revoked', '1')
  if fresh then redis.call('PEXPIRE', meta, fmt(math.max(left, 1))) end
  revoked = revoked + 1
  if left > longest then longest = left end
  return false
end
local t = redis.call('TYPE', base)['ok']
if t == 'string' then
  local v = redis.call('GET', base)
  local left = redis.call('PTTL', base)
  local f = hold_fields(v)
  local flag = f and f[3]
  if not f then
    -- A foreign `SET NX PX` lock: judged by a metadata hash of its own.
    if judge(v, left) then
      redis.call('DEL', base)
    end
  elseif not revoke or flag == 'd' then
    redis.call('DEL', base)
    removed = removed + 1
  else
    -- A dlock mutex carries its flag in its value.
    if flag ~= 'r' then
      rewrite(base, with_flag(v, f, 'r'))
    end
    revoked = revoked + 1
    if left > longest then longest = left end
  end
elseif t == 'hash' then
  local kind = redis.call('HGET', base, 'kind')
  if kind ~= 'rwlock' and kind ~= 'semaphore' then
    return {-1, 'hash'}
  end
  local all = redis.call('ZRANGE', exp, 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    local o, left = all[i], tonumber(all[i + 1]) - now
    if left <= 0 or judge(o, left) then
      redis.call('HDEL', base, 'h:' .. o)
      redis.call('ZREM', exp, o)
    end
  end
  if redis.call('ZCARD', exp) == 0 then
    redis.call('DEL', base, exp)
  else
    expire_with_latest(base, exp, now)
  end
elseif t ~= 'none' then
  return {-1, t}
end
if not revoke then
  redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6])
end
redis.call('PUBLISH', ARGV[1], 'force-released')
return {removed, revoked, longest}
