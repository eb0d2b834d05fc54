-- release: compare-and-delete on the owner token; a released mutex is handed to its first
-- registered waiter (hand_off in handoff.lua), who alone is told; any other release is
-- announced on the channel (it reaches only the clients that subscribed it: waiters and
-- observers of the name).
-- KEYS: 1 base, 2 exp, 3 meta, 4 fence, 5 w, 6 q
-- ARGV: 1 owner, 2 channel ('' for a quiet release that wakes nobody: Redlock's clean-up of a
--       partial grant), 3 hand-off channel prefix ('' where nobody registers for hand-offs:
--       Redlock's servers, replicas=N), 4 meta key prefix, 5 the observers' channel.
-- Returns 2 released and handed on, 1 released, 0 not held.
local base, exp, meta, owner = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local handoffs = ARGV[3] ~= ''
-- A mutex is a string: GET answers it in one command (a hash answers WRONGTYPE: see below).
local v = redis.pcall('GET', base)
local released = 0
if type(v) == 'string' then
  if v == owner then
    released = 1
    -- Fair waiters queued: they are woken and the full rule decides (no hand-off past them).
    if handoffs and redis.call('EXISTS', KEYS[5], KEYS[6]) > 0
      and redis.call('EXISTS', KEYS[6]) == 0 then
      redis.call('DEL', meta)
      if hand_off(base, KEYS[4], KEYS[5], ARGV[4], ARGV[3], ARGV[5]) then
        return 2
      end
      redis.call('DEL', base)
    else
      redis.call('DEL', base, meta)
    end
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
