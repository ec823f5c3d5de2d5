#!/usr/bin/env python3
"""A rate-limiting layer's own instructions per request, from a dump of
scripts/callgrind.sh: what the layer's `call` and its response future's
`poll` cost, without the inner service they wrap.

    scripts/layer_cost.py DUMP REQUESTS

Prints nothing when the dump holds neither tollgate's layer nor
tower_governor's. callgrind.sh runs it for each route it counts.

callgrind_annotate lists a function once per source file its inlined lines
came from, so a function's cost is the sum of its entries. The layer's own
share is every entry of its call and its future's poll, less the inner
service: axum's route (and tower's boxed service) inlined into the call,
and the route's future polled from the layer's. Where the poll is inlined
into the future that polls it (axum's `Map`), its entry is that future's
lines from tollgate's future.rs.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/"

# Both the current paths and those before the middleware moved into
# src/layer/ (096544d and earlier), so that a build copied aside still counts.
TOLLGATE_CALLS = {"tollgate::layer::service::limit", "tollgate::service::limit"}
TOLLGATE_POLLS = {
    "<tollgate::layer::future::ResponseFuture<F,E> as core::future::future::Future>::poll",
    "<tollgate::future::ResponseFuture<F,E> as core::future::future::Future>::poll",
}
SERVICE_FILES = ("src/layer/service.rs", "src/service.rs")
# The response future's own file: where its poll is inlined into the future
# that polls it (axum's `Map`), the lines from this file are its poll.
FUTURE_FILES = ("src/layer/future.rs", "src/future.rs")
# tollgate's RateLimit::call (request.into_parts), inlined into the
# MapFuture::call axum wraps a layer in.
TOLLGATE_WRAP = "<tower::util::map_future::MapFuture<S,F> as tower_service::Service<R>>::call"
GOVERNOR_CALL = ("tower_governor::<impl tower_service::Service<http::request::Request<ReqBody>>"
                 " for tower_governor::governor::Governor")
GOVERNOR_POLL = "<tower_governor::ResponseFuture<"
INNER_FILE = re.compile(r"axum-[\d.]+/src/routing/route\.rs$|tower-[\d.]+/src/util/boxed_clone_sync\.rs$")
INNER_POLL = "RouteFuture<E> as core::future::future::Future>::poll"
ENTRY = re.compile(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+?):(.*?)( \[.*\])?$")


def annotate(dump, *args):
    out = subprocess.run(
        ["callgrind_annotate", "--show=Ir", "--inclusive=yes", "--threshold=100", "--auto=no", *args, dump],
        capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout.splitlines()


def count(text):
    return int(text.replace(",", ""))


def main():
    dump, requests = sys.argv[1], float(sys.argv[2])
    # A function's own file can show twice: its entry (with its object
    # file) and a stub without one for an inlined call into it.
    entries = {}
    for line in annotate(dump):
        m = ENTRY.match(line)
        if m:
            key = (m.group(2).removeprefix(ROOT), m.group(3))
            if key not in entries or m.group(4):
                entries[key] = count(m.group(1))
    functions = {fn for _, fn in entries}
    tollgate = bool(TOLLGATE_CALLS & functions)
    if tollgate:
        is_call = lambda fn: fn in TOLLGATE_CALLS
        # The poll, as a function of its own, or inlined into its caller.
        is_poll = lambda f, fn: fn in TOLLGATE_POLLS or (f in FUTURE_FILES and not is_call(fn))
    elif any(fn.startswith(GOVERNOR_CALL) for fn in functions):
        is_call = lambda fn: fn.startswith(GOVERNOR_CALL)
        is_poll = lambda f, fn: fn.startswith(GOVERNOR_POLL)
    else:
        return
    own = sum(n for (f, fn), n in entries.items() if is_call(fn) and not INNER_FILE.search(f))
    own += sum(n for (f, fn), n in entries.items() if is_poll(f, fn))
    if tollgate:
        for file in SERVICE_FILES:
            wrap = entries.get((file, TOLLGATE_WRAP), 0)
            calls = sum(entries.get((file, fn), 0) for fn in TOLLGATE_CALLS)
            own += max(0, wrap - calls)
    # The inner future's poll, as called from the layer's.
    in_poll = False
    for line in annotate(dump, "--tree=calling"):
        if not line.strip():
            in_poll = False
        elif re.search(r"\*\s", line):
            m = re.search(r"\*\s+(\S+?):(.*?)( \[.*\])?$", line)
            in_poll = bool(m) and is_poll(m.group(1).removeprefix(ROOT), m.group(2))
        elif in_poll and INNER_POLL in line:
            own -= count(re.match(r"\s*([\d,]+)", line).group(1))
    print(round(own / requests))


if __name__ == "__main__":
    main()
