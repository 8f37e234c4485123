--[[
  fence-2: hand the holder of a job's lock the job's next fencing number.

  KEYS[1]  the job's lock key                             "emq:myqueue:42:lock"
  KEYS[2]  the job's hash                                  "emq:myqueue:42"
  ARGV[1]  the token the caller holds the lock with
  ARGV[2]  the hash field that keeps the job's last number  "emq:fence"

  Keys touched: KEYS[2] alone, and only while KEYS[1] holds ARGV[1].

  The number lives in the job's hash, so it goes away with the job and keeps
  counting across its attempts; BullMQ reads the fields it knows and ignores
  this one. Each holder's numbers are larger than any earlier holder's: an
  earlier holder took its numbers while it held the lock, before this one could.
  Returns the number (1, 2, ...); 0 when the lock is gone, -1 when it holds
  anything else (another token, a key of
  another type), -2 when the job's hash is gone.
]]
local held = redis.pcall("GET", KEYS[1])
if held == false then
  return 0
end
if type(held) == "table" and held.err and not string.find(held.err, "WRONGTYPE", 1, true) then
  return redis.error_reply(held.err)  -- the server refused the read: no verdict on the lock
end
if held ~= ARGV[1] then
  return -1
end
if redis.call("EXISTS", KEYS[2]) == 0 then
  return -2
end
return redis.call("HINCRBY", KEYS[2], ARGV[2], 1)
