-- release: compare-and-delete on the owner token; a released mutex is handed to its first
-- registered waiter (hand_off in handoff.lua), who alone is told; any other release is
-- announced on the channel, if anyone may listen (waiters registered or queued, observers).
-- KEYS: 1 base, 2 exp, 3 meta, 4 fence, 5 w, 6 q, 7 obs (the observers' mark)
-- ARGV: 1 owner, 2 channel ('' for a quiet release that wakes nobody: Redlock's clean-up of a
--       partial grant), 3 hand-off channel prefix ('' where nobody registers for hand-offs:
--       Redlock's servers, replicas=N; then every release is announced), 4 the observers'
--       channel, 5 now (ms, the client's clock: a hand-off's acquired_at).
-- Returns 2 released and handed on, 1 released, 0 not held.
local base, owner = KEYS[1], ARGV[1]
local handoffs = ARGV[3] ~= ''
-- A mutex is a string: GET answers it in one command (a hash answers WRONGTYPE: see below).
local v = redis.pcall('GET', base)
-- Who may listen, in one command: 4 × the waiter set + 2 × the fair queue + the observers'
-- mark (counted only where waiters register; elsewhere everyone is told).
local who = 0
if type(v) == 'string' then
  if string.sub(v, 1, #owner + 1) ~= owner .. '\n' then
    return 0
  end
  if not handoffs then
    redis.call('DEL', base)
    if ARGV[2] ~= '' then
      redis.call('PUBLISH', ARGV[2], 'released')
    end
    return 1
  end
  who = redis.call('EXISTS', KEYS[5], KEYS[5], KEYS[5], KEYS[5], KEYS[6], KEYS[6], KEYS[7])
  if who == 0 then
    -- Nobody waits or watches: no message.
    redis.call('DEL', base)
    return 1
  end
end
-- @helpers
local released = 0
if type(v) == 'string' then
  released = 1
  -- Registered waiters and no fair queue: hand on (fair waiters are woken and the full rule
  -- decides: no hand-off past them).
  if who >= 4 and who % 4 < 2 then
    local changed = ''
    if who % 2 == 1 then changed = ARGV[4] end
    if hand_off(base, KEYS[4], KEYS[5], ARGV[3], changed, ARGV[5]) then
      return 2
    end
  end
  redis.call('DEL', base)
elseif type(v) == 'table' and v.err and redis.call('TYPE', base)['ok'] == 'hash' then
  local exp = KEYS[2]
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
    redis.call('DEL', KEYS[3])
    if handoffs then
      who = redis.call('EXISTS', KEYS[5], KEYS[6], KEYS[7])
    end
  end
end
if released == 1 and ARGV[2] ~= '' and (who > 0 or not handoffs) then
  redis.call('PUBLISH', ARGV[2], 'released')
end
return released
