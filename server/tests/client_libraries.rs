//! The lock workflow of the README and transactions, through the client
//! libraries people use: redis-py, the `redis` crate and ioredis (Node),
//! each against the real binary, with the durable state checked after a
//! restart (SIGKILL) from a plain RESP client.
//!
//! What broke: every library's default transaction (`pipeline()`,
//! `pipe().atomic()`, `multi()`) sends MULTI … EXEC; the server rejected
//! MULTI and ran the commands anyway, so a client saw an error while its
//! appends had landed. Also: redis-py retries a command whose reply timed
//! out (10 times by default), which duplicates a plain `LOG.APPEND`; and
//! JavaScript numbers round tokens above 2^53 unless ioredis is told
//! `stringNumbers`.
//!
//! redis-py and ioredis are installed by `.ci/run` under the target
//! directory; a test whose library is missing fails in CI and is skipped,
//! with the reason printed, elsewhere.

mod common;

use std::time::Duration;

use common::*;

/// Payloads of a stream's records, from a plain client.
fn payloads(c: &mut Client, stream: &str) -> Vec<String> {
    c.cmd(&["LOG.READ", stream, "0", "COUNT", "1000"])
        .array()
        .iter()
        .map(|r| String::from_utf8_lossy(r.array()[2].bulk()).to_string())
        .collect()
}

fn highest(c: &mut Client, stream: &str) -> i64 {
    c.cmd(&["LOG.STAT", stream]).array()[1].int()
}

/// After a restart: the lock workflow's stream, the accepted transaction
/// whole, nothing of the rejected one.
fn check_durable_state(server: &ServerProcess, tb: i64) {
    let mut c = server.client();
    assert_eq!(payloads(&mut c, "jobs"), ["a1", "b1"]);
    assert_eq!(highest(&mut c, "jobs"), tb);
    assert_eq!(payloads(&mut c, "orders"), ["o1", "o2"]);
    assert_eq!(payloads(&mut c, "audit"), ["order o1,o2"]);
    assert_eq!(highest(&mut c, "audit"), tb + 1);
    assert_eq!(c.cmd(&["LEASE.INFO", "jobs"]), Value::Null);
}

const PY_WORKFLOW: &str = r#"
import redis, sys, time
PORT, PROTO = int(sys.argv[1]), int(sys.argv[2])
a = redis.Redis(host="127.0.0.1", port=PORT, protocol=PROTO)
b = redis.Redis(host="127.0.0.1", port=PORT, protocol=PROTO)

# The README's lock workflow: A holds the lease, writes, stalls past its ttl.
ta, ttl = a.execute_command("LEASE.ACQUIRE", "jobs", "worker-a", 300, "FENCE")
assert ttl == 300, ttl
assert a.execute_command("LOG.APPEND", "jobs", ta, b"a1") == 0
time.sleep(0.4)
tb, _ = b.execute_command("LEASE.ACQUIRE", "jobs", "worker-b", 10000, "FENCE")
assert tb > ta, (ta, tb)
assert b.execute_command("LOG.APPEND", "jobs", tb, b"b1") == 1
try:
    a.execute_command("LOG.APPEND", "jobs", ta, b"a2, late")
    sys.exit("a stale append was accepted")
except redis.ResponseError as e:
    assert str(e) == f"STALE token {ta} is below the highest accepted token {tb}", str(e)
try:
    a.execute_command("LEASE.RENEW", "jobs", "worker-a", ta, 300)
    sys.exit("an expired lease was renewed")
except redis.ResponseError as e:
    assert str(e).startswith("LOST"), str(e)
assert b.execute_command("LEASE.RENEW", "jobs", "worker-b", tb, 10000) == 10000
assert b.execute_command("LEASE.RELEASE", "jobs", "worker-b", tb) == 1
assert b.execute_command("LEASE.INFO", "jobs") is None

# pipeline() is a transaction (MULTI ... EXEC) by default: all or nothing.
p = b.pipeline()
p.execute_command("LOG.APPEND", "orders", tb, b"o1", b"o2")
p.execute_command("LOG.APPEND", "audit", tb, b"order o1,o2")
assert p.execute() == [0, 0]
b.execute_command("LOG.FENCE", "audit", tb + 1)
p = b.pipeline()
p.execute_command("LOG.APPEND", "orders", tb, b"o3")
p.execute_command("LOG.APPEND", "audit", tb, b"stale")
try:
    p.execute()
    sys.exit("a transaction with a stale write was answered")
except redis.exceptions.ResponseError as e:
    assert "not applied" in str(e) or "STALE" in str(e), str(e)
p = b.pipeline()
p.execute_command("LOG.APPEND", "orders", tb, b"o3")
p.execute_command("LOG.APPEND", "audit", tb, b"stale")
res = p.execute(raise_on_error=False)
assert isinstance(res[0], redis.exceptions.ExecAbortError), res
assert "the transaction was not applied" in str(res[0]), res
assert "STALE token %d is below the highest accepted token %d" % (tb, tb + 1) in str(res[1]), res
assert b.execute_command("LOG.STAT", "orders")[b"next_offset" if PROTO == 3 else 3] == 2
print(tb)
"#;

#[test]
fn redis_py_runs_the_lock_workflow_and_all_or_nothing_pipelines() {
    let Some(python) = python_with_redis_py() else {
        return;
    };
    for proto in ["2", "3"] {
        let dir = tempfile::tempdir().unwrap();
        let server = ServerProcess::start(dir.path(), &[]);
        let out = std::process::Command::new(&python)
            .args(["-c", PY_WORKFLOW, &server.addr.port().to_string(), proto])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "RESP{proto}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tb: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        drop(server);
        let server = ServerProcess::start(dir.path(), &[]);
        check_durable_state(&server, tb);
    }
}

#[test]
fn redis_py_default_retries_duplicate_append_but_not_appendat() {
    //! redis-py retries a command whose reply timed out (10 times by
    //! default): a plain LOG.APPEND may then land twice; LOG.APPENDAT is the
    //! idempotent form, and its retries write each record once.
    let Some(python) = python_with_redis_py() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let script = format!(
        r#"
import redis
# A socket timeout shorter than an fsync: replies are "lost" and retried.
r = redis.Redis(host="127.0.0.1", port={port}, socket_timeout=0.0001)
plain = 0
for i in range(30):
    try:
        r.execute_command("LOG.APPEND", "plain", 1, b"r%d" % i)
        plain += 1
    except redis.exceptions.TimeoutError:
        pass
for i in range(30):
    # The retry loop of docs/CLIENTS.md, with redis-py's own retries inside.
    while True:
        try:
            assert r.execute_command("LOG.APPENDAT", "exact", 1, i, b"r%d" % i) == i
            break
        except redis.exceptions.TimeoutError:
            continue
print(plain)
"#,
        port = server.addr.port()
    );
    let answered: usize = run_python(&python, &script).trim().parse().unwrap();
    let mut c = server.client();
    let stored = payloads(&mut c, "plain").len();
    eprintln!("LOG.APPEND with redis-py's retries: {answered} answered, {stored} stored");
    assert!(stored >= answered);
    let exact = payloads(&mut c, "exact");
    let expected: Vec<String> = (0..30).map(|i| format!("r{i}")).collect();
    assert_eq!(
        exact, expected,
        "LOG.APPENDAT wrote a record twice or lost one"
    );
}

#[test]
fn the_redis_crate_runs_the_lock_workflow_and_atomic_pipelines() {
    use redis::{ErrorKind, RedisResult, Value as RV};
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let client = redis::Client::open(format!("redis://{}/", server.addr)).unwrap();
    let mut a = client.get_connection().unwrap();
    let mut b = client.get_connection().unwrap();
    let acquire = |con: &mut redis::Connection, owner: &str, ttl: i64| -> (i64, i64) {
        redis::cmd("LEASE.ACQUIRE")
            .arg("jobs")
            .arg(owner)
            .arg(ttl)
            .arg("FENCE")
            .query(con)
            .unwrap()
    };
    let append =
        |con: &mut redis::Connection, stream: &str, token: i64, p: &str| -> RedisResult<i64> {
            redis::cmd("LOG.APPEND")
                .arg(stream)
                .arg(token)
                .arg(p)
                .query(con)
        };
    let (ta, ttl) = acquire(&mut a, "worker-a", 300);
    assert_eq!(ttl, 300);
    assert_eq!(append(&mut a, "jobs", ta, "a1").unwrap(), 0);
    std::thread::sleep(Duration::from_millis(400));
    let (tb, _) = acquire(&mut b, "worker-b", 10_000);
    assert!(tb > ta);
    assert_eq!(append(&mut b, "jobs", tb, "b1").unwrap(), 1);
    let stale = append(&mut a, "jobs", ta, "a2, late").unwrap_err();
    assert_eq!(stale.code(), Some("STALE"), "{stale}");
    assert!(
        stale.to_string().contains(&format!(
            "token {ta} is below the highest accepted token {tb}"
        )),
        "{stale}"
    );
    let lost: RedisResult<i64> = redis::cmd("LEASE.RENEW")
        .arg("jobs")
        .arg("worker-a")
        .arg(ta)
        .arg(300)
        .query(&mut a);
    assert_eq!(lost.unwrap_err().code(), Some("LOST"));
    let renewed: i64 = redis::cmd("LEASE.RENEW")
        .arg("jobs")
        .arg("worker-b")
        .arg(tb)
        .arg(10_000)
        .query(&mut b)
        .unwrap();
    assert_eq!(renewed, 10_000);
    let released: i64 = redis::cmd("LEASE.RELEASE")
        .arg("jobs")
        .arg("worker-b")
        .arg(tb)
        .query(&mut b)
        .unwrap();
    assert_eq!(released, 1);

    // pipe().atomic() is MULTI ... EXEC: all or nothing.
    let offsets: (i64, i64) = redis::pipe()
        .atomic()
        .cmd("LOG.APPEND")
        .arg("orders")
        .arg(tb)
        .arg("o1")
        .arg("o2")
        .cmd("LOG.APPEND")
        .arg("audit")
        .arg(tb)
        .arg("order o1,o2")
        .query(&mut b)
        .unwrap();
    assert_eq!(offsets, (0, 0));
    let _: i64 = redis::cmd("LOG.FENCE")
        .arg("audit")
        .arg(tb + 1)
        .query(&mut b)
        .unwrap();
    let mut rejected = redis::pipe();
    rejected
        .atomic()
        .cmd("LOG.APPEND")
        .arg("orders")
        .arg(tb)
        .arg("o3")
        .cmd("LOG.APPEND")
        .arg("audit")
        .arg(tb)
        .arg("stale");
    let err = rejected.query::<(i64, i64)>(&mut b).unwrap_err();
    assert_ne!(err.kind(), ErrorKind::Io, "{err}");
    // Each place's answer, as the server gave it.
    let places: Vec<RV> = rejected.clone().ignore_errors().query(&mut b).unwrap();
    let codes: Vec<Option<String>> = places
        .iter()
        .map(|v| match v {
            RV::ServerError(e) => Some(e.code().to_string()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        codes,
        [Some("EXECABORT".to_string()), Some("STALE".to_string())]
    );
    drop((a, b));
    drop(server);
    let server = ServerProcess::start(dir.path(), &[]);
    check_durable_state(&server, tb);
}

const NODE_WORKFLOW: &str = r#"
const Redis = require('ioredis');
const assert = require('assert');
const port = Number(process.argv[1]);
(async () => {
  // stringNumbers: integer replies as strings, so tokens above 2^53 stay exact.
  const opts = { host: '127.0.0.1', port, stringNumbers: true };
  const a = new Redis(opts), b = new Redis(opts);
  const [ta, ttl] = await a.call('LEASE.ACQUIRE', 'jobs', 'worker-a', 300, 'FENCE');
  assert.strictEqual(ttl, '300');
  assert.strictEqual(await a.call('LOG.APPEND', 'jobs', ta, 'a1'), '0');
  await new Promise((r) => setTimeout(r, 400));
  const [tb] = await b.call('LEASE.ACQUIRE', 'jobs', 'worker-b', 10000, 'FENCE');
  assert.ok(BigInt(tb) > BigInt(ta));
  assert.strictEqual(await b.call('LOG.APPEND', 'jobs', tb, 'b1'), '1');
  await assert.rejects(a.call('LOG.APPEND', 'jobs', ta, 'a2, late'),
    { message: `STALE token ${ta} is below the highest accepted token ${tb}` });
  await assert.rejects(a.call('LEASE.RENEW', 'jobs', 'worker-a', ta, 300), /^ReplyError: LOST|LOST/);
  assert.strictEqual(await b.call('LEASE.RENEW', 'jobs', 'worker-b', tb, 10000), '10000');
  assert.strictEqual(await b.call('LEASE.RELEASE', 'jobs', 'worker-b', tb), '1');

  // multi() is MULTI ... EXEC: all or nothing.
  const ok = await b.multi()
    .call('LOG.APPEND', 'orders', tb, 'o1', 'o2')
    .call('LOG.APPEND', 'audit', tb, 'order o1,o2')
    .exec();
  assert.deepStrictEqual(ok, [[null, '0'], [null, '0']]);
  const fenced = (BigInt(tb) + 1n).toString();
  assert.strictEqual(await b.call('LOG.FENCE', 'audit', fenced), fenced);
  let rejected;
  try {
    rejected = await b.multi()
      .call('LOG.APPEND', 'orders', tb, 'o3')
      .call('LOG.APPEND', 'audit', tb, 'stale')
      .exec();
  } catch (e) {
    rejected = e;
  }
  const text = JSON.stringify(rejected, Object.getOwnPropertyNames(rejected)) + String(rejected)
    + (Array.isArray(rejected) ? rejected.map((r) => String(r[0])).join(' ') : '');
  assert.ok(/not applied|STALE/.test(text), text);

  // Tokens above 2^53: exact with stringNumbers, rounded without.
  const big = '9007199254740993';
  assert.strictEqual(await a.call('LOG.FENCE', 'big', big), big);
  const plain = new Redis({ host: '127.0.0.1', port });
  const rounded = await plain.call('LOG.FENCE', 'big', big);
  assert.notStrictEqual(String(rounded), big);
  console.log(tb);
  for (const c of [a, b, plain]) c.disconnect();
})().catch((e) => { console.error(e); process.exit(1); });
"#;

#[test]
fn ioredis_runs_the_lock_workflow_and_all_or_nothing_multi() {
    let Some(node_path) = node_with_ioredis() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let out = std::process::Command::new("node")
        .args(["-e", NODE_WORKFLOW, &server.addr.port().to_string()])
        .env("NODE_PATH", &node_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tb: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    drop(server);
    let server = ServerProcess::start(dir.path(), &[]);
    check_durable_state(&server, tb);
    assert_eq!(
        server.client().cmd(&["LOG.STAT", "big"]).array()[1].int(),
        9_007_199_254_740_993
    );
}
