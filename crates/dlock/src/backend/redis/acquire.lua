-- acquire: the grant rule of logic::decide, atomically.
-- KEYS: 1 base, 2 fence, 3 exp, 4 q, 5 qexp, 6 qinfo, 7 qseq, 8 meta (base:meta:<owner>: a
--       rwlock or semaphore hold's metadata; a mutex hold's is in its value), 9 w (the waiter
--       set)
-- ARGV: 1 owner, 2 kind, 3 permits, 4 mode, 5 lease ms, 6 enqueue (0/1), 7 queue place ttl ms,
--       8 client_id, 9 host, 10 pid, 11 waiter info (mode \n client_id \n host \n pid),
--       12 the hold's value: '0' none, '1' .. value (an election's), 13 register ('1': a
--       waiting rwlock or semaphore request, woken by releases only while registered in w),
--       14 waiter set ttl ms
-- Returns {1, token} granted (token -1: a regrant of a hold without a recorded token),
--         {0, retry ms or -1} busy (see Busy::retry_in), {-1, kind, permits} kind mismatch, {-2, type} foreign key.
local base, fence, exp, q, qexp, qinfo, qseq, meta =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local owner, kind, permits, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local lease, enqueue, qttl = tonumber(ARGV[5]), ARGV[6] == '1', tonumber(ARGV[7])
local value = false
if string.sub(ARGV[12], 1, 1) == '1' then
  value = string.sub(ARGV[12], 2)
end
local register = ARGV[13] == '1'
local now = now_ms()

-- A mutex hold is its value (see hold_fields in holds.lua).
local function mutex_value(tok)
  return owner .. '\n' .. fmt(tok) .. '\n-\n' .. fmt(now) .. '\n' .. ARGV[8] .. '\n' .. ARGV[9]
    .. '\n' .. ARGV[10] .. '\n' .. ARGV[12]
end

-- Fast path: a free mutex with nobody queued (neither key exists) is the fence and one SET PX
-- (the common uncontended case).
-- Anything else (held, a regrant, a hash of another kind, a queue) takes the full rule below.
if kind == 'mutex' and redis.call('EXISTS', base, q) == 0 then
  local tok = redis.call('INCR', fence)
  redis.call('SET', base, mutex_value(tok), 'PX', fmt(lease))
  return {1, tok}
end

prune_queue(q, qexp, qinfo, qseq, now)
local hkind, hpermits, holds = load_holds(base, exp, now)
if hkind == 'foreign' then
  return {-2, hpermits}
end

-- An owner that holds gets its token back, its lease refreshed (unless the hold was revoked:
-- then it is nobody's, and in everyone's way).
for _, h in ipairs(holds) do
  if h[1] == owner then
    if hkind == 'mutex' then
      if h[5] ~= 'r' then
        redis.call('PEXPIRE', base, fmt(lease))
        return {1, h[3] or -1}
      end
    elseif redis.call('HGET', meta, 'revoked') ~= '1' then
      redis.call('ZADD', exp, fmt(now + lease), owner)
      expire_with_latest(base, exp, now)
      redis.call('PEXPIRE', meta, fmt(lease))
      return {1, h[3] or -1}
    end
  end
end

if #holds > 0 and (hkind ~= kind or hpermits ~= permits) then
  return {-1, hkind, hpermits}
end

-- Waiters ahead: those before the owner's place, or the whole queue if it has none.
local queue = redis.call('ZRANGE', q, 0, -1)
local pos = nil
for i, o in ipairs(queue) do
  if o == owner then
    pos = i
    break
  end
end
local ahead = #queue
if pos then ahead = pos - 1 end

local free
if mode == 'exclusive' then
  free = (#holds == 0 and ahead == 0)
elseif kind == 'semaphore' then
  free = (#holds + ahead) < permits
else
  free = true
  for _, h in ipairs(holds) do
    if h[2] ~= 'shared' then free = false end
  end
  if free then
    for i = 1, ahead do
      local v = redis.call('HGET', qinfo, queue[i])
      if not v or string.sub(v, 1, 1) ~= 's' then
        free = false
        break
      end
    end
  end
end

if free then
  local tok = redis.call('INCR', fence)
  -- Defensive: never below a token a live hold already carries.
  local top = 0
  for _, h in ipairs(holds) do
    if h[3] and h[3] > top then top = h[3] end
  end
  if tok <= top then
    tok = top + 1
    redis.call('SET', fence, fmt(tok))
  end
  if kind == 'mutex' then
    redis.call('SET', base, mutex_value(tok), 'PX', fmt(lease))
  else
    redis.call('HSET', base, 'kind', kind, 'permits', fmt(permits), 'h:' .. owner,
      mode .. ' ' .. fmt(tok))
    redis.call('ZADD', exp, fmt(now + lease), owner)
    expire_with_latest(base, exp, now)
    redis.call('DEL', meta)
    redis.call('HSET', meta, 'client_id', ARGV[8], 'host', ARGV[9], 'pid', ARGV[10],
      'acquired_at', fmt(now), 'token', fmt(tok), 'mode', mode)
    if value then
      redis.call('HSET', meta, 'value', value)
    end
    redis.call('PEXPIRE', meta, fmt(lease))
  end
  if pos then
    leave_queue(q, qexp, qinfo, qseq, owner)
  end
  if register then
    redis.call('ZREM', KEYS[9], owner)
  end
  return {1, tok}
end

local retry = -1
for _, h in ipairs(holds) do
  if h[4] >= 0 and (retry < 0 or h[4] < retry) then retry = h[4] end
end
-- Only waiters in the way: the first is about to be granted, and its hold, if its holder dies
-- without a release, ends about a lease from now (logic::decide's rule).
if #holds == 0 then retry = lease end
if enqueue then
  if pos then
    redis.call('ZADD', qexp, fmt(now + qttl), owner)
  else
    local seq = redis.call('INCR', qseq)
    redis.call('ZADD', q, seq, owner)
    redis.call('ZADD', qexp, fmt(now + qttl), owner)
    redis.call('HSET', qinfo, owner, ARGV[11])
  end
  for _, k in ipairs({q, qexp, qinfo, qseq}) do
    redis.call('PEXPIRE', k, fmt(qttl))
  end
end
if register then
  redis.call('ZADD', KEYS[9], 'NX', '0', owner)
  redis.call('PEXPIRE', KEYS[9], ARGV[14])
end
return {0, retry}
