// The exchange overlapped with backward in buckets (compress/bucket_exchange.h) against the exchange
// after backward: in-process workers (the bucketed reducer against reduce() at once, a non-finite
// gradient in a late bucket) and real processes training ResNet-18 at half width (2 and 4 workers, dense,
// PowerSGD and TopK with mixed levels, a worker killed in the middle of an exchange).
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { ReducerProbe } from '../../lib/testing.js';
import { readSafetensors } from '../../lib/engine/safetensors.js';
import { makeRng, randomNormal } from '../helpers/gradcheck.js';
import { freePort } from '../helpers/ports.js';
import { exitWithin, startNode, waitFor } from '../helpers/processes.js';

const WORKER = fileURLToPath(new URL('../helpers/overlap-worker.js', import.meta.url));

const numel = (shape) => shape.reduce((a, b) => a * b, 1);

describe('the exchange in buckets, overlapped with backward', function () {
  this.timeout(300000);

  describe('in-process workers: buckets against one exchange after backward', function () {
    // In reverse order, buckets closed at 160 bytes hold p5 + p4 + p3 + p2 (compressed, 1-D and a
    // matrix sent dense: 172 bytes) and p1 + p0 (1-D and compressed) last.
    const shapes = [[6, 5], [4], [5, 3], [3, 2, 2], [7], [3, 3]];
    const W = 3;
    const levelsOf = { powersgd: [2, 0, 1, 0, 0, 3], topk: [0.3, 0, 0.5, 0, 0, 0.2], none: null };

    function probes(compressor) {
      const options = { compressor, level: compressor === 'topk' ? 0.25 : 2, workers: W, accumulateNorms: true, minCompressionRate: 0 };
      const pair = [new ReducerProbe(shapes, options), new ReducerProbe(shapes, { ...options, bucketBytes: 160 })];
      const levels = levelsOf[compressor];
      if (levels) for (const p of pair) levels.forEach((level, i) => shapes[i].length > 1 && p.setLevel(i, level));
      return pair;
    }

    const gradients = (rng) => Array.from({ length: W }, () => shapes.map((s) => randomNormal(numel(s), rng)));

    for (const compressor of ['none', 'powersgd', 'topk']) {
      it(`${compressor}: outputs, floats, memories, Q and norms equal reduce() at once, step after step (W = ${W}, mixed levels)`, function () {
        const [whole, bucketed] = probes(compressor);
        const rng = makeRng(7);
        for (let step = 0; step < 4; step++) {
          const g = gradients(rng);
          const a = whole.step(g);
          const b = bucketed.step(g);
          expect(b.floatsSent, `step ${step}: floats sent`).to.equal(a.floatsSent);
          for (let w = 0; w < W; w++)
            shapes.forEach((_, i) => {
              expect(Array.from(b.outputs[w][i]), `step ${step}: worker ${w}, output p${i}`).to.deep.equal(Array.from(a.outputs[w][i]));
              expect(bucketed.memory(w, i), `step ${step}: worker ${w}, memory p${i}`).to.deep.equal(whole.memory(w, i));
              expect(bucketed.q(w, i), `step ${step}: worker ${w}, Q p${i}`).to.deep.equal(whole.q(w, i));
            });
        }
        for (let w = 0; w < W; w++) expect(Array.from(bucketed.norms(w))).to.deep.equal(Array.from(whole.norms(w)));
      });
    }

    it('buckets close once they hold the cap, the first at 1 MiB, as PyTorch DDP\'s (hand-computed layouts)', function () {
      const [, bucketed] = probes('none');
      expect(bucketed.buckets()).to.deep.equal([[5, 4, 3, 2], [1, 0]]);
      // 400, 1200, 1000, 800, 400 and 200 kB in buckets of 2 MiB: the first closes past 1 MiB
      // (200 + 400 + 800 kB), the second past 2 MiB (1000 + 1200 kB).
      const large = [[100000], [300000], [250000], [200000], [100000], [50000]];
      expect(new ReducerProbe(large, { compressor: 'none', bucketBytes: 2 * 2 ** 20 }).buckets()).to.deep.equal([[5, 4, 3], [2, 1], [0]]);
      expect(new ReducerProbe(large, { compressor: 'none', bucketBytes: 300000 }).buckets()).to.deep.equal([[5, 4], [3], [2], [1], [0]]);
      expect(new ReducerProbe(large, { compressor: 'none' }).buckets()).to.deep.equal([]);
    });

    it('a NaN in the last bucket stops every worker, naming it, after the earlier buckets changed their state: that state is restored', function () {
      for (const compressor of ['powersgd', 'topk']) {
        const [twin, bucketed] = probes(compressor);
        const rng = makeRng(11);
        const first = gradients(rng);
        twin.step(first);
        bucketed.step(first);
        const bad = gradients(rng);
        bad[2][0][4] = NaN; // p0 travels last, after p5…p1 have changed memories, Q and sums
        let caught;
        try {
          bucketed.step(bad);
        } catch (err) {
          caught = err;
        }
        expect(caught?.code, `${compressor}: ${caught?.message}`).to.equal('ERR_NUMERICAL');
        expect(caught.message).to.include("'p0'").and.include('rank 2');
        for (let w = 0; w < W; w++)
          shapes.forEach((_, i) => {
            expect(bucketed.memory(w, i), `${compressor}: worker ${w}, memory p${i}`).to.deep.equal(twin.memory(w, i));
            expect(bucketed.q(w, i), `${compressor}: worker ${w}, Q p${i}`).to.deep.equal(twin.q(w, i));
          });
        // The refused step left no trace: the next one equals the twin's, which never saw it.
        const next = gradients(rng);
        const a = twin.step(next);
        const b = bucketed.step(next);
        for (let w = 0; w < W; w++) shapes.forEach((_, i) => expect(Array.from(b.outputs[w][i])).to.deep.equal(Array.from(a.outputs[w][i])));
        for (let w = 0; w < W; w++) expect(Array.from(bucketed.norms(w))).to.deep.equal(Array.from(twin.norms(w)));
      }
    });
  });

  describe('real processes training ResNet-18 (half width)', function () {
    const dirs = [];
    after(() => dirs.forEach((d) => fs.rmSync(d, { recursive: true, force: true })));
    const live = new Set();
    afterEach(async () => {
      for (const p of live) p.child.kill('SIGKILL');
      await Promise.all([...live].map((p) => exitWithin(p, 5000)));
    });

    const startWorker = (rank, worldSize, port, spec) =>
      startNode(live, [WORKER, JSON.stringify(spec)], { RANK: String(rank), WORLD_SIZE: String(worldSize), MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port) });

    /** Every rank's report and final state (weights, momentum, memories, Q) of one job. */
    async function job(worldSize, spec) {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-overlap-'));
      dirs.push(dir);
      const port = await freePort();
      const full = { seed: 3, count: 16 * worldSize, batchSize: 4, steps: 3, ...spec, out: path.join(dir, 'state') };
      const workers = Array.from({ length: worldSize }, (_, rank) => startWorker(rank, worldSize, port, full));
      const exits = await Promise.all(workers.map((w) => exitWithin(w, 120000)));
      return exits.map((e, rank) => {
        expect(e.code, `rank ${rank}: ${e.stderr}`).to.equal(0);
        return { ...JSON.parse(e.stdout.trim().split('\n').at(-1)), state: readSafetensors(`${full.out}.rank${rank}.safetensors`).tensors };
      });
    }

    /** The largest difference between two states, relative to the largest magnitude of each tensor. */
    function worstDifference(a, b) {
      let worst = 0;
      for (const [name, t] of a) {
        const u = b.get(name);
        expect(u, name).to.not.equal(undefined);
        if (t.dtype !== 'F32') {
          expect(Buffer.from(u.data).equals(Buffer.from(t.data)), name).to.equal(true);
          continue;
        }
        const x = new Float32Array(t.data.slice().buffer), y = new Float32Array(u.data.slice().buffer);
        let d = 0, m = 0;
        for (let i = 0; i < x.length; i++) {
          d = Math.max(d, Math.abs(x[i] - y[i]));
          m = Math.max(m, Math.abs(x[i]));
        }
        if (d > 0) worst = Math.max(worst, d / m);
      }
      return worst;
    }

    const configs = [
      { compressor: 'none' },
      { compressor: 'powersgd', level: 2, mixedLevels: true },
      { compressor: 'topk', level: 0.1, mixedLevels: true },
    ];
    // The same compute threads on both sides (one), so only the exchange differs: with buckets the
    // communication thread takes one of two threads.
    const afterBackward = { bucketMb: 0, threads: 1 };
    const overlapped = { bucketMb: 0.5, threads: 2 };

    for (const config of configs)
      it(`2 processes, ${config.compressor}${config.mixedLevels ? ' with mixed levels' : ''}: 3 steps end bit for bit alike, with the same floats accounting`, async function () {
        const [a, b] = [await job(2, { ...config, ...afterBackward }), await job(2, { ...config, ...overlapped })];
        for (let rank = 0; rank < 2; rank++) {
          expect(b[rank].plan.communicationThreads).to.equal(1);
          expect(b[rank].plan.computeThreads).to.equal(1);
          expect(b[rank].plan.buckets.length).to.be.above(4);
          expect(a[rank].plan.buckets).to.deep.equal([]);
          // Batch-scheduled: the transport's socket loop, and with buckets the communication thread;
          // the threads that started them are back to their own policy.
          expect(a[rank].batchThreads.length, `rank ${rank}: batch threads after backward`).to.equal(1);
          expect(b[rank].batchThreads.length, `rank ${rank}: batch threads overlapped`).to.equal(2);
          expect(b[rank].steps, `rank ${rank}: losses and floats per step`).to.deep.equal(a[rank].steps);
          expect(worstDifference(a[rank].state, b[rank].state), `rank ${rank}: state`).to.equal(0);
        }
        if (config.mixedLevels) {
          // Buckets that mix compressed, dense-by-level and 1-D parameters.
          const { buckets } = b[0].plan;
          const levels = b[0].levels;
          expect(buckets.some((bucket) => bucket.some((i) => levels[i] > 0) && bucket.some((i) => levels[i] === 0)), 'a bucket with compressed and dense parameters').to.equal(true);
        }
      });

    // The language model finishes its gradients layer by layer as well: the decoder's bias, each LSTM
    // layer from the top, the tied embedding last.
    for (const config of [{ compressor: 'none' }, { compressor: 'powersgd', level: 2, mixedLevels: true }])
      it(`2 processes, the LSTM with ${config.compressor}${config.mixedLevels ? ' with mixed levels' : ''}: 3 steps end bit for bit alike, with the same floats accounting`, async function () {
        const lstm = { ...config, model: 'lstm' };
        const [a, b] = [await job(2, { ...lstm, ...afterBackward }), await job(2, { ...lstm, ...overlapped, bucketMb: 0.01 })];
        for (let rank = 0; rank < 2; rank++) {
          expect(b[rank].plan.buckets.length, `rank ${rank}: buckets`).to.be.above(2);
          expect(b[rank].steps, `rank ${rank}: losses and floats per step`).to.deep.equal(a[rank].steps);
          expect(worstDifference(a[rank].state, b[rank].state), `rank ${rank}: state`).to.equal(0);
        }
      });

    it('4 processes, every compressor with mixed levels: one step agrees within float32 summation order (≤ 1e-6 relative), floats alike', async function () {
      for (const config of configs) {
        const one = { ...config, steps: 1 };
        const [a, b] = [await job(4, { ...one, ...afterBackward }), await job(4, { ...one, ...overlapped })];
        for (let rank = 0; rank < 4; rank++) {
          expect(b[rank].steps.map((s) => [s.floatsSent, s.overheadFloats]), `${config.compressor} rank ${rank}: floats`).to.deep.equal(a[rank].steps.map((s) => [s.floatsSent, s.overheadFloats]));
          expect(b[rank].steps[0].loss).to.equal(a[rank].steps[0].loss);
          expect(worstDifference(a[rank].state, b[rank].state), `${config.compressor} rank ${rank}: state`).to.be.at.most(1e-6);
        }
      }
    });

    it('a worker killed in the middle of an exchange ends the other with an error, not a hang', async function () {
      const port = await freePort();
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-overlap-'));
      dirs.push(dir);
      // Tiny buckets: some 60 exchanges per step, so that the kill lands inside one.
      const spec = { compressor: 'powersgd', level: 2, seed: 3, count: 400, batchSize: 4, steps: 50, bucketMb: 0.05, threads: 2, announce: true, out: path.join(dir, 'state') };
      const workers = [0, 1].map((rank) => startWorker(rank, 2, port, spec));
      await waitFor('rank 1 at its third step', () => workers[1].stdout.includes('step 2') || undefined, 60000);
      await new Promise((resolve) => setTimeout(resolve, 400));
      workers[1].child.kill('SIGKILL');
      const exit = await exitWithin(workers[0], 60000);
      expect(exit.timedOut, 'rank 0 still runs 60 s after rank 1 was killed').to.not.equal(true);
      expect(exit.code, exit.stderr).to.equal(1);
      expect(exit.stderr).to.match(/^error: /m);
      this.test.title += ` [rank 0: ${exit.stderr.split('\n')[0].slice(0, 160)}]`;
    });
  });
});
