-- dlock: helpers every script uses (prepended to each one; holds.lua and handoff.lua only where
-- needed).
-- Key layout and contract: see the docs of crates/dlock/src/backend/redis/mod.rs.
if redis.replicate_commands then
  redis.replicate_commands()
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Integers as exact decimal strings (tostring would print 1.7e+12).
local function fmt(n)
  return string.format('%d', n)
end
