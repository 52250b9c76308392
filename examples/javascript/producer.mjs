#!/usr/bin/env node
// Publish delayed jobs to delayd over its lmstfy-compatible HTTP API.
//
// Node 18+ and nothing else: the built-in fetch and util.parseArgs. Each job's body is
// "<prefix>-<n>"; for every job published this prints "published <job_id> <body>".
//
//   node producer.mjs --count 5 --delay 10 --namespace demo --queue emails
//
// The node's address and the namespace token come from --url/--token or from DELAYD_URL and
// DELAYD_TOKEN. A non-2xx answer stops the program with the status and delayd's error.

import { parseArgs } from "node:util";

const { values: opts } = parseArgs({
  options: {
    url: { type: "string", default: process.env.DELAYD_URL ?? "http://127.0.0.1:7777" },
    token: { type: "string", default: process.env.DELAYD_TOKEN ?? "" },
    namespace: { type: "string", default: "demo" },
    queue: { type: "string", default: "example" },
    count: { type: "string", default: "10" },
    delay: { type: "string", default: "0" },
    ttl: { type: "string", default: "3600" },
    tries: { type: "string", default: "3" },
    prefix: { type: "string", default: "job" },
  },
});

/** A whole number given on the command line, or an exit with a message. */
function whole(name) {
  const n = Number(opts[name]);
  if (!Number.isInteger(n) || n < 0) {
    console.error(`producer: --${name} must be a non-negative integer, not ${opts[name]}`);
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

/** PUT /api/{ns}/{q}: publishes one job and returns its id. */
async function publish(base, body, { delay, ttl, tries }) {
  const query = new URLSearchParams({ delay, ttl, tries });
  const url = `${base}/api/${encodeURIComponent(opts.namespace)}/${encodeURIComponent(opts.queue)}?${query}`;
  const headers = opts.token ? { "X-Token": opts.token } : {};
  const resp = await fetch(url, { method: "PUT", headers, body });
  const answer = await answerOf(resp);
  if (resp.status !== 200 && resp.status !== 201) {
    throw new DelaydError(`publish failed: HTTP ${resp.status}: ${answer?.error ?? JSON.stringify(answer)}`);
  }
  return answer.job_id;
}

async function main() {
  const base = opts.url.replace(/\/+$/, "");
  const count = whole("count");
  const params = { delay: whole("delay"), ttl: whole("ttl"), tries: whole("tries") };
  for (let n = 0; n < count; n++) {
    const body = `${opts.prefix}-${n}`;
    const id = await publish(base, body, params);
    console.log(`published ${id} ${body}`);
  }
}

main().catch((e) => {
  if (e instanceof DelaydError) {
    console.error(`producer: ${e.message}`);
  } else if (e instanceof TypeError && e.message === "fetch failed") {
    // fetch reports an unreachable node this way; its cause says why.
    console.error(`producer: cannot reach delayd at ${opts.url}: ${e.cause?.message ?? e.message}`);
  } else {
    console.error(e);
  }
  process.exit(1);
});
