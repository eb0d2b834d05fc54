-- cancel: a waiting request gives up: its fair queue place and its waiter record go; if the
-- lock was handed to it meanwhile, it is released and handed on (as release.lua does).
-- KEYS: 1 q, 2 qexp, 3 qinfo, 4 qseq, 5 w, 6 base, 7 fence; ARGV: 1 owner, 2 channel, 3 waiter
-- record ('' if none), 4 hand-off channel prefix, 5 the observers' channel, 6 now (ms).
-- Returns 1 if a place or record was removed or a handed lock released.
local removed = leave_queue(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1])
if removed == 1 then
  redis.call('PUBLISH', ARGV[2], 'cancelled')
end
if ARGV[3] ~= '' then
  if redis.call('ZREM', KEYS[5], ARGV[3]) == 1 then
    removed = 1
  else
    local v = redis.pcall('GET', KEYS[6])
    if type(v) == 'string' and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '\n' then
      -- Handed to us while we gave up: pass it on.
      if not hand_off(KEYS[6], KEYS[7], KEYS[5], ARGV[4], ARGV[5], ARGV[6]) then
        redis.call('DEL', KEYS[6])
        redis.call('PUBLISH', ARGV[2], 'released')
      end
      removed = 1
    end
  end
end
return removed
