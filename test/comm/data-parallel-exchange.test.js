// Data parallelism between real worker processes: the gradient exchange of every compressor against the
// single-process simulation of the same workers, the floats accounting against what the collectives
// carried, and dense data-parallel training against one worker with the combined batch.
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { freePort } from '../helpers/ports.js';
import { ReducerProbe } from '../../lib/testing.js';
import { Model } from '../../lib/index.js';
import { decode, gradientFor, numel } from '../helpers/reducer-worker.js';
import { train } from '../helpers/train-worker.js';
import { exitWithin } from '../helpers/processes.js';
import { killJobsAfterEach, newToken, start } from '../helpers/job-processes.js';

const REDUCER_WORKER = fileURLToPath(new URL('../helpers/reducer-worker.js', import.meta.url));
const TRAIN_WORKER = fileURLToPath(new URL('../helpers/train-worker.js', import.meta.url));
const ACCOUNTING_WORKER = fileURLToPath(new URL('../helpers/accounting-worker.js', import.meta.url));

// ---------------------------------------------------------------------------------------------
// Whatever a test starts is killed after it, even when the test failed halfway.

killJobsAfterEach();

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
