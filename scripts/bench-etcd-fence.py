#!/usr/bin/env python3
"""The fence as etcd users write it, measured on this machine: a transaction
(compare the stream's highest token, then put the new highest and the
record) over etcd's JSON gateway, 50 connections, HTTP/1.1 pipelining.

    scripts/bench-etcd-fence.py [--members 1|3] [--pipeline P] [--seconds S]

Starts etcd (from PATH) with --members members on 127.0.0.1 in a temporary
directory, measures fenced appends (every token valid) and stale writes
(every token below the highest: the transaction changes nothing), prints
ops/s, and stops etcd. Compare with scripts/bench-cluster.sh (fencelog, 3
nodes) in the same sitting; never with a figure from another run.
"""
import argparse, asyncio, base64, json, os, shutil, signal, subprocess, sys, tempfile, time

def b64(s):
    return base64.b64encode(s.encode()).decode()

def txn(stream, token, record):
    key = f"fence/{stream}"
    put = lambda k, v: {"request_put": {"key": b64(k), "value": b64(v)}}
    # Refused (nothing written) when the highest token is above ours.
    body = {
        "compare": [{"key": b64(key), "target": "VALUE", "result": "GREATER",
                     "value": b64(f"{token:020}")}],
        "success": [],
        "failure": [put(key, f"{token:020}"), put(f"rec/{stream}/{record}", "x" * 100)],
    }
    return json.dumps(body).encode()

def request(port, body):
    return (f"POST /v3/kv/txn HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

async def read_response(reader, parse=True):
    head = await reader.readuntil(b"\r\n\r\n")
    at = head.lower().find(b"content-length:")
    length = int(head[at + 15:head.find(b"\r\n", at)]) if at >= 0 else 0
    body = await reader.readexactly(length)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace") + body.decode(errors="replace"))
    # The load generator must not be what is measured: no JSON parse per
    # answer, only whether the comparison held (the write was refused).
    return json.loads(body) if parse else b'"succeeded":true' in body

async def client(i, port, pipeline, deadline, stale, counts):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    stream = f"s{i}"
    n = 0
    token = 1 if stale else 1_000_000
    while time.monotonic() < deadline:
        batch = b"".join(request(port, txn(stream, token, n + k)) for k in range(pipeline))
        writer.write(batch)
        await writer.drain()
        for _ in range(pipeline):
            refused = await read_response(reader, parse=False)
            if refused != stale:
                r = refused
                raise RuntimeError(f"unexpected answer {r}")
            counts[0] += 1
        n += pipeline
    writer.close()

async def setup(port, clients):
    # Every stream's highest token starts at 1000 (a stale write carries 1).
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(clients):
        body = json.dumps({"key": b64(f"fence/s{i}"), "value": b64(f"{1000:020}")}).encode()
        writer.write((f"POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
        await writer.drain()
        await read_response(reader)
    writer.close()

async def measure_part(port, ids, pipeline, start, seconds, stale):
    counts = [0]
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    await asyncio.gather(*(client(i, port, pipeline, start + seconds, stale, counts)
                           for i in ids))
    return counts[0]

def part(args):
    return asyncio.run(measure_part(*args))

def measure(port, clients, pipeline, seconds, stale, procs):
    # Several processes: one Python process is slower than etcd.
    import multiprocessing
    start = time.monotonic() + 0.5
    parts = [(port, list(range(k, clients, procs)), pipeline, start, seconds, stale)
             for k in range(procs)]
    with multiprocessing.Pool(procs) as pool:
        done = sum(pool.map(part, parts))
    return done / seconds

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=3, choices=[1, 3])
    ap.add_argument("--pipeline", type=int, default=16)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--procs", type=int, default=2, help="load generator processes")
    a = ap.parse_args()
    etcd = shutil.which("etcd")
    if not etcd:
        sys.exit("etcd is not on PATH (Debian: apt install etcd-server)")
    work = tempfile.mkdtemp(prefix="etcd-bench-")
    peers = ",".join(f"e{i}=http://127.0.0.1:{23800 + i}" for i in range(a.members))
    procs = []
    try:
        for i in range(a.members):
            procs.append(subprocess.Popen([
                etcd, "--name", f"e{i}", "--data-dir", os.path.join(work, f"e{i}"),
                "--listen-client-urls", f"http://127.0.0.1:{23790 + i}",
                "--advertise-client-urls", f"http://127.0.0.1:{23790 + i}",
                "--listen-peer-urls", f"http://127.0.0.1:{23800 + i}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{23800 + i}",
                "--initial-cluster", peers, "--initial-cluster-state", "new",
                "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        port = 23790
        for _ in range(100):
            try:
                asyncio.run(setup(port, a.clients))
                break
            except (OSError, RuntimeError, asyncio.IncompleteReadError):
                time.sleep(0.2)
        else:
            sys.exit("etcd did not answer in 20 s")
        print(f"etcd {subprocess.run([etcd, '--version'], capture_output=True, text=True).stdout.split()[2]}, "
              f"{a.members} member(s), {a.clients} connections x pipeline {a.pipeline}, {a.seconds} s each")
        for name, stale in (("fenced appends", False), ("stale writes refused", True)):
            rate = measure(port, a.clients, a.pipeline, a.seconds, stale, a.procs)
            print(f"{name:22} {rate:10.0f}/s")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
    main()
