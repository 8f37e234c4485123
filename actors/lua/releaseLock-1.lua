--[[
  releaseLock-1: delete a job's lock only if it still holds this worker's token.

  KEYS[1]  the job's lock key                             "emq:myqueue:42:lock"
  ARGV[1]  the token this worker holds the lock with

  Keys touched: KEYS[1] alone.

  Run by a process-mode manager's child when its worker is gone: the lock is
  deleted at once, so the stalled checker can hand the job on without waiting
  for the TTL; a lock that another worker holds now is never touched.
  Returns 1 when the lock was deleted, 0 otherwise.
]]
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
