// Points GitHub's own client, @octokit/core with @octokit/plugin-throttling,
// at a running zoo and checks that it gets every request through by waiting
// for the window to reset, never retrying early.
//
//   ZOO_URL=http://127.0.0.1:3000 ZOO_LIMIT=3 ZOO_WINDOW_SECS=3 node octokit-check.mjs
//
// What the plugin (11.x, dist-src/index.js) does with a failed request:
// it retries only on 403 or 429; a message matching /\bsecondary rate\b/i
// calls onSecondaryRateLimit with `retry-after`; otherwise, when
// `x-ratelimit-remaining` is exactly "0", it calls onRateLimit with
// ceil((x-ratelimit-reset * 1000 - now) / 1000) + 1 seconds, and retries
// after that long if the hook returns true. The zoo's 429 must therefore be
// read as a *primary* limit and retried after reset + 1 s.
//
// A 304 is not a success to octokit: @octokit/request throws a RequestError
// with status 304 ("Not modified") and the response attached. The plugin
// does not retry it. Callers doing conditional requests catch it; so do we.

import { Octokit } from "@octokit/core";
import { throttling } from "@octokit/plugin-throttling";
import { readFileSync } from "node:fs";

const BASE = process.env.ZOO_URL ?? "http://127.0.0.1:3000";
const LIMIT = Number(process.env.ZOO_LIMIT ?? 5);
const WINDOW = Number(process.env.ZOO_WINDOW_SECS ?? 10);
const MAX_RETRIES = 3;
const RUN = `${process.pid}-${Date.now()}`;

const failures = [];
function check(ok, what) {
  if (!ok) failures.push(what);
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
}

// Fail rather than hang if the plugin never gets through: the burst needs
// three windows plus octokit's extra second or two per wait.
const deadline = (6 * WINDOW + 10) * 1000;
setTimeout(() => {
  console.error(`octokit-check: timed out after ${deadline / 1000} s`);
  process.exit(1);
}, deadline).unref();

// Every HTTP exchange as it went over the wire, in order.
const wire = [];
async function loggingFetch(url, init) {
  const sentAt = Date.now();
  const res = await fetch(url, init);
  const h = (name) => res.headers.get(name);
  wire.push({
    id: init.headers["x-check-id"],
    path: new URL(url).pathname,
    sentAt,
    status: res.status,
    remaining: h("x-ratelimit-remaining"),
    reset: h("x-ratelimit-reset"),
    retryAfter: h("retry-after"),
  });
  return res;
}

// The plugin's own VERSION constant reads "0.0.0-development" in 11.x builds.
const installed = (name) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;
console.log(
  `@octokit/core ${installed("@octokit/core")}, @octokit/plugin-throttling ${installed("@octokit/plugin-throttling")}, node ${process.version}`,
);

const hooks = { rate: [], secondary: [] };
const ThrottledOctokit = Octokit.plugin(throttling);
const octokit = new ThrottledOctokit({
  baseUrl: BASE,
  request: { fetch: loggingFetch },
  log: { debug() {}, info() {}, warn: console.warn, error: console.error },
  throttle: {
    onRateLimit(retryAfter, options, _octokit, retryCount) {
      hooks.rate.push({ id: options.headers["x-check-id"], retryAfter, retryCount, at: Date.now() });
      return retryCount < MAX_RETRIES;
    },
    onSecondaryRateLimit(retryAfter, options) {
      hooks.secondary.push({ id: options.headers["x-check-id"], retryAfter });
      return false;
    },
  },
});

function get(path, key, id, extra = {}) {
  return octokit.request(`GET ${path}`, {
    headers: { "x-api-key": key, "x-check-id": id, ...extra },
  });
}

// 1. More requests than the limit, all at once: all must get through.
const burstKey = `octokit-burst-${RUN}`;
const n = 2 * LIMIT + 1;
const t0 = Date.now();
const results = await Promise.allSettled(
  Array.from({ length: n }, (_, i) => get("/tigerfeeding", burstKey, `burst-${i}`)),
);
const elapsed = (Date.now() - t0) / 1000;
const ok = results.filter((r) => r.status === "fulfilled" && r.value.status === 200);
for (const r of results) {
  if (r.status === "rejected") console.log(`     rejected: ${r.reason.status} ${r.reason.message}`);
}
check(ok.length === n, `${n} requests at limit ${LIMIT}: ${ok.length} succeeded in ${elapsed.toFixed(1)} s`);
check(ok.every((r) => r.value.data.feeding === "tigers"), "every success carries the tiger body");

const burst = wire.filter((w) => w.id?.startsWith("burst-"));
const limited = burst.filter((w) => w.status === 429);
check(limited.length >= n - LIMIT, `${limited.length} answers were 429 (at least ${n - LIMIT} expected)`);
check(limited.every((w) => w.remaining === "0" && w.reset), "every 429 says x-ratelimit-remaining: 0 and a reset");
check(hooks.secondary.length === 0, "no ordinary 429 was taken for a secondary limit");
check(hooks.rate.length === limited.length, `onRateLimit ran once per 429 (${hooks.rate.length})`);

// Each retry must go out after the reset its 429 announced (the plugin
// aims for reset + 1 s..2 s), and not much later.
for (const fail of limited) {
  const resetMs = Number(fail.reset) * 1000;
  const retry = burst.find((w) => w.id === fail.id && w.sentAt > fail.sentAt);
  if (!retry) {
    check(false, `${fail.id} was retried after its 429`);
    continue;
  }
  const late = (retry.sentAt - resetMs) / 1000;
  check(
    late >= 0 && late < 2.5,
    `${fail.id}: 429 at reset-${((resetMs - fail.sentAt) / 1000).toFixed(2)} s, retried at reset+${late.toFixed(2)} s -> ${retry.status}`,
  );
}
for (const h of hooks.rate) {
  check(h.retryAfter >= 1 && h.retryAfter <= WINDOW + 2, `${h.id} retry ${h.retryCount}: onRateLimit(retryAfter=${h.retryAfter} s)`);
}

// 2. A conditional request answered 304 is refunded; octokit throws for it.
const condKey = `octokit-etag-${RUN}`;
const first = await get("/tigerfeeding", condKey, "etag-1");
const etag = first.headers.etag;
check(first.status === 200 && etag, `first GET: 200 with ETag ${etag}`);
check(first.headers["x-ratelimit-remaining"] === String(LIMIT - 1), `first GET left ${first.headers["x-ratelimit-remaining"]}`);
let notModified;
try {
  await get("/tigerfeeding", condKey, "etag-2", { "if-none-match": etag });
} catch (err) {
  notModified = err;
}
check(notModified?.status === 304, `If-None-Match: octokit threw RequestError ${notModified?.status} (${notModified?.message})`);
const nmHeaders = notModified?.response?.headers ?? {};
check(
  nmHeaders["x-ratelimit-remaining"] === String(LIMIT - 1) && nmHeaders["x-ratelimit-used"] === "1",
  `the 304 was refunded: remaining ${nmHeaders["x-ratelimit-remaining"]}, used ${nmHeaders["x-ratelimit-used"]}`,
);
check(wire.filter((w) => w.id === "etag-2").length === 1, "the 304 was not retried");

// 3. GET /rate_limit: GitHub's shape, the caller's numbers, never charged.
const rl1 = await get("/rate_limit", condKey, "rate-1");
const rl2 = await get("/rate_limit", condKey, "rate-2");
const rate = rl2.data.rate;
const res = rl2.data.resources?.tigerfeeding;
const nowSecs = Date.now() / 1000;
check(
  rate && res && ["limit", "remaining", "used", "reset"].every((k) => Number.isInteger(rate[k]) && rate[k] === res[k]),
  `/rate_limit: ${JSON.stringify(rl2.data)}`,
);
check(rate?.limit === LIMIT && rate?.used === 1 && rate?.remaining === LIMIT - 1, "/rate_limit counts the 200, not the 304");
check(rate?.reset > nowSecs - 1 && rate?.reset <= nowSecs + WINDOW + 1, "/rate_limit reset is within this window");
check(JSON.stringify(rl1.data.rate) === JSON.stringify(rate), "/rate_limit itself is not charged");

// 4. A block by the penalty box (/penalty/tigerfeeding: PENALTY_LIMIT per
// WINDOW, PENALTY_STRIKES rejections within it block for a while) is
// GitHub's secondary rate limit: octokit waits its `retry-after`, which
// names the moment a request passes (the block's end, or the window's when
// later), and its retry is admitted.
const PENALTY_LIMIT = Number(process.env.ZOO_PENALTY_LIMIT ?? 3);
const STRIKES = Number(process.env.ZOO_PENALTY_STRIKES ?? 3);
const blockKey = `octokit-block-${RUN}`;
const raw = (id) =>
  loggingFetch(`${BASE}/penalty/tigerfeeding`, { headers: { "x-api-key": blockKey, "x-check-id": id } });
for (let i = 0; i < PENALTY_LIMIT + STRIKES; i++) await raw(`strike-${i}`);
const started = wire.filter((w) => w.id?.startsWith("strike-")).at(-1);
check(started?.status === 429, `the last of ${STRIKES} rejections started a block (${started?.status})`);
const blockedOctokit = new ThrottledOctokit({
  baseUrl: BASE,
  request: { fetch: loggingFetch },
  log: { debug() {}, info() {}, warn: console.warn, error: console.error },
  throttle: {
    onRateLimit(retryAfter, options) {
      hooks.rate.push({ id: options.headers["x-check-id"], retryAfter, blocked: true });
      return false;
    },
    onSecondaryRateLimit(retryAfter, options) {
      hooks.secondary.push({ id: options.headers["x-check-id"], retryAfter, at: Date.now() });
      return true;
    },
  },
});
const blockedRes = await blockedOctokit
  .request("GET /penalty/tigerfeeding", { headers: { "x-api-key": blockKey, "x-check-id": "blocked" } })
  .catch((err) => err);
const sent = wire.filter((w) => w.id === "blocked");
const [refused, retried] = sent;
check(blockedRes.status === 200, `a blocked request got through after waiting: ${blockedRes.status}`);
check(refused?.status === 429 && retried?.status === 200 && sent.length === 2, `one 429, then one retry: ${sent.map((w) => w.status)}`);
check(hooks.secondary.length === 1 && hooks.rate.every((h) => !h.blocked), "octokit read the block as a secondary rate limit");
if (refused && retried) {
  const passAt = refused.sentAt + Number(refused.retryAfter) * 1000;
  check(
    retried.sentAt >= passAt - 1000 && Number(refused.reset) * 1000 >= passAt - 1000,
    `retry-after ${refused.retryAfter} s, reset ${refused.reset}: the retry went out ${((retried.sentAt - refused.sentAt) / 1000).toFixed(1)} s later -> ${retried.status}`,
  );
  check(refused.remaining === "0", "the blocked 429 says x-ratelimit-remaining: 0");
}

if (failures.length) {
  console.error(`octokit-check: ${failures.length} failure(s)`);
  process.exit(1);
}
console.log("octokit-check: all good");
