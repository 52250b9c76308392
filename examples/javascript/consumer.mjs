#!/usr/bin/env node
// Consume jobs from delayd over its lmstfy-compatible HTTP API, acking each one.
//
// Node 18+ and nothing else: the built-in fetch and util.parseArgs. Long-polls the queue,
// decodes each job's body, acks the job, then prints
// "consumed <job_id> <received_at_unix_ms> <body>". It stops after --count jobs (exit 0) or
// when --timeout seconds have passed (exit 3 if fewer than --count arrived; exit 0 with
// --count 0, which means "until the timeout").
//
//   node consumer.mjs --count 5 --timeout 60 --namespace demo --queue emails
//
// The node's address and the namespace token come from --url/--token or from DELAYD_URL and
// DELAYD_TOKEN. A non-2xx answer (other than "no job available") stops the program with the
// status and delayd's error.

import { parseArgs } from "node:util";

/** The longest single long-poll, in seconds; the overall deadline is --timeout. */
const MAX_POLL_SECONDS = 10;

const { values: opts } = parseArgs({
  options: {
    url: { type: "string", default: process.env.DELAYD_URL ?? "http://127.0.0.1:7777" },
    token: { type: "string", default: process.env.DELAYD_TOKEN ?? "" },
    namespace: { type: "string", default: "demo" },
    queue: { type: "string", default: "example" },
    count: { type: "string", default: "10" },
    timeout: { type: "string", default: "60" },
    ttr: { type: "string", default: "30" },
  },
});

/** A non-negative number given on the command line, or an exit with a message. */
function number(name) {
  const n = Number(opts[name]);
  if (!Number.isFinite(n) || n < 0) {
    console.error(`consumer: --${name} must be a non-negative number, not ${opts[name]}`);
    process.exit(2);
  }
  return n;
}

/** Thrown for an answer outside 2xx, with delayd's message. */
class DelaydError extends Error {}

/** The answer's JSON, or its text as {error} when it is not JSON. */
async function answerOf(resp) {
  const text = await resp.text();
  if (text === "") return null;
  try {
    return JSON.parse(text);
  } catch {
    return { error: text };
  }
}

function failure(what, status, answer) {
  return new DelaydError(`${what} failed: HTTP ${status}: ${answer?.error ?? JSON.stringify(answer)}`);
}

const queueUrl = `${opts.url.replace(/\/+$/, "")}/api/${encodeURIComponent(opts.namespace)}/${encodeURIComponent(opts.queue)}`;
const headers = opts.token ? { "X-Token": opts.token } : {};

/** GET /api/{ns}/{q}: the next job, long-polling up to `wait` s; null when none came. */
async function reserve(wait, ttr) {
  const query = new URLSearchParams({ timeout: wait, ttr });
  const resp = await fetch(`${queueUrl}?${query}`, { headers });
  const answer = await answerOf(resp);
  if (resp.status === 404 && answer?.msg === "no job available") return null;
  if (resp.status !== 200) throw failure("reserve", resp.status, answer);
  return answer;
}

/** DELETE /api/{ns}/{q}/job/{id}: the job is done. The lease (a delayd extension) makes the
 * ack apply only while this reservation holds, not to a later redelivery. */
async function ack(job) {
  const query = job.lease ? `?${new URLSearchParams({ lease: job.lease })}` : "";
  const resp = await fetch(`${queueUrl}/job/${encodeURIComponent(job.job_id)}${query}`, {
    method: "DELETE",
    headers,
  });
  if (resp.status !== 204) throw failure(`ack of ${job.job_id}`, resp.status, await answerOf(resp));
}

async function main() {
  const count = number("count");
  const timeout = number("timeout");
  const ttr = number("ttr");
  const deadline = Date.now() + timeout * 1000;
  let consumed = 0;
  while (count === 0 || consumed < count) {
    const left = deadline - Date.now();
    if (left <= 0) break;
    const job = await reserve(Math.min(MAX_POLL_SECONDS, Math.ceil(left / 1000)), ttr);
    if (job === null) continue;
    const receivedMs = Date.now();
    const body = Buffer.from(job.data, "base64").toString("utf8");
    // Do the work here; ack only once it is done, so a crash means redelivery.
    await ack(job);
    consumed++;
    console.log(`consumed ${job.job_id} ${receivedMs} ${body}`);
  }
  if (count !== 0 && consumed < count) {
    console.error(`consumer: timed out after ${timeout} s with ${consumed} of ${count} jobs`);
    process.exitCode = 3;
  }
}

main().catch((e) => {
  if (e instanceof DelaydError) {
    console.error(`consumer: ${e.message}`);
  } else if (e instanceof TypeError && e.message === "fetch failed") {
    // fetch reports an unreachable node this way; its cause says why.
    console.error(`consumer: cannot reach delayd at ${opts.url}: ${e.cause?.message ?? e.message}`);
  } else {
    console.error(e);
  }
  process.exit(1);
});
