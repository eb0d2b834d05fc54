-- dlock: the hand-off of a released mutex (prepended after common.lua and holds.lua to the
-- scripts that release: release.lua, cancel.lua).

-- Hands a free mutex to the first waiter registered in `w` (a zset of waiter records, see
-- grab.lua) whose client still listens on its hand-off channel: the hold, a new fence token and
-- the metadata are written for it, and it alone is told (channel_prefix .. client key, message
-- "owner token"). A record whose client does not listen (it died) is dropped and the next one
-- tried. Observers are told on `changed`. Returns true if the lock was handed on; the caller
-- has deleted the old hold's metadata and deletes the base key if not.
local function hand_off(base, fence, w, meta_prefix, channel_prefix, changed)
  while true do
    local e = redis.call('ZPOPMIN', w)
    if #e == 0 then
      return false
    end
    -- owner \n lease ms \n client key \n client_id \n host \n pid \n ('0' | '1' value)
    local f, pos = {}, 1
    for i = 1, 6 do
      local nl = string.find(e[1], '\n', pos, true)
      if not nl then
        f = nil
        break
      end
      f[i] = string.sub(e[1], pos, nl - 1)
      pos = nl + 1
    end
    if f and tonumber(f[2]) then
      local rest = string.sub(e[1], pos)
      local meta = meta_prefix .. f[1]
      redis.call('SET', base, f[1], 'PX', f[2])
      local tok = redis.call('INCR', fence)
      if string.sub(rest, 1, 1) == '1' then
        redis.call('HSET', meta, 'client_id', f[4], 'host', f[5], 'pid', f[6], 'acquired_at',
          fmt(now_ms()), 'token', fmt(tok), 'mode', 'exclusive', 'value', string.sub(rest, 2))
      else
        redis.call('HSET', meta, 'client_id', f[4], 'host', f[5], 'pid', f[6], 'acquired_at',
          fmt(now_ms()), 'token', fmt(tok), 'mode', 'exclusive')
      end
      redis.call('PEXPIRE', meta, f[2])
      if redis.call('PUBLISH', channel_prefix .. f[3], f[1] .. ' ' .. fmt(tok)) > 0 then
        redis.call('PUBLISH', changed, 'handed')
        return true
      end
      redis.call('DEL', base, meta)
    end
  end
end
