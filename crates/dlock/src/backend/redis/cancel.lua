-- cancel: remove the owner's queue place.
-- KEYS: 1 q, 2 qexp, 3 qinfo, 4 qseq; ARGV: 1 owner, 2 channel. Returns 1 if a place was removed.
local removed = leave_queue(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1])
if removed == 1 then
  redis.call('PUBLISH', ARGV[2], 'cancelled')
end
return removed
