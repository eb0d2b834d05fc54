-- dlock: the hand-off of a released mutex (after common.lua and holds.lua, in the scripts that
-- release: release.lua, cancel.lua).

-- Hands a free mutex to the first waiter registered in `w` (a zset of waiter records, see
-- grab.lua) whose client still listens on its hand-off channel: the hold with a new fence token
-- and its metadata (acquired at `now`) is written for it, and it alone is told
-- (channel_prefix .. client key, message "owner token"). A record whose client does not listen
-- (it died) is dropped and the next one tried. Observers are told on `changed` ('' if there
-- are none). Returns true if the lock was handed on; if not, the caller deletes the base key.
local function hand_off(base, fence, w, channel_prefix, changed, now)
  while true do
    local e = redis.call('ZPOPMIN', w)
    if #e == 0 then
      return false
    end
    -- owner \n lease ms \n client key \n client_id \n host \n pid \n ('0' | '1' value)
    local r = e[1]
    local a = string.find(r, '\n', 1, true)
    local b = a and string.find(r, '\n', a + 1, true)
    local c = b and string.find(r, '\n', b + 1, true)
    local lease = b and tonumber(string.sub(r, a + 1, b - 1))
    if c and lease then
      local owner = string.sub(r, 1, a - 1)
      local tok = fmt(redis.call('INCR', fence))
      redis.call('SET', base, owner .. '\n' .. tok .. '\n-\n' .. now .. '\n' .. string.sub(r, c + 1),
        'PX', fmt(lease))
      if redis.call('PUBLISH', channel_prefix .. string.sub(r, b + 1, c - 1), owner .. ' ' .. tok) > 0 then
        if changed ~= '' then
          redis.call('PUBLISH', changed, 'handed')
        end
        return true
      end
    end
  end
end
