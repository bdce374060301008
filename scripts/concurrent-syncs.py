#!/usr/bin/env python3
"""What one disk gives several logs that sync at once (a 3-node group on
one machine: every node's Raft log syncs each entry on the same disk).

    scripts/concurrent-syncs.py [WRITERS] [SECONDS] [WRITE_BYTES] [DIR]

Each writer is a process that overwrites a file it wrote and synced first
(as a log writes into a filled segment), WRITE_BYTES at a time, each write
followed by fdatasync; prints each writer's syncs per second and the p50 /
p99 of a write + fdatasync, then the total. Defaults: 3 writers, 4 s,
4096 bytes, a temporary directory (removed afterwards)."""

import os
import sys
import tempfile
import time

FILE_BYTES = 64 << 20


def writer(path, seconds, size, out):
    with open(path, "wb") as f:
        f.write(b"\0" * FILE_BYTES)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_WRONLY)
    buf = b"x" * size
    at, took = 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        os.pwrite(fd, buf, at)
        os.fdatasync(fd)
        took.append(time.perf_counter() - t)
        at = (at + size) % (FILE_BYTES - size)
    took.sort()
    os.write(out, f"{len(took)} {took[len(took) // 2] * 1e6:.0f} "
                  f"{took[len(took) * 99 // 100] * 1e6:.0f}\n".encode())


def main():
    writers = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
    with tempfile.TemporaryDirectory(dir=sys.argv[4] if len(sys.argv) > 4 else None) as d:
        r, w = os.pipe()
        children = []
        for i in range(writers):
            pid = os.fork()
            if pid == 0:
                os.close(r)
                writer(os.path.join(d, f"log.{i}"), seconds, size, w)
                os._exit(0)
            children.append(pid)
        os.close(w)
        for pid in children:
            os.waitpid(pid, 0)
        lines = os.read(r, 1 << 16).decode().split()
    total = 0
    for i in range(0, len(lines), 3):
        n, p50, p99 = int(lines[i]), lines[i + 1], lines[i + 2]
        total += n
        print(f"writer: {n / seconds:.0f} syncs/s, write + fdatasync p50 {p50} us, p99 {p99} us")
    print(f"{writers} writers of {size} B: {total / seconds:.0f} syncs/s in all")


if __name__ == "__main__":
    main()
