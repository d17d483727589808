// Rendezvous and failures between real worker processes on 127.0.0.1: workers that die, hang or
// present a wrong token; the store before a connection presents its token; Gloo's ports.
import * as fs from 'node:fs';
import * as net from 'node:net';
import { expect } from 'chai';
import { freePort } from '../helpers/ports.js';
import { RendezvousError, StoreClient, StoreServer } from '../../lib/comm/store.js';
import { dataFor } from '../helpers/collective-worker.js';
import { decode, exitText, jobEnv, killLive, newestWorker, startWorker } from '../helpers/collective-jobs.js';

afterEach(killLive);

describe('distributed failures', function () {
  it('stops every rank with the setting that differs when configurations differ', async () => {
    const port = await freePort();
    const spec = {
      timeoutMs: 5000,
      config: { batchSize: 32, lr: 0.1, model: 'mlp' },
      configByRank: { 1: { batchSize: 64 } },
    };
    const exits = await Promise.all([0, 1].map((r) => startWorker(spec, jobEnv(r, 2, port), 15000)));
    for (const e of exits) {
      expect(e.hung, `rank ${e.rank} hung`).to.equal(false);
      expect(e.code, exitText(e)).to.equal(1);
      expect(e.ms, `rank ${e.rank} should stop well within its 5000 ms timeout`).to.be.below(5000);
      expect(e.stdout, `rank ${e.rank} must not report results`).to.equal('');
      expect(e.stderr).to.include('ERR_RENDEZVOUS');
      expect(e.stderr).to.include("the workers' configurations differ: batchSize is 32 on rank 0 but 64 on rank 1");
    }
  });

  it('tells a rank that reaches the configuration check late why the job stopped', async () => {
    // Rank 0 gives up (and closes the store it hosts) as soon as it has seen rank 1's config;
    // rank 2, slower to get there, must still learn why the job stopped.
    const port = await freePort();
    const spec = {
      timeoutMs: 5000,
      config: { batchSize: 32, lr: 0.1 },
      configByRank: { 1: { batchSize: 64 } },
      configDelayByRank: { 2: 500 },
    };
    const exits = await Promise.all([0, 1, 2].map((r) => startWorker(spec, jobEnv(r, 3, port), 15000)));
    for (const e of exits) {
      expect(e.hung, `rank ${e.rank} hung`).to.equal(false);
      expect(e.code, exitText(e)).to.equal(1);
      // Which pair a rank names depends on the order it compares in; any pair with rank 1 is right.
      expect(e.stderr, `rank ${e.rank}`).to.match(
        /the workers' configurations differ: batchSize is (32 on rank [02] but 64 on rank 1|64 on rank 1 but 32 on rank 2)/,
      );
    }
  });

  it('fails fast when the master port is already in use', async () => {
    const busy = await StoreServer.listen({ host: '127.0.0.1', port: 0, token: 'someone-else' });
    try {
      const e = await startWorker({ timeoutMs: 5000 }, jobEnv(0, 2, busy.port), 15000);
      expect(e.code, exitText(e)).to.equal(1);
      expect(e.stderr).to.include('ERR_RENDEZVOUS');
      expect(e.stderr).to.include(`port ${busy.port} on 127.0.0.1 is already in use`);
      expect(e.ms, 'rank 0 should not wait for anything').to.be.below(5000);
    } finally {
      await busy.close();
    }
  });

  it('refuses a client that presents the wrong job token', async () => {
    const server = await StoreServer.listen({ host: '127.0.0.1', port: 0, token: 'right' });
    // The client reaches the store through a relay that counts its connections.
    let connections = 0;
    const relay = net.createServer((socket) => {
      connections++;
      const upstream = net.connect(server.port, '127.0.0.1');
      socket.pipe(upstream).pipe(socket);
      socket.on('error', () => upstream.destroy());
      upstream.on('error', () => socket.destroy());
      socket.on('close', () => upstream.destroy());
      upstream.on('close', () => socket.destroy());
    });
    await new Promise((resolve) => relay.listen(0, '127.0.0.1', resolve));
    try {
      const ok = await StoreClient.connect('127.0.0.1', relay.address().port, 'right', 2000);
      ok.close();
      expect(connections, 'connections of a client with the right token').to.equal(1);
      let caught;
      try {
        (await StoreClient.connect('127.0.0.1', relay.address().port, 'wrong', 2000)).close();
      } catch (err) {
        caught = err;
      }
      expect(caught, 'connecting with the wrong token succeeded').to.be.instanceOf(RendezvousError);
      expect(caught.code).to.equal('ERR_RENDEZVOUS');
      expect(caught.message).to.match(/refused this worker: wrong job token/);
      expect(connections - 1, 'a refusal is not a reason to retry: connections of the refused client').to.equal(1);
    } finally {
      await new Promise((resolve) => relay.close(resolve));
      await server.close();
    }
  });

  it('stops a worker whose token does not match the launcher-hosted store', async () => {
    const server = await StoreServer.listen({ host: '127.0.0.1', port: 0, token: 'right' });
    try {
      const env = { ...jobEnv(0, 2, server.port, 'wrong'), ACCORDION_STORE_HOSTED: '1' };
      const e = await startWorker({ timeoutMs: 5000 }, env, 15000);
      expect(e.hung, 'the worker hung').to.equal(false);
      expect(e.code, exitText(e)).to.equal(1);
      expect(e.stderr).to.include('ERR_RENDEZVOUS');
      expect(e.stderr).to.include(`the rendezvous store at 127.0.0.1:${server.port} refused this worker: wrong job token`);
      expect(e.ms).to.be.below(5000);
    } finally {
      await server.close();
    }
  });

  it('gives up on an unreachable master after its timeout', async () => {
    const port = await freePort();
    const e = await startWorker({ timeoutMs: 1500 }, jobEnv(1, 2, port), 15000);
    expect(e.hung, 'the worker hung').to.equal(false);
    expect(e.code, exitText(e)).to.equal(1);
    expect(e.stderr).to.include('ERR_RENDEZVOUS');
    expect(e.stderr).to.include(`cannot reach the rendezvous store at 127.0.0.1:${port} within 1500 ms`);
    expect(e.ms).to.be.within(1400, 5000);
  });

  it('fails the collective, not hangs, when a rank dies mid-job', async () => {
    const port = await freePort();
    const timeoutMs = 5000;
    const spec = { timeoutMs, exitAfterConnect: { rank: 1, code: 3 }, cases: [{ op: 'allReduce', length: 100_000 }] };
    const [zero, one] = await Promise.all([0, 1].map((r) => startWorker(spec, jobEnv(r, 2, port), 20000)));
    expect(one.code, `rank 1 should have died on purpose: ${exitText(one)}`).to.equal(3);
    expect(zero.hung, 'rank 0 hung').to.equal(false);
    expect(zero.code, exitText(zero)).to.equal(1);
    expect(zero.stdout).to.equal('');
    expect(zero.stderr).to.match(/^error: ERR_COLLECTIVE all-reduce of 100000 floats failed on rank 0 of 2/);
    expect(zero.ms, 'rank 0 should fail within its timeout').to.be.below(timeoutMs + 3000);
  });
});

/** A raw connection to host:port; `closed` resolves with the milliseconds it stayed open. */
function rawConnection(port) {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const socket = net.connect({ host: '127.0.0.1', port });
    socket.on('error', () => {});
    const closed = new Promise((r) => socket.once('close', () => r(Date.now() - started)));
    socket.once('connect', () => resolve({ socket, closed, isClosed: () => socket.destroyed }));
    socket.once('close', () => reject(new Error('refused before connecting')));
  });
}

function within(promise, ms) {
  let timer;
  return Promise.race([promise, new Promise((r) => (timer = setTimeout(() => r('still open'), ms)))]).finally(() => clearTimeout(timer));
}

describe('the rendezvous store before a connection presents the token', function () {
  it('closes a connection at once on an oversized length prefix, without buffering its body', async () => {
    const server = await StoreServer.listen({ host: '127.0.0.1', port: 0, token: 'right' });
    try {
      const stranger = await rawConnection(server.port);
      // A hello announcing a 2 GiB key, then a stream of junk behind it.
      const head = Buffer.from([0, 0xff, 0xff, 0xff, 0x7f]);
      stranger.socket.write(head);
      const junk = Buffer.alloc(1 << 20, 0x41);
      const cpuBefore = process.cpuUsage();
      for (let i = 0; i < 32 && !stranger.isClosed(); i++) stranger.socket.write(junk);
      const openMs = await within(stranger.closed, 1000);
      expect(openMs, 'the store kept the connection').to.be.a('number');
      expect(openMs).to.be.below(1000);
      const cpu = process.cpuUsage(cpuBefore);
      expect((cpu.user + cpu.system) / 1000, 'CPU ms spent on the junk').to.be.below(1000);
      // A connection whose first byte is no hello is closed too.
      const other = await rawConnection(server.port);
      other.socket.write('GET / HTTP/1.0\r\n\r\n');
      expect(await within(other.closed, 1000)).to.be.a('number');
      // Members of the job are served as before.
      const ok = await StoreClient.connect('127.0.0.1', server.port, 'right', 2000);
      await ok.set('k', 'v');
      expect((await ok.get('k', 1000)).toString()).to.equal('v');
      ok.close();
    } finally {
      await server.close();
    }
  });

  it('ends a pending wait with its connection: no timer of a worker that is gone keeps the launcher alive', async () => {
    const server = await StoreServer.listen({ host: '127.0.0.1', port: 0, token: 'right' });
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
    try {
      const waiter = await StoreClient.connect('127.0.0.1', server.port, 'right', 2000);
      const before = timers();
      const pending = waiter.get('never-set', 60_000).catch((err) => err);
      await new Promise((r) => setTimeout(r, 200)); // the request reaches the store
      expect(timers(), "the store's timer of the wait").to.be.above(before);
      waiter.close();
      expect(await pending).to.be.an.instanceOf(RendezvousError);
      await new Promise((r) => setTimeout(r, 200)); // the store sees the connection close
      expect(timers(), 'timers left once the waiter is gone').to.equal(before);
    } finally {
      await server.close();
    }
  });

  it('closes a connection that stays silent past the authentication deadline', async () => {
    const server = await StoreServer.listen({ host: '127.0.0.1', port: 0, token: 'right' });
    try {
      const silent = await rawConnection(server.port);
      const half = await rawConnection(server.port);
      half.socket.write(Buffer.from([0, 5, 0, 0, 0, 0x72])); // the start of a hello, never finished
      const [silentMs, halfMs] = await Promise.all([within(silent.closed, 8000), within(half.closed, 8000)]);
      for (const ms of [silentMs, halfMs]) {
        expect(ms, 'the connection is still open after 8 s').to.be.a('number');
        expect(ms).to.be.within(4500, 7000);
      }
    } finally {
      await server.close();
    }
  });

  it('refuses connections beyond the cap on unauthenticated ones, while a job still connects and runs', async function () {
    this.timeout(60000);
    const token = 'cap-test';
    const server = await StoreServer.listen({ host: '127.0.0.1', port: 0, token });
    const strangers = [];
    try {
      for (let i = 0; i < 32; i++) strangers.push(await rawConnection(server.port));
      const extras = [];
      for (let i = 0; i < 5; i++) extras.push(await rawConnection(server.port));
      for (const extra of extras) expect(await within(extra.closed, 1000), 'a connection beyond the cap was kept').to.be.a('number');
      expect(strangers.filter((s) => s.isClosed()), 'connections within the cap').to.have.length(0);
      // A job started now gets in once the strangers' time is up (its clients retry), and works.
      const spec = { timeoutMs: 20000, cases: [{ op: 'allReduce', length: 1000 }] };
      const env = (r) => ({ ...jobEnv(r, 2, server.port, token), ACCORDION_STORE_HOSTED: '1' });
      const exits = await Promise.all([0, 1].map((r) => startWorker(spec, env(r), 40000)));
      for (const e of exits) expect(e.code, exitText(e)).to.equal(0);
      expect(strangers.filter((s) => !s.isClosed()), 'strangers still connected').to.have.length(0);
    } finally {
      for (const s of strangers) s.socket.destroy();
      await server.close();
    }
  });
});

/** The TCP ports a process listens on, from /proc (its socket inodes matched against the kernel's table). */
function listeningPorts(pid) {
  const inodes = new Set();
  for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(fs.readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) inodes.add(m[1]);
    } catch {
      /* closed meanwhile */
    }
  }
  const ports = [];
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    if (!fs.existsSync(table)) continue;
    for (const line of fs.readFileSync(table, 'utf8').trim().split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f[3] === '0A' && inodes.has(f[9])) ports.push(parseInt(f[1].split(':')[1], 16));
    }
  }
  return ports;
}

describe("Gloo's ports while the workers connect", function () {
  it('drops a stray connection that sends junk to a pair port, names its address, and the job runs', async function () {
    this.timeout(60000);
    const port = await freePort();
    const spec = { timeoutMs: 20000, encoding: 'base64', cases: [{ op: 'allReduce', length: 1000 }] };
    // Rank 0 starts alone: it hosts the store and listens for rank 1 on a Gloo pair port.
    const zero = startWorker(spec, jobEnv(0, 2, port), 45000);
    const child = newestWorker();
    let pairPorts = [];
    for (let i = 0; i < 200 && pairPorts.length === 0; i++) {
      await new Promise((r) => setTimeout(r, 50));
      pairPorts = listeningPorts(child.pid).filter((p) => p !== port);
    }
    expect(pairPorts, 'rank 0 never listened for rank 1').to.have.length(1);
    const stray = await rawConnection(pairPorts[0]);
    const strayAddress = `127.0.0.1:${stray.socket.localPort}`;
    stray.socket.write(Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 151 + 7) & 0xff)));
    await new Promise((r) => setTimeout(r, 300));
    const one = startWorker(spec, jobEnv(1, 2, port), 45000);
    const exits = await Promise.all([zero, one]);
    stray.socket.destroy();
    for (const e of exits) expect(e.code, exitText(e)).to.equal(0);
    expect(exits[0].stderr).to.include(`rank 0 was reached by a stray connection from ${strayAddress} on its port for rank 1`);
    const want = dataFor(0, 1000, 0).map((v, i) => v + dataFor(1, 1000, 0)[i]);
    for (const e of exits) {
      const got = decode(JSON.parse(e.stdout.trim().split('\n').at(-1)).results[0]);
      for (let i = 0; i < want.length; i++) expect(got[i]).to.be.closeTo(want[i], 1e-5);
    }
  });
});
