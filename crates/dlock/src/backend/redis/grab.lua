-- grab: a mutex request that takes no queue place, in as few commands as the common cases
-- need: a free name is granted (the fence, then the hold with its metadata in one SET); a name
-- another owner holds answers busy with its time left, and a waiting request registers in the
-- name's waiter set `w` so that the holder's release hands the lock to it (hand_off in
-- handoff.lua). Everything else (a fair queue, a regrant, another kind) takes the full rule of
-- acquire.lua. It uses no shared helper (each one defined costs every call).
-- KEYS: 1 base, 2 fence, 3 q, 4 w
-- ARGV: 1 owner, 2 lease ms, 3 the hold's value after its token and flag (acquired_at \n
--       client_id \n host \n pid \n ('0' | '1' value)), 4 register ('1': a waiting request
--       whose client listens for hand-offs), 5 waiter record, 6 waiter set ttl ms,
--       7 registered before ('1')
-- Returns {1, token} granted, {0, ms left or -1, the holder's token} busy, {2} take the full
-- rule.
local base, fence, q, w = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner = ARGV[1]
local prev = redis.pcall('GET', base)
if type(prev) == 'table' then
  -- Another Redis type (WRONGTYPE): the full rule tells which.
  return {2}
end
if not prev then
  if redis.call('EXISTS', q) == 1 then
    -- Fair waiters are queued: the full rule decides.
    return {2}
  end
  local tok = redis.call('INCR', fence)
  redis.call('SET', base, owner .. '\n' .. string.format('%d', tok) .. '\n-\n' .. ARGV[3],
    'PX', ARGV[2])
  if ARGV[7] == '1' then
    redis.call('ZREM', w, ARGV[5])
  end
  return {1, tok}
end
if string.sub(prev, 1, #owner + 1) == owner .. '\n' then
  -- Ours already (handed to us, or a repeated attempt): the full rule regrants it.
  return {2}
end
local left = redis.call('PTTL', base)
-- The holder's token (its value is `owner \n token \n ...`): the fence's count since its grant.
-- A value in another format (a foreign lock) leaves the fence to be read.
local f = string.match(prev, '^[^\n]*\n(%d+)\n') or redis.call('GET', fence) or '0'
if ARGV[4] == '1' then
  -- In arrival order by the fence value at arrival; a waiter that registers again keeps its
  -- place (NX).
  redis.call('ZADD', w, 'NX', f, ARGV[5])
  redis.call('PEXPIRE', w, ARGV[6])
end
return {0, left, tonumber(f)}
