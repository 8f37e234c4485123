--[[
  extendLocks-1: renew the locks of many jobs in one call.

  KEYS[1]  the queue's stalled set                        "emq:myqueue:stalled"
  ARGV[1]  the queue's key prefix, WITH its final colon   "emq:myqueue:"
  ARGV[2]  msgpack array of lock tokens, one per job id
  ARGV[3]  msgpack array of job ids
  ARGV[4]  the new lock TTL, in milliseconds

  Keys touched: KEYS[1], and ARGV[1] .. id .. ":lock" for every id, so every
  key of a queue must live in one hash slot on a cluster.

  For each job: when its lock holds its token, the lock gets the new TTL and
  the id leaves the stalled set; otherwise (lock gone, or held by another
  token) the id is reported. The TTL is re-armed with PEXPIRE on the key that
  already holds the token, which leaves it exactly as SET with that value and
  PX would (same value, new TTL) without rewriting the value: about a third
  less server time per job. ARGV[4] must be a positive integer.

  Returns the reported ids in input order; an empty array means every lock
  was renewed.
]]
local stalledKey = KEYS[1]
local keyPrefix = ARGV[1]
local tokens = cmsgpack.unpack(ARGV[2])
local jobIds = cmsgpack.unpack(ARGV[3])
local ttl = ARGV[4]

-- A stalled set that does not exist now cannot appear while the script runs:
-- skip one SREM per job then (its usual state between stalled checks).
local hasStalled = redis.call("EXISTS", stalledKey) == 1

local lost = {}
for i = 1, #jobIds do
  local jobId = jobIds[i]
  local token = tokens[i]
  local lockKey = keyPrefix .. jobId .. ":lock"
  local holder = redis.call("GET", lockKey)
  if holder and holder == token and redis.call("PEXPIRE", lockKey, ttl) == 1 then
    if hasStalled then
      redis.call("SREM", stalledKey, jobId)
    end
  else
    lost[#lost + 1] = jobId
  end
end
return lost
