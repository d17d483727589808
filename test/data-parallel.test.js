// Data parallelism between real processes: the gradient exchange of every compressor against the
// single-process simulation of the same workers, dense data-parallel training against one worker
// with the combined batch, and what a launched job does when a worker dies or the user presses
// Ctrl-C.
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { freePort } from './helpers/ports.js';
import { ReducerProbe } from '../lib/testing.js';
import { Model, Trainer, loadCheckpoint } from '../lib/index.js';
import { decode, gradientFor, numel } from './helpers/reducer-worker.js';
import { train } from './helpers/train-worker.js';
import { exitWithin, processesWithEnv, startNode, waitFor } from './helpers/processes.js';

const REDUCER_WORKER = fileURLToPath(new URL('./helpers/reducer-worker.js', import.meta.url));
const TRAIN_WORKER = fileURLToPath(new URL('./helpers/train-worker.js', import.meta.url));
const ACCOUNTING_WORKER = fileURLToPath(new URL('./helpers/accounting-worker.js', import.meta.url));
const CLI = fileURLToPath(new URL('../lib/cli.js', import.meta.url));

// ---------------------------------------------------------------------------------------------
// Process bookkeeping: whatever a test starts is killed in afterEach, even when the test failed
// halfway, so one failure never leaves a job running into the next test.

const live = new Set();
const tokens = new Set();

function newToken() {
  const token = `dp-test-${randomBytes(8).toString('hex')}`;
  tokens.add(token);
  return token;
}


/** Processes whose environment carries `token`, as { pid, ppid, rank } (rank undefined for the launcher). */
function jobProcesses(token) {
  return processesWithEnv('ACCORDION_JOB_TOKEN', token).map(({ pid, ppid, state, environ }) => {
    const rank = environ.find((e) => e.startsWith('RANK='));
    return { pid, ppid, state, rank: rank ? Number(rank.slice(5)) : undefined };
  });
}

/** A Node process of a test (see startNode), killed by afterEach if still running. */
const start = (args, env, options) => startNode(live, args, env, options);

function killEverything() {
  for (const entry of live) {
    try {
      if (entry.detached) process.kill(-entry.child.pid, 'SIGKILL');
      else entry.child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
  for (const token of tokens)
    for (const p of jobProcesses(token)) {
      try {
        process.kill(p.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
}

afterEach(async function () {
  killEverything();
  // Wait for the kills to land so that the next test starts on idle cores.
  await Promise.all([...live].map((e) => exitWithin(e, 5000)));
  for (const token of tokens) if (jobProcesses(token).length === 0) tokens.delete(token);
});

/** Runs `script` as every rank of a job; every rank must exit 0. Returns their outputs in rank order. */
async function runJob(script, worldSize, spec, ms = 60000) {
  const port = await freePort();
  const token = newToken();
  const ranks = Array.from({ length: worldSize }, (_, rank) =>
    start([script, JSON.stringify(spec)], {
      RANK: String(rank),
      WORLD_SIZE: String(worldSize),
      MASTER_ADDR: '127.0.0.1',
      MASTER_PORT: String(port),
      ACCORDION_JOB_TOKEN: token,
    }),
  );
  const exits = await Promise.all(ranks.map((r) => exitWithin(r, ms)));
  exits.forEach((e, rank) => {
    expect(e.timedOut, `rank ${rank} did not finish within ${ms} ms`).to.not.equal(true);
    expect(e.code, `rank ${rank} exited with ${e.code ?? e.signal}; stderr:\n${e.stderr}`).to.equal(0);
  });
  return exits.map((e) => JSON.parse(e.stdout.trim().split('\n').at(-1)));
}

// ---------------------------------------------------------------------------------------------
// Comparisons

function maxAbs(a) {
  let m = 0;
  for (const v of a) m = Math.max(m, Math.abs(v));
  return m;
}

/**
 * Gloo's ring may add the workers' contributions in another order than the in-process group, so
 * values agree to float32 rounding of terms of size `scale`, not bit for bit.
 */
function expectClose(got, want, scale, tol, label) {
  if (want === null) {
    expect(got, `${label}: expected null`).to.equal(null);
    return;
  }
  expect(got, `${label}: expected an array, got null`).to.not.equal(null);
  expect(got.length, `${label}: length`).to.equal(want.length);
  let worst = 0;
  let at = -1;
  for (let i = 0; i < want.length; i++) {
    const d = Math.abs(got[i] - want[i]);
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  expect(worst, `${label}: element ${at} is ${got[at]}, expected ${want[at]} (scale ${scale})`).to.be.at.most(tol * scale);
}

// ---------------------------------------------------------------------------------------------

describe('data parallel: gradient exchange between worker processes', function () {
  // 4-D conv, wide matrix, 1-D (always dense) and a small matrix.
  const shapes = [[16, 8, 3, 3], [10, 32], [7], [5, 4]];
  const steps = 3;
  const configs = [
    { compressor: 'powersgd', level: 2, minCompressionRate: 0 },
    { compressor: 'topk', level: 0.3 },
    { compressor: 'none' },
  ];

  for (const config of configs)
    for (const workers of [2, 4])
      it(`${config.compressor} with ${workers} processes matches ${workers} simulated workers (outputs, memories, Q)`, async function () {
        const spec = { shapes, steps, seed: 7, timeoutMs: 30000, ...config };
        const results = await runJob(REDUCER_WORKER, workers, spec);

        const oracle = new ReducerProbe(shapes, { ...config, seed: spec.seed, workers });
        // Otherwise the comparison of memories would be one of nulls only.
        shapes.forEach((shape, p) =>
          expect(oracle.isCompressed(p), `parameter ${p} (${shape}) compressed`).to.equal(config.compressor !== 'none' && shape.length > 1),
        );
        for (let s = 0; s < steps; s++) {
          const grads = Array.from({ length: workers }, (_, w) => shapes.map((shape, p) => gradientFor(w, s, p, numel(shape))));
          const want = oracle.step(grads);
          // Bounds the magnitude of every sum and of the error memories built from these inputs.
          const scales = shapes.map((_, p) => grads.reduce((sum, g) => sum + maxAbs(g[p]), 0));
          for (let r = 0; r < workers; r++) {
            const got = results[r].steps[s];
            expect(results[r].rank).to.equal(r);
            expect(got.floatsSent, `step ${s} rank ${r}: floats sent`).to.equal(want.floatsSent);
            shapes.forEach((_, p) => {
              const label = `step ${s} rank ${r} parameter ${p} (${shapes[p]})`;
              expectClose(decode(got.outputs[p]), want.outputs[r][p], scales[p], 1e-5, `${label}: output`);
              expectClose(decode(got.memories[p]), oracle.memory(r, p), scales[p], 1e-5, `${label}: memory`);
              // Q (Mᵀ P̂ summed over the workers) has a magnitude of its own, unrelated to the inputs'.
              const q = oracle.q(r, p);
              expectClose(decode(got.qs[p]), q, Math.max(1, q ? maxAbs(q) : 0), 1e-4, `${label}: Q`);
            });
          }
          if (config.compressor !== 'none')
            expect(maxAbs(decode(results[0].steps[s].memories[0])), `step ${s}: rank 0's memory of parameter 0`).to.be.above(0);
          // Every rank must apply the same update, or the replicas drift apart.
          for (let r = 1; r < workers; r++)
            shapes.forEach((_, p) =>
              expect(results[r].steps[s].outputs[p], `step ${s} parameter ${p}: rank ${r}'s output differs from rank 0's`).to.equal(
                results[0].steps[s].outputs[p],
              ),
            );
        }
      });
});

describe('data parallel: floats accounting against what the collectives carried', function () {
  // The paper's figure (docs/accounting.md §1, per worker per step): dense numel, PowerSGD (n + m)·r,
  // TopK 2·s·W. Besides it, each step's agreement that every gradient is finite is an all-reduce of
  // W floats, reported as overheadFloats. The group counts what its collectives carried where they
  // run (an all-gather counts its gathered result), so the two must add up exactly.
  const W = 2;
  const lstm = { architecture: 'lstm', classes: 40, hidden: 8, layers: 2, dropout: 0 };
  const cases = [
    { name: 'lstm dense', model: { ...lstm, compressor: 'none' }, steps: 2 },
    { name: 'lstm powersgd rank 2', model: { ...lstm, compressor: 'powersgd', level: 2, minCompressionRate: 0 }, steps: 3 },
    { name: 'lstm topk 0.1', model: { ...lstm, compressor: 'topk', level: 0.1 }, steps: 3 },
    // Mixed levels, the matrices taking the listed levels in turn: PowerSGD's rate test leaves
    // the rank-8 ones dense.
    { name: 'lstm powersgd mixed ranks', model: { ...lstm, compressor: 'powersgd', level: 1 }, cycle: [8, 2, 4, 1], steps: 2 },
    { name: 'lstm topk mixed ratios', model: { ...lstm, compressor: 'topk', level: 0.5 }, cycle: [0.01, 1, 0.25, 0.5], steps: 2 },
    { name: 'resnet18 powersgd mixed ranks', model: { architecture: 'resnet18', classes: 10, compressor: 'powersgd', level: 2, bucketMb: 0 }, cycle: [1, 4], steps: 2 },
    // The exchange overlapped with backward: the same floats, in a few collectives per bucket.
    { name: 'resnet18 powersgd mixed ranks in 1 MiB buckets', model: { architecture: 'resnet18', classes: 10, compressor: 'powersgd', level: 2, bucketMb: 1 }, cycle: [1, 4, 0], steps: 2 },
    { name: 'resnet18 topk in 4 MiB buckets', model: { architecture: 'resnet18', classes: 10, compressor: 'topk', level: 0.01, bucketMb: 4 }, steps: 2 },
    // Values in 16 bits: the same floats in half the bytes (TopK's indices stay 4 bytes and travel
    // in an all-gather of their own).
    { name: 'lstm dense in bf16', model: { ...lstm, compressor: 'none', commDtype: 'bf16' }, steps: 2 },
    { name: 'lstm powersgd rank 2 in fp16', model: { ...lstm, compressor: 'powersgd', level: 2, minCompressionRate: 0, commDtype: 'fp16' }, steps: 2 },
    { name: 'lstm topk 0.1 in bf16', model: { ...lstm, compressor: 'topk', level: 0.1, commDtype: 'bf16' }, steps: 2 },
    { name: 'resnet18 powersgd mixed ranks in 1 MiB buckets, bf16', model: { architecture: 'resnet18', classes: 10, compressor: 'powersgd', level: 2, bucketMb: 1, commDtype: 'bf16' }, cycle: [1, 4, 0], steps: 2 },
  ];

  /** A case's levels per parameter: the cycle's levels over the matrices in turn, 0 for 1-D ones. */
  async function levelsOf(c) {
    const { cycle, ...rest } = c;
    if (!cycle) return rest;
    const model = await Model.create(c.model);
    let k = 0;
    const levels = model.parameters().map((p) => (p.shape.length > 1 ? cycle[k++ % cycle.length] : 0));
    await model.dispose();
    return { ...rest, levels };
  }

  /**
   * What each kind of collective must carry in one step, from the shapes and levels alone, and how
   * many calls: per bucket of the overlapped exchange (`buckets`; none: one exchange of everything).
   */
  function expected(compressor, shapes, levels, minCompressionRate = 1, buckets = [], commDtype = 'fp32') {
    const groups = buckets.length ? buckets : [shapes.map((_, i) => i)];
    const v = commDtype === 'fp32' ? 4 : 2; // bytes per value sent; TopK's indices take 4
    const total = { floats: 0, bytes: 0, allReduce: { elements: W, calls: 1 }, allGather: { elements: 0, calls: 0 } };
    for (const group of groups) {
      const g = exchangeOf(compressor, group.map((i) => shapes[i]), group.map((i) => levels[i]), minCompressionRate);
      total.floats += g.dense + g.powerSgd + g.topK;
      total.bytes += v * (g.dense + g.powerSgd) + (g.topK / 2) * (4 + v);
      total.allReduce.elements += g.dense + g.powerSgd;
      total.allReduce.calls += (g.dense > 0 ? 1 : 0) + (g.powerSgd > 0 ? 2 : 0);
      total.allGather.elements += g.topK;
      total.allGather.calls += g.topK > 0 ? (v === 4 ? 1 : 2) : 0;
    }
    return total;
  }

  /** The floats of one exchange of these parameters, by the collective that carries them. */
  function exchangeOf(compressor, shapes, levels, minCompressionRate) {
    let dense = 0, powerSgd = 0, topK = 0;
    shapes.forEach((shape, i) => {
      const numel = shape.reduce((a, b) => a * b, 1);
      const level = levels[i];
      if (shape.length < 2 || compressor === 'none' || level === 0) {
        dense += numel;
        return;
      }
      if (compressor === 'topk') {
        topK += 2 * Math.max(1, Math.floor(level * numel)) * W;
        return;
      }
      const n = shape[0], m = numel / n, r = Math.min(n, m, level);
      if (minCompressionRate <= 0 || (n + m) * r * minCompressionRate < n * m) powerSgd += (n + m) * r;
      else dense += numel;
    });
    return { dense, powerSgd, topK };
  }

  it(`per step, floats sent + overhead = the floats the group carried, exactly, with ${W} processes (dense, PowerSGD, TopK, mixed levels)`, async function () {
    const spec = { timeoutMs: 60000, cases: [] };
    for (const c of cases) spec.cases.push(await levelsOf(c));
    const results = await runJob(ACCOUNTING_WORKER, W, spec, 240000);

    for (const result of results) {
      const label = `rank ${result.rank}`;
      result.cases.forEach((got, k) => {
        const c = spec.cases[k];
        const want = expected(c.model.compressor, got.shapes, got.levels, c.model.minCompressionRate, got.buckets, c.model.commDtype);
        if (c.model.bucketMb) expect(got.buckets.length, `${label} ${c.name}: buckets`).to.be.above(1);
        if (c.levels) expect(got.levels, `${label} ${c.name}: levels`).to.deep.equal(c.levels);
        if (c.name.includes('mixed')) expect(new Set(got.levels.filter((l) => l > 0)).size, `${c.name}: levels in use`).to.be.at.least(2);
        got.steps.forEach((step, s) => {
          const what = `${label} ${c.name} step ${s + 1}`;
          expect(step.floatsSent, `${what}: floats sent (docs/accounting.md §1)`).to.equal(want.floats);
          // The finite agreement (W floats) and rank 0's running statistics, broadcast before the step.
          expect(step.overheadFloats, `${what}: overhead`).to.equal(W + got.bufferFloats);
          expect(step.broadcastFloats, `${what}: of it, broadcast`).to.equal(got.bufferFloats);
          expect(step.carried.elements, `${what}: carried = floats sent + overhead`).to.equal(step.floatsSent + step.overheadFloats);
          expect(step.bytesSent, `${what}: bytes sent (docs/accounting.md §1)`).to.equal(want.bytes);
          expect(step.carried.bytes, `${what}: carried bytes = bytes sent + 4·overhead`).to.equal(step.bytesSent + 4 * step.overheadFloats);
          expect(step.carried.allReduce, `${what}: all-reduce`).to.deep.equal(want.allReduce);
          expect(step.carried.allGather, `${what}: all-gather`).to.deep.equal(want.allGather);
          expect(step.carried.broadcast, `${what}: broadcast`).to.deep.equal(got.bufferFloats ? { calls: 1, elements: got.bufferFloats } : { calls: 0, elements: 0 });
          expect(step.carried.barrier.calls, `${what}: barriers`).to.equal(0);
        });
      });
      // Collectives called from JS follow the same convention: all-reduce of 5; all-gathers of 3
      // per rank (3·W) and of 1 and 2 (3); broadcast of 7; a barrier carries nothing.
      expect(result.direct, `${label}: JS collectives`).to.deep.equal({
        allReduce: { calls: 1, elements: 5 },
        allGather: { calls: 2, elements: 3 * W + 3 },
        broadcast: { calls: 1, elements: 7 },
        barrier: { calls: 1 },
        elements: 5 + 3 * W + 3 + 7,
        bytes: 4 * (5 + 3 * W + 3 + 7),
      });
    }
  });
});

describe('data parallel: training without compression', function () {
  it('2 workers with batch B end with the weights of 1 worker with batch 2B (frozen batch norm)', async function () {
    const B = 4;
    const spec = {
      architecture: 'resnet18',
      classes: 10,
      imageSeed: 11,
      count: 64,
      steps: 4,
      seed: 5,
      // Small steps: a ReLU decision that rounding tips (the two runs add in different orders) moves
      // the gradient by up to 1e-3, which a step of 0.05 would carry above the tolerance below.
      learningRate: 0.005,
      momentum: 0.9,
      weightDecay: 5e-4,
      timeoutMs: 60000,
    };
    const started = Date.now();
    const [rank0, rank1] = await runJob(TRAIN_WORKER, 2, { ...spec, batchSize: B }, 120000);
    const parallelMs = Date.now() - started;
    const single = await train({ ...spec, batchSize: 2 * B });
    this.test.title += ` [2 processes ${parallelMs} ms, 1 process ${Date.now() - started - parallelMs} ms]`;

    expect(rank1.digest.sha256, 'the two ranks hold different weights after training').to.equal(rank0.digest.sha256);

    // The mean of the two halves' mean losses is the combined batch's mean loss.
    single.losses.forEach((l, s) => {
      expect(rank0.losses[s].samples + rank1.losses[s].samples).to.equal(l.samples);
      const mean = (rank0.losses[s].loss + rank1.losses[s].loss) / 2;
      expect(Math.abs(mean - l.loss), `step ${s}: mean loss ${mean} vs ${l.loss}`).to.be.at.most(1e-4 * Math.max(1, Math.abs(l.loss)));
    });

    for (const name of ['conv1.weight', 'linear.weight']) {
      const got = decode(rank0.digest.entries[name]);
      const want = decode(single.digest.entries[name]);
      expectClose(got, want, Math.max(maxAbs(want), 1e-3), 1e-4, name);
    }
    const names = Object.keys(single.digest.sums);
    expect(Object.keys(rank0.digest.sums)).to.deep.equal(names);
    for (const name of names) {
      const got = rank0.digest.sums[name];
      const want = single.digest.sums[name];
      expect(Math.abs(got.sum - want.sum), `sum of ${name}: ${got.sum} vs ${want.sum}`).to.be.at.most(1e-4 * Math.max(want.sumAbs, 1e-3));
    }
  });
});

describe('data parallel: a launched job that is stopped', function () {
  let cacheDir;
  const runDirs = [];

  before(function () {
    // The synthetic dataset is generated into this cache, by both workers at once on the first run.
    cacheDir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-cache-'));
  });

  after(function () {
    for (const dir of [cacheDir, ...runDirs]) fs.rmSync(dir, { recursive: true, force: true });
  });

  const common = ['--model', 'resnet18', '--synthetic-train', '256', '--synthetic-test', '64', '--batch-size', '16', '--eval-batch-size', '64', '--checkpoint-every', '1', '--quiet'];

  function launchJob(extra, token) {
    return start([CLI, 'train', ...common, '--workers', '2', ...extra], { ACCORDION_JOB_TOKEN: token, XDG_CACHE_HOME: cacheDir }, { detached: true });
  }

  function latestOf(dir) {
    const file = path.join(dir, 'checkpoints', 'latest');
    return fs.existsSync(file) ? fs.readFileSync(file, 'utf8').trim() : undefined;
  }

  /** Starts a 50-epoch job and waits until its first checkpoint is published. */
  async function jobAfterFirstCheckpoint() {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-run-'));
    runDirs.push(dir);
    const token = newToken();
    const launcher = launchJob(['--epochs', '50', '--out', dir], token);
    await waitFor('the first checkpoint', () => {
      if (launcher.done) throw new Error(`the job ended before its first checkpoint; stderr:\n${launcher.stderr}`);
      return latestOf(dir);
    }, 120000);
    return { dir, token, launcher };
  }

  function expectCheckpointLoads(dir, label) {
    const name = latestOf(dir);
    const epochs = Number(/^epoch-(\d+)$/.exec(name)?.[1]);
    for (const rank of [0, 1]) {
      const c = loadCheckpoint(dir, rank);
      expect(c.dir, `${label}: rank ${rank}`).to.equal(path.join(dir, 'checkpoints', name));
      expect(c.position.epochsCompleted, `${label}: rank ${rank}`).to.equal(epochs);
      expect(c.position.config.workers, `${label}: rank ${rank}`).to.equal(2);
      expect(c.model.some((t) => t.name === 'conv1.weight'), `${label}: rank ${rank}: model`).to.equal(true);
      expect(c.trainer.length, `${label}: rank ${rank}: trainer state`).to.be.above(0);
    }
    return epochs;
  }

  it('a worker killed with SIGKILL stops the job, leaves no process and a checkpoint to resume', async function () {
    const { dir, token, launcher } = await jobAfterFirstCheckpoint();
    const workers = await waitFor('both workers', () => {
      const ws = jobProcesses(token).filter((p) => p.ppid === launcher.child.pid && p.rank !== undefined);
      return ws.length === 2 ? ws : undefined;
    }, 10000);
    const victim = workers.find((w) => w.rank === 1);
    const killedAt = Date.now();
    process.kill(victim.pid, 'SIGKILL');

    const exit = await exitWithin(launcher, 30000);
    const stopMs = Date.now() - killedAt;
    expect(exit.timedOut, `the launcher still runs 30 s after rank 1 was killed; stderr:\n${launcher.stderr}`).to.not.equal(true);
    expect(exit.code, `launcher exit; stderr:\n${exit.stderr}`).to.equal(1);
    expect(exit.stderr).to.include('accordion launch: rank 1 was killed by SIGKILL');
    expect(exit.stderr).to.match(/accordion launch: job failed: .*rank 1.*SIGKILL/);
    expect(jobProcesses(token), 'processes of the job left running').to.deep.equal([]);

    const epochs = expectCheckpointLoads(dir, 'after the kill');
    expect(epochs).to.be.at.least(1);

    const resumeStarted = Date.now();
    const resumed = launchJob(['--resume', dir, '--epochs', String(epochs + 1)], newToken());
    const resumedExit = await exitWithin(resumed, 120000);
    expect(resumedExit.timedOut, `the resumed run did not finish; stderr:\n${resumed.stderr}`).to.not.equal(true);
    expect(resumedExit.code, `resumed run; stderr:\n${resumedExit.stderr}`).to.equal(0);
    expect(latestOf(dir)).to.equal(`epoch-${String(epochs + 1).padStart(4, '0')}`);
    expect(expectCheckpointLoads(dir, 'after resuming')).to.equal(epochs + 1);
    expect(loadCheckpoint(dir, 0).position.extra.history).to.have.length(epochs + 1);
    this.test.title += ` [stopped ${stopMs} ms after the kill, resumed epoch ${epochs + 1} in ${Date.now() - resumeStarted} ms]`;
  });

  it('a frozen worker (SIGSTOP) ends the job after the timeout, and the error names it, not the rank that waited', async function () {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-run-'));
    runDirs.push(dir);
    const token = newToken();
    const timeoutMs = 3000;
    const launcher = launchJob(['--epochs', '50', '--out', dir, '--timeout', String(timeoutMs)], token);
    await waitFor('the first checkpoint', () => {
      if (launcher.done) throw new Error(`the job ended before its first checkpoint; stderr:\n${launcher.stderr}`);
      return latestOf(dir);
    }, 120000);
    const workers = jobProcesses(token).filter((p) => p.ppid === launcher.child.pid && p.rank !== undefined);
    const victim = workers.find((w) => w.rank === 1);
    const frozenAt = Date.now();
    process.kill(victim.pid, 'SIGSTOP');
    try {
      const exit = await exitWithin(launcher, timeoutMs + 15000);
      const stopMs = Date.now() - frozenAt;
      expect(exit.timedOut, `the launcher still runs ${timeoutMs + 15000} ms after rank 1 froze; stderr:\n${launcher.stderr}`).to.not.equal(true);
      expect(exit.code, `launcher exit; stderr:\n${exit.stderr}`).to.equal(1);
      // Rank 0 waited in a collective; its error names rank 1 as the one that did not answer.
      expect(exit.stderr).to.match(/accordion: .* failed on rank 0 of 2: rank 1 does not answer \(no heartbeat/);
      expect(exit.stderr).to.match(/accordion launch: job failed: rank 0 exited with code 1 \(rank 1 is stopped and did not answer\)/);
      expect(stopMs, 'the job should end soon after the timeout').to.be.below(timeoutMs + 10000);
      expect(jobProcesses(token), 'processes of the job left running').to.deep.equal([]);
      this.test.title += ` [ended ${stopMs} ms after the freeze]`;
    } finally {
      try {
        process.kill(victim.pid, 'SIGKILL');
        process.kill(victim.pid, 'SIGCONT');
      } catch {
        // already gone
      }
    }
  });

  it('a checkpoint of 2 workers resumes with 3 and with 1: each memory the mean of the saved ones (the mass owed to the averaged gradient kept), the shared state rank 0\'s', async function () {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-regroup-'));
    runDirs.push(dir);
    // A small epoch (3 steps of 16 images per worker): the state, not the training, is under test.
    const topk = [...common, '--synthetic-train', '96', '--synthetic-test', '32', '--eval-batch-size', '32', '--compressor', 'topk', '--topk-ratio', '0.1', '--accordion', 'off'];
    const first = await exitWithin(start([CLI, 'train', ...topk, '--workers', '2', '--epochs', '1', '--out', path.join(dir, 'two')], { ACCORDION_JOB_TOKEN: newToken(), XDG_CACHE_HOME: cacheDir }), 240000);
    expect(first.code, first.stderr).to.equal(0);
    const saved = path.join(dir, 'two');
    const floats = (t) => new Float32Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.byteLength));
    const byName = (list) => new Map(list.map((t) => [t.name, t]));
    const old = [0, 1].map((r) => byName(loadCheckpoint(saved, r).trainer));
    const memoryNames = [...old[0].keys()].filter((n) => n.startsWith('compressor.memory.'));
    expect(memoryNames.length, 'TopK memories in the checkpoint').to.be.above(10);
    // The two ranks' memories differ (their data shards do), so a mean is not one of them.
    expect(floats(old[0].get(memoryNames[0])).some((v, i) => v !== floats(old[1].get(memoryNames[0]))[i])).to.equal(true);
    for (const W of [3, 1]) {
      const states = Array.from({ length: W }, (_, r) => loadCheckpoint(saved, r, W));
      for (const name of memoryNames) {
        const a = floats(old[0].get(name)), b = floats(old[1].get(name));
        const owedBefore = Float64Array.from(a, (v, i) => (v + b[i]) / 2);
        const owedAfter = new Float64Array(a.length);
        for (const st of states) floats(byName(st.trainer).get(name)).forEach((v, i) => (owedAfter[i] += v / W));
        const worst = owedAfter.reduce((m, v, i) => Math.max(m, Math.abs(v - owedBefore[i]) / (Math.abs(owedBefore[i]) + 1e-30)), 0);
        expect(worst, `${name} with ${W} workers: (1/W')·Σ e' against (1/2)·Σ e`).to.be.below(1e-6);
      }
      for (const [r, st] of states.entries()) {
        const mine = byName(st.trainer);
        // Momentum and levels are rank 0's; a saved rank keeps its random streams, a new one draws its own.
        for (const [name, t] of old[0]) {
          if (name.startsWith('optimizer.') || name === 'compressor.levels') expect(Buffer.from(mine.get(name).data).equals(Buffer.from(t.data)), `${W} workers, rank ${r}: ${name}`).to.equal(true);
          if (name.startsWith('rng.')) expect(mine.has(name), `${W} workers, rank ${r}: ${name}`).to.equal(r < 2);
        }
      }
    }
    // The resumed jobs run: 3 workers and 1, each into its own directory.
    for (const W of [3, 1]) {
      const out = path.join(dir, `resumed-${W}`);
      const exit = await exitWithin(start([CLI, 'train', ...topk, '--workers', String(W), '--epochs', '2', '--resume', saved, '--out', out], { ACCORDION_JOB_TOKEN: newToken(), XDG_CACHE_HOME: cacheDir }), 300000);
      expect(exit.code, exit.stderr).to.equal(0);
      expect(exit.stderr).to.include(`resuming a run of 2 workers with ${W}`);
      expect(loadCheckpoint(out, 0).position.config.workers).to.equal(W);
      expect(loadCheckpoint(out, 0).position.epochsCompleted).to.equal(2);
    }
  });

  it('Ctrl-C (SIGINT to the process group) stops every process with status 130 and keeps the checkpoint', async function () {
    const { dir, token, launcher } = await jobAfterFirstCheckpoint();
    const before = latestOf(dir);
    const interruptedAt = Date.now();
    // A terminal sends SIGINT to the whole foreground process group, not just the launcher.
    process.kill(-launcher.child.pid, 'SIGINT');

    const exit = await exitWithin(launcher, 30000);
    const stopMs = Date.now() - interruptedAt;
    expect(exit.timedOut, `the launcher still runs 30 s after SIGINT; stderr:\n${launcher.stderr}`).to.not.equal(true);
    expect(exit.code, `launcher exit; stderr:\n${exit.stderr}`).to.equal(130);
    expect(exit.stderr).to.include('accordion launch: job failed:');
    expect(jobProcesses(token), 'processes of the job left running').to.deep.equal([]);
    // A checkpoint may have been published between our read and the signal, never a partial one.
    expect(Number(latestOf(dir).slice(6))).to.be.at.least(Number(before.slice(6)));
    expectCheckpointLoads(dir, 'after Ctrl-C');
    this.test.title += ` [stopped ${stopMs} ms after SIGINT]`;
  });

  it('SIGTERM to the launcher (a scheduler stopping the job) stops every process with status 143 and keeps the checkpoint', async function () {
    const { dir, token, launcher } = await jobAfterFirstCheckpoint();
    process.kill(launcher.child.pid, 'SIGTERM');
    const exit = await exitWithin(launcher, 30000);
    expect(exit.timedOut, `the launcher still runs 30 s after SIGTERM; stderr:\n${launcher.stderr}`).to.not.equal(true);
    expect(exit.code, `launcher exit; stderr:\n${exit.stderr}`).to.equal(143);
    expect(exit.stderr).to.include('interrupted by SIGTERM');
    expect(jobProcesses(token), 'processes of the job left running').to.deep.equal([]);
    expectCheckpointLoads(dir, 'after SIGTERM');
  });
});

describe('data parallel: resuming a launched job', function () {
  let cacheDir;
  let runDir;

  before(function () {
    cacheDir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-cache-'));
    runDir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-resume-'));
  });

  after(function () {
    for (const dir of [cacheDir, runDir]) fs.rmSync(dir, { recursive: true, force: true });
  });

  // Batch norm in training mode: each step starts from rank 0's running statistics.
  const common = ['--model', 'resnet18', '--synthetic-train', '64', '--synthetic-test', '32', '--batch-size', '16', '--eval-batch-size', '16', '--compressor', 'powersgd', '--accordion-interval', '1', '--checkpoint-every', '1', '--workers', '2', '--quiet'];

  async function trainTo(dir, extra) {
    const job = start([CLI, 'train', ...common, ...extra], { ACCORDION_JOB_TOKEN: newToken(), XDG_CACHE_HOME: cacheDir });
    const exit = await exitWithin(job, 180000);
    expect(exit.timedOut, `the job did not finish; stderr:\n${job.stderr}`).to.not.equal(true);
    expect(exit.code, `job exit; stderr:\n${exit.stderr}`).to.equal(0);
    return JSON.parse(fs.readFileSync(path.join(dir, 'summary.json'), 'utf8'));
  }

  it('2 workers stopped after epoch 1 and resumed give the metrics of the uninterrupted run, and every rank holds rank 0\'s batch-norm statistics', async function () {
    const straightDir = path.join(runDir, 'straight');
    const splitDir = path.join(runDir, 'split');
    const straight = await trainTo(straightDir, ['--epochs', '2', '--out', straightDir]);
    await trainTo(splitDir, ['--epochs', '1', '--out', splitDir]);
    // Before the checkpoint every rank took rank 0's running statistics (PyTorch DDP's semantics).
    const epoch1 = path.join(splitDir, 'checkpoints', 'epoch-0001');
    const rank0 = loadCheckpoint(epoch1, 0);
    const rank1 = loadCheckpoint(epoch1, 1);
    for (const name of ['bn1.running_mean', 'layer4.1.bn2.running_var', 'conv1.weight'])
      expect(Buffer.from(rank0.model.find((t) => t.name === name).data).equals(Buffer.from(rank1.model.find((t) => t.name === name).data)), `rank 1's ${name}`).to.equal(true);
    const resumed = await trainTo(splitDir, ['--epochs', '2', '--resume', splitDir]);

    const fields = ['trainLoss', 'trainAccuracy', 'testLoss', 'testAccuracy', 'samples', 'floatsSent', 'floatsSentTotal', 'overheadFloats', 'levels', 'norms', 'lr'];
    const pick = (summary) => summary.epochs.map((e) => Object.fromEntries(fields.map((f) => [f, e[f]])));
    expect(pick(resumed)).to.deep.equal(pick(straight));
    // 64 images over 2 workers at batch 16: 2 steps an epoch, each agreeing on finiteness with 2
    // floats after rank 0's 9,600 running statistics were broadcast.
    expect(straight.epochs.map((e) => e.overheadFloats)).to.deep.equal([2 * 9602, 2 * 9602]);
    // Rank 0's statistics broadcast before each step and once more before evaluation.
    expect(straight.epochs.map((e) => e.broadcastFloats)).to.deep.equal([3 * 9600, 3 * 9600]);
    // Every rank's final state, buffers included, is the uninterrupted run's.
    for (const rank of [0, 1]) {
      const a = loadCheckpoint(straightDir, rank);
      const b = loadCheckpoint(splitDir, rank);
      for (const list of ['model', 'trainer']) {
        const want = new Map(a[list].map((t) => [t.name, Buffer.from(t.data)]));
        const got = new Map(b[list].map((t) => [t.name, Buffer.from(t.data)]));
        expect([...got.keys()].sort(), `rank ${rank} ${list}`).to.deep.equal([...want.keys()].sort());
        for (const [name, bytes] of want) expect(got.get(name).equals(bytes), `rank ${rank}: ${name}`).to.equal(true);
      }
    }
  });
});
