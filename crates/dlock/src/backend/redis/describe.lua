-- describe: the live holders and waiters of a name (read only).
-- KEYS: 1 base, 2 exp, 3 q, 4 qexp, 5 qinfo; ARGV: 1 meta key prefix.
-- Returns {} (no live holder or not a lock) or {kind, permits, holders, waiters}; a holder is
-- {owner, mode, ms left or -1, client_id, host, pid, acquired_at, token, status, value (nil
-- without one)}, a waiter {owner, info}; status is 'held', 'detached' or 'revoked'.
local base, exp = KEYS[1], KEYS[2]
local now = now_ms()
local function holder(owner, mode, left)
  local m = redis.call('HMGET', ARGV[1] .. owner, 'client_id', 'host', 'pid', 'acquired_at',
    'token', 'mode', 'revoked', 'detached', 'value')
  local status = 'held'
  if m[7] == '1' then status = 'revoked' elseif m[8] == '1' then status = 'detached' end
  return {owner, m[6] or mode, fmt(left), m[1] or '', m[2] or '', m[3] or '0', m[4] or '0',
    m[5] or '', status, m[9]}
end
-- A mutex hold's value (hold_fields in holds.lua); a foreign lock's token is read as its owner.
local function mutex_holder(v, left)
  local f, pos = hold_fields(v)
  if not f then
    return holder(v, 'exclusive', left)
  end
  local status = 'held'
  if f[3] == 'r' then status = 'revoked' elseif f[3] == 'd' then status = 'detached' end
  local value = nil
  if string.sub(v, pos, pos) == '1' then value = string.sub(v, pos + 1) end
  return {f[1], 'exclusive', fmt(left), f[5], f[6], f[7], f[4], f[2], status, value}
end
local t = redis.call('TYPE', base)['ok']
local kind, permits, holders = 'mutex', '0', {}
if t == 'string' then
  holders[1] = mutex_holder(redis.call('GET', base), redis.call('PTTL', base))
elseif t == 'hash' then
  kind = redis.call('HGET', base, 'kind')
  if kind ~= 'rwlock' and kind ~= 'semaphore' then
    return {}
  end
  permits = redis.call('HGET', base, 'permits') or '0'
  local live = redis.call('ZRANGEBYSCORE', exp, '(' .. fmt(now), '+inf', 'WITHSCORES')
  for i = 1, #live, 2 do
    local v = redis.call('HGET', base, 'h:' .. live[i])
    if v then
      local sp = string.find(v, ' ', 1, true)
      local h = holder(live[i], string.sub(v, 1, sp - 1), tonumber(live[i + 1]) - now)
      if h[8] == '' then h[8] = string.sub(v, sp + 1) end
      holders[#holders + 1] = h
    end
  end
else
  return {}
end
if #holders == 0 then
  return {}
end
local waiters = {}
local queue = redis.call('ZRANGE', KEYS[3], 0, -1)
for _, o in ipairs(queue) do
  local s = redis.call('ZSCORE', KEYS[4], o)
  if s and tonumber(s) > now then
    waiters[#waiters + 1] = {o, redis.call('HGET', KEYS[5], o) or ''}
  end
end
return {kind, permits, holders, waiters}
