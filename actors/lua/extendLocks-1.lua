--[[
  extendLocks-1: renew the locks of many jobs in one call.

  KEYS[1]  the queue's stalled set                        "emq:myqueue:stalled"
  ARGV[1]  the queue's key prefix, WITH its final colon   "emq:myqueue:"
  ARGV[2]  msgpack array of lock tokens, one per job id
  ARGV[3]  msgpack array of job ids
  ARGV[4]  the new lock TTL, in milliseconds: a positive integer, written
           in decimal without sign or leading zero ("30000")

  Keys touched: KEYS[1], and ARGV[1] .. id .. ":lock" for every id, so every
  key of a queue must live in one hash slot on a cluster.

  For each job: when its lock holds its token, the lock gets the new TTL and
  the id leaves the stalled set; otherwise the id is reported. A lock is lost
  whenever its key does not hold the job's token: the key is gone, holds
  another token, or is of another type (a hash, a list, ...); the other jobs
  of the call are renewed all the same. The TTL is re-armed with PEXPIRE on
  the key that already holds the token, which leaves it exactly as SET with
  that value and PX would (same value, new TTL) without rewriting the value:
  about a third less server time per job.

  Refused with an error reply, before any key is read or written:
    - ARGV[4] missing, 0 or below, or not an integer ("1.5", "1e3", "+5",
      " 5", "05"): PEXPIRE would delete a lock for a TTL of 0 or below.
  Errors that end the call where they happen, as in BullMQ's script:
    - ARGV[4] a positive integer the server cannot use (above 2^63 - 1, or
      now + TTL past it): PEXPIRE refuses it at the first held lock, as SET
      would, with no key changed yet; a call that finds no held lock reports
      every id.
    - KEYS[1] of another type than a set, once the first held lock is renewed.
    - GET failing for any reason but the key's type (an ACL refusal, say).
  Malformed arrays fail as they do in BullMQ's script: ARGV[2] or ARGV[3]
  that is not msgpack, or an id that is neither a string nor a number (ids
  are part of key names), ends the call with a Lua error (a nil id may end
  the array instead, as Lua counts it). Tokens and ids are matched by
  position: an id without a token is reported, tokens beyond the last id are
  ignored, and a token that is not a string never matches.

  Returns the reported ids in input order; an empty array means every lock
  was renewed.
]]
local stalledKey = KEYS[1]
local keyPrefix = ARGV[1]
local ttl = ARGV[4]

-- PEXPIRE with 0 or less deletes the key and answers 1, which would count a
-- destroyed lock as renewed: refuse such a TTL once per call, up front.
if type(ttl) ~= "string" or not string.find(ttl, "^[1-9]%d*$") then
  local shown = ttl and string.sub((string.gsub(ttl, "[^%w%.%+%-]", "?")), 1, 24) or "nothing"
  return redis.error_reply("ERR extendLocks-1: ARGV[4] must be the lock TTL, a positive "
    .. "integer of milliseconds; got '" .. shown .. "'")
end

local tokens = cmsgpack.unpack(ARGV[2])
local jobIds = cmsgpack.unpack(ARGV[3])

-- A stalled set that does not exist now cannot appear while the script runs:
-- skip one SREM per job then (its usual state between stalled checks).
local hasStalled = redis.call("EXISTS", stalledKey) == 1

local lost = {}
for i = 1, #jobIds do
  local jobId = jobIds[i]
  local token = tokens[i]
  local lockKey = keyPrefix .. jobId .. ":lock"
  -- pcall: GET on a key of another type fails, and with redis.call that one
  -- key would end the call, leaving the jobs before it renewed but never
  -- reported and the jobs after it to expire.
  local holder = redis.pcall("GET", lockKey)
  if holder and holder == token and redis.call("PEXPIRE", lockKey, ttl) == 1 then
    if hasStalled then
      redis.call("SREM", stalledKey, jobId)
    end
  else
    -- Only a key of another type explains a failed GET. Any other failure is
    -- the server's (TYPE raises a cluster or ACL refusal of its own): end the
    -- call with it, as before, rather than report a lock that may be held.
    if type(holder) == "table" then
      local kind = redis.call("TYPE", lockKey)["ok"]
      if kind == "string" or kind == "none" then
        return holder
      end
    end
    lost[#lost + 1] = jobId
  end
end
return lost
