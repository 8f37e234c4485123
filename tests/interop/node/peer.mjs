// A BullMQ (Node.js) peer driven by the interop tests, one JSON object a line.
//
//   node peer.mjs <redis-url> <queue> <lock-duration-ms> <stalled-interval-ms> \
//                 <lock-renew-time-ms>
//
// Requests come on stdin as {"seq": n, "op": "...", ...} and each gets exactly
// one reply on stdout: {"seq": n, "ok": true, ...} or {"seq": n, "ok": false,
// "error": "..."}. Things the holding worker sees on its own are written as
// {"event": "active" | "stalled" | "error", ...} lines.
//
// Ops:
//   add    {count}        Queue.add `count` jobs; replies {"ids": [...]}
//                         (each with the job id `jobId`, when given)
//   fetch  {count}        a Worker without autorun takes `count` jobs with
//                         getNextJob(token), one BullMQ-style token each;
//                         replies {"jobs": [{"id", "token"}]}
//   check  {}             one stalled-jobs check by that worker; replies
//                         {"stalled": [ids it emitted "stalled" for]}
//   states {ids}          Queue.getJobState of each id; replies {"states": {...}}
//   hold   {concurrency}  a running Worker whose processor never returns: it
//                         holds up to `concurrency` jobs, renews their locks
//                         with its own lock manager and runs its own stalled
//                         checker every stalled interval; replies {"workerId"}
//
// A {"event": "ready", "version"} line comes first. Closing stdin ends the
// process; the tests kill it (SIGKILL) to play a crashed worker.

import { createInterface } from "node:readline";
import { createRequire } from "node:module";
import { Queue, Worker } from "bullmq";

const require = createRequire(import.meta.url);
const { version } = require("bullmq/package.json");

const [url, queueName, ...timings] = process.argv.slice(2);
const [lockDuration, stalledInterval, lockRenewTime] = timings.map(Number);
if (!url || !queueName || !(lockDuration > 0 && stalledInterval > 0 && lockRenewTime > 0)) {
  process.stderr.write("usage: node peer.mjs <redis-url> <queue> <lock-ms> <stalled-ms> <renew-ms>\n");
  process.exit(2);
}

const parsed = new URL(url);
const connection = {
  host: parsed.hostname,
  port: Number(parsed.port || 6379),
  db: Number(parsed.pathname.slice(1) || 0),
};
const prefix = "bull";

function send(message) {
  process.stdout.write(JSON.stringify(message) + "\n");
}

const queue = new Queue(queueName, { connection, prefix });

// The manual worker: no processor, no autorun, so neither its lock manager nor
// its stalled checker ever runs on its own. Whatever keeps its jobs alive is
// someone else's renewal.
const manual = new Worker(queueName, null, {
  connection,
  prefix,
  autorun: false,
  lockDuration,
  stalledInterval,
  maxStalledCount: 1,
});
let stalledDuringCheck = null;
manual.on("stalled", (jobId) => {
  if (stalledDuringCheck !== null) stalledDuringCheck.push(jobId);
});
manual.on("error", (err) => send({ event: "error", source: "manual", message: String(err) }));

let tokenPostfix = 0;
let holder = null;

const ops = {
  async add({ count, jobId }) {
    const ids = [];
    for (let i = 0; i < count; i += 1) {
      const job = await queue.add("interop", { n: i }, jobId ? { jobId } : {});
      ids.push(job.id);
    }
    return { ids };
  },

  async fetch({ count }) {
    const jobs = [];
    for (let i = 0; i < count; i += 1) {
      // The token format of BullMQ's own run loop: `${worker.id}:${n}`.
      const token = `${manual.id}:${tokenPostfix++}`;
      const job = await manual.getNextJob(token, { block: false });
      if (!job) break;
      jobs.push({ id: job.id, token });
    }
    return { jobs };
  },

  async check() {
    stalledDuringCheck = [];
    try {
      await manual.moveStalledJobsToWait();
      return { stalled: stalledDuringCheck };
    } finally {
      stalledDuringCheck = null;
    }
  },

  async states({ ids }) {
    const states = {};
    for (const id of ids) states[id] = await queue.getJobState(id);
    return { states };
  },

  async hold({ concurrency }) {
    if (holder) throw new Error("already holding");
    holder = new Worker(
      queueName,
      async (job, token) => {
        send({ event: "active", id: job.id, token });
        // Hold the job until the process ends: only the lock manager of this
        // worker keeps it.
        await new Promise(() => {});
      },
      {
        connection,
        prefix,
        concurrency,
        lockDuration,
        lockRenewTime,
        stalledInterval,
        maxStalledCount: 1,
      },
    );
    holder.on("stalled", (jobId) => send({ event: "stalled", id: jobId }));
    holder.on("error", (err) => send({ event: "error", source: "holder", message: String(err) }));
    await holder.waitUntilReady();
    return { workerId: holder.id };
  },
};

// One request at a time, in order: the test waits for each reply anyway.
let chain = Promise.resolve();
const lines = createInterface({ input: process.stdin });
lines.on("line", (line) => {
  if (!line.trim()) return;
  chain = chain.then(async () => {
    let request;
    try {
      request = JSON.parse(line);
      const op = ops[request.op];
      if (!op) throw new Error(`unknown op ${request.op}`);
      const result = await op(request);
      send({ seq: request.seq, ok: true, ...result });
    } catch (err) {
      send({ seq: request?.seq ?? null, ok: false, error: String(err?.stack ?? err) });
    }
  });
});
// The test closing our stdin (or dying) ends the peer.
lines.on("close", () => process.exit(0));

await manual.waitUntilReady();
await queue.waitUntilReady();
send({ event: "ready", version, workerId: manual.id });
