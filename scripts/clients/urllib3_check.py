"""Points urllib3's own retry logic at a running zoo.

    ZOO_URL=http://127.0.0.1:3000 ZOO_LIMIT=3 ZOO_WINDOW_SECS=3 python urllib3_check.py

A pool with ``Retry(total=3, status_forcelist=[429],
respect_retry_after_header=True)`` sends more requests than the limit, one
after another. urllib3 retries a 429 after sleeping ``Retry-After`` seconds
(integer seconds or an HTTP date; 413/429/503 only); the zoo's ``Retry-After``
must be long enough that the retry lands in the next window and succeeds, and
no longer than the window.
"""

import os
import sys
import time

import urllib3
from urllib3.util.retry import Retry

BASE = os.environ.get("ZOO_URL", "http://127.0.0.1:3000")
LIMIT = int(os.environ.get("ZOO_LIMIT", "5"))
WINDOW = int(os.environ.get("ZOO_WINDOW_SECS", "10"))

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)


# Every sleep urllib3 took between attempts, with the 429 that caused it.
waits = []


class RecordingRetry(Retry):
    """Retry as urllib3 ships it; only notes how long each sleep lasted.

    ``Retry.new`` builds the next attempt's object with ``type(self)``, so
    every retry of a request goes through here.
    """

    def sleep(self, response=None):
        start = time.monotonic()
        super().sleep(response)
        h = response.headers if response is not None else {}
        waits.append(
            {
                "status": response.status if response is not None else None,
                "retry_after": h.get("Retry-After"),
                "reset": h.get("X-RateLimit-Reset"),
                "remaining": h.get("X-RateLimit-Remaining"),
                "slept": time.monotonic() - start,
                "woke_at": time.time(),
            }
        )


retry = RecordingRetry(
    total=3,
    status_forcelist=[429],
    respect_retry_after_header=True,
    allowed_methods=frozenset(["GET", "HEAD"]),
    backoff_factor=0,
)
http = urllib3.PoolManager(retries=retry, timeout=urllib3.Timeout(total=10))
key = f"urllib3-{os.getpid()}-{time.time_ns()}"

print(f"urllib3 {urllib3.__version__}", flush=True)
n = 2 * LIMIT + 1
t0 = time.monotonic()
statuses = []
for i in range(n):
    before = len(waits)
    r = http.request("GET", f"{BASE}/tigerfeeding", headers={"X-Api-Key": key})
    statuses.append(r.status)
    body = r.json() if r.status == 200 else r.data
    history = [h.status for h in r.retries.history] if r.retries else []
    slept = [f"{w['slept']:.2f} s (Retry-After: {w['retry_after']})" for w in waits[before:]]
    print(
        f"     request {i + 1}: {r.status}, remaining {r.headers.get('X-RateLimit-Remaining')}"
        f", retried after {history or 'none'}, slept {slept or 'none'}",
        flush=True,
    )
    if r.status == 200:
        check(body.get("feeding") == "tigers", f"request {i + 1} got the tiger body")
elapsed = time.monotonic() - t0

check(all(s == 200 for s in statuses), f"{n} requests at limit {LIMIT}: all 200 in {elapsed:.1f} s")
expected = (n - 1) // LIMIT  # one 429 each time a window runs out
check(len(waits) == expected, f"{len(waits)} retries after a 429 ({expected} expected)")
for w in waits:
    ra = w["retry_after"]
    check(
        w["status"] == 429 and w["remaining"] == "0" and ra is not None and ra.isdigit(),
        f"429 with Remaining: 0 and integer Retry-After: {ra}",
    )
    if ra is not None and ra.isdigit():
        check(1 <= int(ra) <= WINDOW, f"Retry-After {ra} s is within 1..{WINDOW} s")
        check(w["slept"] >= int(ra) - 0.01, f"urllib3 slept {w['slept']:.2f} s for Retry-After {ra}")
    if w["reset"]:
        # The reset header is rounded up to a whole second; the retry may
        # wake before it, but never more than a second before.
        check(
            w["woke_at"] >= int(w["reset"]) - 1,
            f"woke {w['woke_at'] - int(w['reset']):+.2f} s from X-RateLimit-Reset",
        )

# Retry(total=0)-like behaviour: without retries urllib3 hands back the 429.
plain = urllib3.PoolManager(retries=False)
r = None
for _ in range(LIMIT + 1):
    r = plain.request("GET", f"{BASE}/tigerfeeding", headers={"X-Api-Key": key + "-plain"})
check(r.status == 429, f"without Retry the client sees the 429 ({r.status}): the retries above did the work")

if failures:
    print(f"urllib3_check: {len(failures)} failure(s)", file=sys.stderr)
    sys.exit(1)
print("urllib3_check: all good")
