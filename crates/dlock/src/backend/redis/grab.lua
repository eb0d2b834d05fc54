-- grab: a mutex request that takes no queue place, in as few commands as the common cases
-- need: a free name is granted (SET NX, the fence, the metadata); a name another owner holds
-- answers busy with its time left, and a waiting request registers in the name's waiter set
-- `w` so that the holder's release hands the lock to it (hand_off in handoff.lua). Everything
-- else (a fair queue, a regrant, another kind, a revoked hold, a server without SET NX GET)
-- takes the full rule of acquire.lua.
-- KEYS: 1 base, 2 fence, 3 meta, 4 q, 5 w
-- ARGV: 1 owner, 2 lease ms, 3 client_id, 4 host, 5 pid, 6 register ('1': a waiting request
--       whose client listens for hand-offs), 7 waiter record, 8 waiter set ttl ms,
--       9 registered before ('1'), 10 the hold's value: '0' none, '1' .. value
-- Returns {1, token} granted, {0, ms left or -1, fence} busy, {2} take the full rule.
local base, fence, meta, q, w = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, lease = ARGV[1], ARGV[2]
local prev = redis.pcall('SET', base, owner, 'NX', 'PX', lease, 'GET')
if type(prev) == 'table' then
  -- Another Redis type (WRONGTYPE), or SET NX GET unknown (Redis < 7).
  return {2}
end
if not prev then
  if redis.call('EXISTS', q) == 1 then
    -- Fair waiters are queued: the full rule decides.
    redis.call('DEL', base)
    return {2}
  end
  local tok = redis.call('INCR', fence)
  if string.sub(ARGV[10], 1, 1) == '1' then
    redis.call('HSET', meta, 'client_id', ARGV[3], 'host', ARGV[4], 'pid', ARGV[5],
      'acquired_at', fmt(now_ms()), 'token', fmt(tok), 'mode', 'exclusive', 'value', string.sub(ARGV[10], 2))
  else
    redis.call('HSET', meta, 'client_id', ARGV[3], 'host', ARGV[4], 'pid', ARGV[5],
      'acquired_at', fmt(now_ms()), 'token', fmt(tok), 'mode', 'exclusive')
  end
  redis.call('PEXPIRE', meta, lease)
  if ARGV[9] == '1' then
    redis.call('ZREM', w, ARGV[7])
  end
  return {1, tok}
end
if prev == owner then
  -- Ours already (handed to us, or a repeated attempt): the full rule regrants it.
  return {2}
end
local left = redis.call('PTTL', base)
local f = tonumber(redis.call('GET', fence) or '0')
if ARGV[6] == '1' then
  -- In arrival order by the fence value at arrival; a waiter that registers again keeps its
  -- place (NX).
  redis.call('ZADD', w, 'NX', fmt(f), ARGV[7])
  redis.call('PEXPIRE', w, ARGV[8])
end
return {0, left, f}
