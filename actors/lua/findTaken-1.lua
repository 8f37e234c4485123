--[[
  findTaken-1: the jobs whose locks hold the given tokens, among the active ones.

  KEYS[1]  the queue's active list                         "bull:myqueue:active"
  ARGV[1]  the queue's key prefix, with its final colon    "bull:myqueue:"
  ARGV[2..] tokens that fetches sent, whose answers were not read yet

  Keys touched: none (reads KEYS[1] and the locks of the jobs it lists).

  Run by a bullmq worker's lock manager for the fetches its event loop sent
  but has not read the answers of for a while (a processor blocks the loop):
  a fetch takes a job with its token, so the lock that holds the token names
  the job to renew. The list is read from its head, where a fetch puts the
  job it takes, and the walk stops once every token is found.
  Returns one entry per token: {job id, the lock's PTTL in ms}, or false.
]]
local wanted = {}
local left = 0
for i = 2, #ARGV do
  if wanted[ARGV[i]] == nil then
    wanted[ARGV[i]] = i - 1
    left = left + 1
  end
end
local found = {}
for i = 1, #ARGV - 1 do
  found[i] = false
end
if left == 0 then
  return found
end
for _, id in ipairs(redis.call("LRANGE", KEYS[1], 0, -1)) do
  local held = redis.call("GET", ARGV[1] .. id .. ":lock")
  local at = held and wanted[held]
  if at then
    found[at] = {id, redis.call("PTTL", ARGV[1] .. id .. ":lock")}
    wanted[held] = nil
    left = left - 1
    if left == 0 then
      break
    end
  end
end
return found
