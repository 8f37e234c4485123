// The fourth chaos worker: BullMQ for Node.js, with its own lock manager and stalled checker.
//
//   node tests/chaos/node_worker.mjs SETTINGS_JSON
//
// The settings are the Python workers' (tests/chaos/worker.py), plus `node_dir`: the folder
// holding the pinned `bullmq` (tests/interop/node). A running Worker at `concurrency` runs
// each job's steps (sleeping: a busy step would block this worker's own renewals, which is
// BullMQ's behaviour, not the subject here) and fails its first `fail_first` attempts. Each
// run's `started` (with `taken`, the job's processedOn) and `finished` (stamped when its
// processor returned or threw: bullmq sends the move right after) go to the history as JSON
// lines. Its runs are not watched: BullMQ for Node.js does not tell a running job that its
// lock was lost, so the checker keeps overlaps it leaves apart. The worker closes once
// CONTROL/BASE.stop exists.

import { appendFileSync, existsSync, openSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const settings = JSON.parse(process.argv[2]);
const require = createRequire(join(settings.node_dir, "package.json"));
const { Worker } = require("bullmq");

// Wall-clock nanoseconds, as Python's time.time_ns(): one clock for every process.
const originNs = BigInt(Date.now()) * 1000000n - process.hrtime.bigint();
const now = () => Number(originNs + process.hrtime.bigint());

const history = openSync(settings.history, "a");
function write(record) {
  appendFileSync(history, JSON.stringify(record) + "\n");
}

const attempts = new Map();
function record(event, job, token, more = {}) {
  const run = `${job.id}\u0000${token}`;
  if (event === "started") attempts.set(run, job.attemptsMade + 1);
  write({
    kind: "run",
    event,
    job: String(job.id),
    attempt: attempts.get(run) ?? 0,
    token,
    worker: settings.worker,
    base: settings.base,
    watched: false,
    created: job.timestamp,
    t: now(),
    ...more,
  });
}

const url = new URL(settings.url);
const connection = { host: url.hostname, port: Number(url.port), maxRetriesPerRequest: null };
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
let inflight = 0;

class Designed extends Error {}

const worker = new Worker(
  settings.queue,
  async (job, token) => {
    const taken = job.processedOn ? job.processedOn * 1000000 : undefined;
    record("started", job, token, taken === undefined ? {} : { taken });
    inflight += 1;
    try {
      for (let step = 0; step < job.data.steps; step += 1) await sleep(job.data.step_ms);
      const failing = job.attemptsMade < job.data.fail_first;
      record("finished", job, token, { outcome: failing ? "failed" : "completed" });
      if (failing) throw new Designed(token);
      return token;
    } finally {
      inflight -= 1;
    }
  },
  {
    connection,
    prefix: "bull",
    concurrency: settings.concurrency,
    lockDuration: settings.lock_ms,
    stalledInterval: settings.stalled_ms,
    maxStalledCount: 1000000,
  },
);
worker.on("error", (error) => {
  write({ kind: "note", worker: settings.worker, what: String(error).slice(0, 200), t: now() });
});

await worker.waitUntilReady();
writeFileSync(join(settings.control, `${settings.worker}.ready`), "");
const stopFile = join(settings.control, `${settings.base}.stop`);
while (!existsSync(stopFile)) await sleep(50);
const deadline = Date.now() + 4 * settings.lock_ms;
while (inflight > 0 && Date.now() < deadline) await sleep(50);
await Promise.race([worker.close(), sleep(settings.lock_ms)]);
process.exit(0);
