#!/usr/bin/env python3
"""The seed scenario: a worker paused past its lease cannot clobber the next.

Two workers share the stream ``jobs`` under the lease ``jobs``:

1. Worker A (a child process) takes the lease with a short ttl (0.5 s) and
   writes its first step.
2. A is paused: the parent sends it SIGSTOP, as a GC pause or a stalled VM
   would stop it. Its keeper thread stops with it, so nobody renews.
3. Worker B asks for the lease with ``wait``: the server grants it once A's
   lease has expired, with a larger token, and fences the stream at it
   (``fence=True``). B writes.
4. A is resumed (SIGCONT) and, unaware, writes its next step. Its client
   refuses locally (``LostError``): the lease's confirmed time ran out
   during the pause, so ``lease.lost`` is set before anything is sent. Even
   a raw write with A's old token, past the client's check, is refused by
   the server (``STALE``).

The stream ends with A's first step and B's records only. Run it against a
server (``fencelog serve``) or a cluster (``fencelog cluster local``, with
``--cluster``)::

    python examples/paused_worker.py --port 7379 [--cluster] [--stream jobs]

It prints a JSON summary and exits 1 if any of these properties fails.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import time
import uuid
from typing import Any, Dict

from fencelog import Client, LostError, StaleError

TTL_A = 0.5  # seconds: short, so the demonstration is quick
TIMEOUT = 30.0  # seconds: the most any step may take before the run fails


def worker_a(host: str, port: int, cluster: bool, stream: str, conn: Any) -> None:
    """Worker A, in its own process: acquires, writes, waits for the parent
    (which pauses it meanwhile), then tries to write again."""
    client = Client(host, port, cluster=cluster)
    report: Dict[str, Any] = {}
    with client.lease(stream, ttl=TTL_A) as lease:
        report["token"] = lease.token
        report["first_offset"] = lease.append(stream, b"A: step 1")
        conn.send(dict(report))
        conn.recv()  # the parent pauses this process here, then says "go"
        report["lost_before_call"] = lease.lost.is_set()
        try:
            lease.append(stream, b"A: step 2 (late)")
            report["late_write"] = "accepted"
        except LostError:
            report["late_write"] = "LostError"
        except StaleError:
            report["late_write"] = "STALE"
        returned = time.monotonic()
        report["lost_after_call"] = lease.lost.is_set()
        report["lost_no_later_than_first_call"] = (
            lease.lost_at is not None and lease.lost_at <= returned
        )
        report["lost_reason"] = lease.lost_reason
        # Past the client's own check: the server refuses the old token.
        try:
            client.append(stream, lease.token, b"A: raw late write")
            report["raw_late_write"] = "accepted"
        except StaleError as e:
            report["raw_late_write"] = f"STALE {e.presented} < {e.highest}"
    conn.send(report)
    client.close()


def _recv(conn: Any, what: str) -> Any:
    if not conn.poll(TIMEOUT):
        raise SystemExit(f"timed out waiting for {what}")
    return conn.recv()


def run(host: str, port: int, cluster: bool = False, stream: str = "") -> Dict[str, Any]:
    """Runs the scenario; answers what happened, and raises AssertionError
    if a fencing property failed."""
    stream = stream or f"jobs-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    a = ctx.Process(target=worker_a, args=(host, port, cluster, stream, child), daemon=True)
    a.start()
    pid = a.pid
    assert pid is not None
    try:
        first = _recv(parent, "worker A's first write")
        os.kill(pid, signal.SIGSTOP)  # A is "paused": no thread of it runs
        paused_at = time.monotonic()
        client = Client(host, port, cluster=cluster)
        try:
            with client.lease(stream, ttl=5.0, wait=TIMEOUT) as b:
                b_acquired = time.monotonic() - paused_at
                b_offset = b.append(stream, b"B: step 1")
                os.kill(pid, signal.SIGCONT)
                parent.send("go")
                late = _recv(parent, "worker A's late write")
                b.append(stream, b"B: step 2")
                b_token = b.token
            records = client.read(stream, 0, count=1000)
        finally:
            client.close()
    finally:
        if a.is_alive():
            os.kill(pid, signal.SIGCONT)
        a.join(TIMEOUT)
        if a.is_alive():
            a.kill()
            a.join(TIMEOUT)

    summary = {
        "stream": stream,
        "a_token": first["token"],
        "b_token": b_token,
        "b_acquired_after_pause_s": round(b_acquired, 3),
        "a_late_write": late["late_write"],
        "a_raw_late_write": late["raw_late_write"],
        "a_lost_before_call": late["lost_before_call"],
        "a_lost_no_later_than_first_call": late["lost_no_later_than_first_call"],
        "a_lost_reason": late["lost_reason"],
        "records": [[r.offset, r.token, r.payload.decode()] for r in records],
    }
    takeover = first["first_offset"] + 1
    assert b_token > first["token"], summary
    assert b_offset == takeover, summary
    assert late["late_write"] in ("LostError", "STALE"), summary
    assert late["raw_late_write"].startswith("STALE"), summary
    assert late["lost_after_call"] and late["lost_no_later_than_first_call"], summary
    assert [r.payload for r in records] == [b"A: step 1", b"B: step 1", b"B: step 2"], summary
    assert all(r.token == b_token for r in records if r.offset >= takeover), summary
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7379)
    p.add_argument("--cluster", action="store_true", help="the port is a cluster node's")
    p.add_argument("--stream", default="", help="default: a fresh jobs-… name")
    args = p.parse_args()
    try:
        summary = run(args.host, args.port, args.cluster, args.stream)
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
