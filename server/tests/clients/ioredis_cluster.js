// The README's lock workflow through ioredis' Cluster, across a leader
// change. Run by server/tests/cluster_clients.rs:
//
//     node ioredis_cluster.js HOST:PORT [HOST:PORT ...]
//
// Phase 1 runs against the cluster as it is, then prints `KILL host:port`
// (the primary ioredis uses) and waits for a line on stdin: the test kills
// the leader (SIGKILL) meanwhile. Phase 2 goes on with the same Cluster
// object. The last line printed is a JSON summary the test checks.
const Redis = require('ioredis');
const assert = require('assert');
const readline = require('readline');

const DEADLINE_MS = 30000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (...a) => console.error(...a);

// An error reply that is an answer, not a failover's noise.
const ANSWER = /^(STALE|LOST|HELD|MISMATCH|ERR|TOOBIG|TRIMMED)/;

// f() until it answers, for at most DEADLINE_MS: only for calls whose retry
// is harmless (reads, LOG.APPENDAT, renewals, a stale write).
async function retrying(what, f) {
  const deadline = Date.now() + DEADLINE_MS;
  for (let attempt = 1; ; attempt++) {
    try {
      return await f();
    } catch (e) {
      if (ANSWER.test(e.message)) throw e;
      if (Date.now() > deadline) throw new Error(`${what}: no answer within ${DEADLINE_MS} ms, last: ${e.message}`);
      log(`${what}: attempt ${attempt}: ${e.name}: ${e.message}; again`);
      await sleep(100);
    }
  }
}

async function expectError(what, prefix, p) {
  let got;
  try {
    got = await p;
  } catch (e) {
    assert.ok(e.message.startsWith(prefix), `${what}: expected ${prefix}, got ${e.message}`);
    return e.message;
  }
  assert.fail(`${what}: expected ${prefix}, got ${JSON.stringify(got)}`);
}

(async () => {
  const nodes = process.argv.slice(2).map((a) => {
    const i = a.lastIndexOf(':');
    return { host: a.slice(0, i), port: Number(a.slice(i + 1)) };
  });
  const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  const rc = new Redis.Cluster(nodes, {
    // Integer replies as strings: tokens above 2^53 stay exact (CLIENTS.md).
    redisOptions: { stringNumbers: true, connectTimeout: 2000, maxRetriesPerRequest: 2 },
    retryDelayOnFailover: 200,
    retryDelayOnTryAgain: 200,
    retryDelayOnClusterDown: 200,
    maxRedirections: 16,
    clusterRetryStrategy: (times) => (times > 50 ? null : 200),
    slotsRefreshTimeout: 2000,
  });
  const cmd = (...a) => rc.call(...a);
  await new Promise((resolve, reject) => {
    rc.once('ready', resolve);
    rc.once('error', reject);
  });
  const primaries = rc.nodes('master').map((n) => `${n.options.host}:${n.options.port}`);
  const replicas = rc.nodes('slave').map((n) => `${n.options.host}:${n.options.port}`);
  log(`ioredis ${require('ioredis/package.json').version}: primary ${primaries}, replicas ${replicas}`);
  assert.strictEqual(primaries.length, 1, primaries);
  assert.strictEqual(replicas.length, nodes.length - 1, replicas);

  // Phase 1: A holds the lease, writes, stalls past its ttl; B takes over.
  const [ta, ttl] = await cmd('LEASE.ACQUIRE', 'jobs', 'worker-a', 500, 'FENCE');
  assert.strictEqual(ttl, '500');
  assert.strictEqual(await cmd('LOG.APPEND', 'jobs', ta, 'a1'), '0');
  await sleep(700);
  const [tb] = await cmd('LEASE.ACQUIRE', 'jobs', 'worker-b', 30000, 'FENCE');
  assert.ok(BigInt(tb) > BigInt(ta), [ta, tb]);
  assert.strictEqual(await cmd('LOG.APPEND', 'jobs', tb, 'b1'), '1');
  const stale = await expectError("A's late append", 'STALE', cmd('LOG.APPEND', 'jobs', ta, 'a2 late'));
  assert.strictEqual(stale, `STALE token ${ta} is below the highest accepted token ${tb}`);
  await expectError("A's renewal", 'LOST', cmd('LEASE.RENEW', 'jobs', 'worker-a', ta, 500));

  console.log(`KILL ${primaries[0]}`);
  const { value } = await lines.next();
  assert.strictEqual((value || '').trim(), 'KILLED');

  // Phase 2, the same Cluster object.
  await expectError("A's append after the failover", 'STALE',
    retrying("A's append", () => cmd('LOG.APPEND', 'jobs', ta, 'a3 later')));
  assert.strictEqual(await retrying("B's renewal", () => cmd('LEASE.RENEW', 'jobs', 'worker-b', tb, 30000)), '30000');
  assert.strictEqual(await retrying("B's append", () => cmd('LOG.APPENDAT', 'jobs', tb, 2, 'b2')), '2');
  assert.strictEqual(await retrying("B's release", () => cmd('LEASE.RELEASE', 'jobs', 'worker-b', tb)), '1');
  const [tc] = await retrying("C's acquire", () => cmd('LEASE.ACQUIRE', 'jobs', 'worker-c', 30000, 'FENCE'));
  assert.ok(BigInt(tc) > BigInt(tb), [tb, tc]);
  assert.strictEqual(await retrying("C's append", () => cmd('LOG.APPENDAT', 'jobs', tc, 3, 'c1')), '3');
  for (const t of [ta, tb]) {
    await expectError('a stale append', 'STALE', cmd('LOG.APPEND', 'jobs', t, 'late'));
  }
  const info = await cmd('LEASE.INFO', 'jobs');
  assert.deepStrictEqual([info[0], info[1]], ['worker-c', tc]);
  const read = await retrying('read', () => cmd('LOG.READ', 'jobs', 0, 'COUNT', 100));
  const records = read.map(([o, t, p]) => [Number(o), Number(t), p]);
  const after = rc.nodes('master').map((n) => `${n.options.host}:${n.options.port}`);
  log(`after the failover: primary ${after}`);
  console.log(JSON.stringify({ ta: Number(ta), tb: Number(tb), tc: Number(tc), records }));
  rc.disconnect();
  process.exit(0);
})().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
