// The reducer's levels (invalid ones, changes, level 0 sent dense, the costs of candidate levels) and its
// floats accounting (docs/accounting.md §1-2) through ReducerProbe, on the CPU and on a GPU (pending without one).
import { expect } from 'chai';
import { Model } from '../../lib/index.js';
import { DEVICES } from '../helpers/devices.js';
import { makeRng } from '../helpers/gradcheck.js';
import { expectClose, expectEqualArrays, expectThrowsCode, frobenius, maxAbs, numelOf, probe, probesOn, randn } from '../helpers/compression-checks.js';

for (const target of DEVICES) {
  describe(`gradient compression (ReducerProbe) on ${target}`, function () {
    probesOn(target);

    describe('floats accounting (docs/accounting.md §1, §2)', function () {
      let shapes;
      before(async function () {
        const model = await Model.create({ architecture: 'resnet18' });
        try {
          shapes = model.parameters().map((p) => p.shape);
        } finally {
          await model.dispose();
        }
        expect(shapes).to.have.length(62);
        expect(shapes.reduce((s, sh) => s + numelOf(sh), 0)).to.equal(11173962);
      });

      it('ResNet-18 CIFAR-10 per iteration: PowerSGD rank 1/2/4, TopK 0.99/0.10 at W = 4, dense', function () {
        const p = probe(shapes, { compressor: 'powersgd', level: 1 });
        expect(p.floatsPerStep(), 'rank 1').to.equal(45935);
        for (const [rank, floats] of [[2, 82260], [4, 154910]]) {
          shapes.forEach((s, i) => s.length > 1 && p.setLevel(i, rank));
          expect(p.floatsPerStep(), `rank ${rank}`).to.equal(floats);
        }
        // Sized like ResNet-18 across 4 workers: only the accounting is asked of it, no step.
        const t = probe(shapes, { compressor: 'topk', level: 0.99, workers: 4 });
        expect(t.floatsPerStep(), 'TopK 0.99').to.equal(88431202);
        shapes.forEach((s, i) => s.length > 1 && t.setLevel(i, 0.1));
        expect(t.floatsPerStep(), 'TopK 0.10').to.equal(8941010);
        expect(probe(shapes, { compressor: 'none' }).floatsPerStep(), 'dense').to.equal(11173962);
      });

      it('reports as floatsSent what floatsPerStep predicts, for every compressor', function () {
        const shapes = [[6, 3, 3, 3], [10, 8], [6], [5, 1]];
        const rng = makeRng(8);
        const W = 3;
        for (const [compressor, level, expected] of [
          // (6+27)·2 + (10+8)·2 + 6 + (5+1)·1
          ['powersgd', 2, 66 + 36 + 6 + 6],
          // 2·⌊0.3·numel⌋·W per matrix + 6: (2·48 + 2·24 + 2·1)·3 + 6
          ['topk', 0.3, (96 + 48 + 2) * 3 + 6],
          ['none', undefined, 162 + 80 + 6 + 5],
        ]) {
          const p = probe(shapes, { compressor, level, workers: W, minCompressionRate: 0 });
          expect(p.floatsPerStep(), compressor).to.equal(expected);
          const grads = Array.from({ length: W }, () => shapes.map((s) => randn(rng, numelOf(s))));
          expect(p.step(grads).floatsSent, compressor).to.equal(expected);
        }
      });
    });

    describe('levels (docs/algorithms.md §4.6)', function () {
      it('rejects invalid levels with ERR_INVALID_ARGUMENT, and levels of 1-D parameters', function () {
        const p = probe([[4, 3], [4]], { compressor: 'powersgd', level: 1 });
        // -1 is a level (dense in bf16, test/compress/comm-dtype.test.js); no other negative value is.
        for (const bad of [-2, -0.5, 1.5, NaN, Infinity]) expectThrowsCode(() => p.setLevel(0, bad), 'ERR_INVALID_ARGUMENT');
        expectThrowsCode(() => p.setLevel(1, 1), 'ERR_INVALID_ARGUMENT');
        expect(p.level(0)).to.equal(1);
        const t = probe([[4, 3], [4]], { compressor: 'topk', level: 0.5 });
        for (const bad of [-0.1, 1.5, NaN]) expectThrowsCode(() => t.setLevel(0, bad), 'ERR_INVALID_ARGUMENT');
        expectThrowsCode(() => t.setLevel(1, 0.5), 'ERR_INVALID_ARGUMENT');
        expect(t.level(0)).to.equal(0.5);
        expectThrowsCode(() => probe([[4, 3]], { compressor: 'powersgd', level: 0 }), 'ERR_INVALID_ARGUMENT');
        expectThrowsCode(() => probe([[4, 3]], { compressor: 'powersgd', level: -1 }), 'ERR_INVALID_ARGUMENT'); // a start is compressed
        expectThrowsCode(() => probe([[4, 3]], { compressor: 'topk', level: 2 }), 'ERR_INVALID_ARGUMENT');
      });

      it('keeps the memory on a level change and re-draws Q from the shared seed; the same level is a no-op', function () {
        const shapes = [[8, 5], [5]];
        const W = 2;
        const p = probe(shapes, { compressor: 'powersgd', level: 1, workers: W, seed: 9, minCompressionRate: 0 });
        const initialQ = p.q(0, 0);
        expectEqualArrays(p.q(1, 0), initialQ, 'initial Q identical across workers');
        const rng = makeRng(12);
        const grads = () => Array.from({ length: W }, () => shapes.map((s) => randn(rng, numelOf(s))));
        p.step(grads());
        const warmQ = p.q(0, 0);
        const memories = [p.memory(0, 0), p.memory(1, 0)];
        expect(maxAbs(memories[0])).to.be.above(0);

        p.setLevel(0, 1);
        expectEqualArrays(p.q(0, 0), warmQ, 'same level keeps the warm-started Q');

        p.setLevel(0, 2);
        expect(p.level(0)).to.equal(2);
        expect(p.q(0, 0)).to.have.length(5 * 2);
        for (let w = 0; w < W; w++) expectEqualArrays(p.memory(w, 0), memories[w], `memory of worker ${w} after 1 → 2`);
        expectEqualArrays(p.q(1, 0), p.q(0, 0), 'rank-2 Q identical across workers');

        p.setLevel(0, 1);
        for (let w = 0; w < W; w++) {
          expectEqualArrays(p.q(w, 0), initialQ, `Q of worker ${w} after 1 → 2 → 1`);
          expectEqualArrays(p.memory(w, 0), memories[w], `memory of worker ${w} after 1 → 2 → 1`);
        }

        const t = probe(shapes, { compressor: 'topk', level: 0.2, workers: W });
        t.step(grads());
        const kept = [t.memory(0, 0), t.memory(1, 0)];
        t.setLevel(0, 0.6);
        expect(t.level(0)).to.equal(0.6);
        for (let w = 0; w < W; w++) expectEqualArrays(t.memory(w, 0), kept[w], `TopK memory of worker ${w}`);
      });
    });

    describe('level 0: a matrix sent dense', function () {
      it('sends the gradient plus the error memory once, then plain gradients, counting every entry', function () {
        for (const [compressor, level] of [['powersgd', 1], ['topk', 0.25]]) {
          const shapes = [[6, 4], [4]];
          const p = probe(shapes, { compressor, level, minCompressionRate: 0 });
          const rng = makeRng(41);
          const g1 = shapes.map((s) => randn(rng, numelOf(s)));
          p.step([g1]);
          const memory = p.memory(0, 0);
          expect(maxAbs(memory), `${compressor}: a compressed step leaves an error`).to.be.above(0);
          p.setLevel(0, 0);
          expect(p.level(0)).to.equal(0);
          expect(p.isCompressed(0)).to.equal(false);
          expect(p.floatsPerStep()).to.equal(24 + 4);
          const g2 = shapes.map((s) => randn(rng, numelOf(s)));
          const r = p.step([g2]);
          expect(r.floatsSent).to.equal(24 + 4);
          expectClose(r.outputs[0][0], Array.from(g2[0], (v, k) => v + memory[k]), 1e-6, `${compressor}: g + e`);
          expect(maxAbs(p.memory(0, 0)), 'memory spent').to.equal(0);
          const g3 = shapes.map((s) => randn(rng, numelOf(s)));
          expectEqualArrays(p.step([g3]).outputs[0][0], g3[0], `${compressor}: then the gradient itself`);
          p.setLevel(0, level); // and back: compressed again from a zero memory
          expect(p.isCompressed(0)).to.equal(true);
        }
      });
    });

    describe('level costs (automatic levels)', function () {
      // The error of a level must be what the reducer itself makes of the tensor at that level.
      it("gives each candidate's relative error as a fresh reducer's compression of the epoch sum, its floats, and 0 for dense", function () {
        const shapes = [[12, 5], [8, 3, 3, 3], [8], [2, 40]];
        const rng = makeRng(53);
        const gradients = [0, 1].map(() => shapes.map((s) => randn(rng, numelOf(s))));
        const sum = shapes.map((_, i) => gradients[0][i].map((v, k) => v + gradients[1][i][k]));
        for (const [compressor, candidates] of [['powersgd', [1, 2, 4, 8, 0]], ['topk', [0.05, 0.2, 0.5, 0]]]) {
          const p = probe(shapes, { compressor, level: candidates[0], seed: 5, accumulateNorms: true });
          for (const g of gradients) p.step([g]);
          const costs = p.levelCosts(0, candidates);
          expect(costs[2], '1-D parameter').to.deep.equal([]);
          for (const i of [0, 1, 3]) {
            expect(costs[i].map((c) => c.level)).to.deep.equal(candidates);
            for (const c of costs[i]) {
              const fresh = probe(shapes, { compressor, level: candidates[0], seed: 5 });
              if (c.level !== candidates[0]) fresh.setLevel(i, c.level);
              const grads = shapes.map((s, j) => (j === i ? sum[i] : new Float32Array(numelOf(s))));
              const r = fresh.step([grads]);
              const residual = sum[i].map((v, k) => v - r.outputs[0][i][k]);
              const what = `${compressor} parameter ${i} level ${c.level}`;
              expect(c.error, what).to.be.closeTo(frobenius(residual) / frobenius(sum[i]), 1e-5);
              // PowerSGD sends (rows + cols)·r, r clipped to the matrix, unless that is not below rows·cols (then dense).
              const [rows, cols] = [shapes[i][0], numelOf(shapes[i]) / shapes[i][0]];
              const rank = Math.min(c.level, rows, cols);
              const floats =
                c.level === 0 ? rows * cols : compressor === 'topk' ? 2 * Math.max(1, Math.floor(c.level * rows * cols)) : (rows + cols) * rank < rows * cols ? (rows + cols) * rank : rows * cols;
              expect(c.floats, what).to.equal(floats);
              expect(c.seconds, what).to.be.at.least(0);
            }
            expect(costs[i].at(-1).error, 'dense').to.equal(0);
          }
          // Nothing of the reducer's state moved: the sums are still there.
          expect(p.norms(0)[0]).to.be.closeTo(frobenius(sum[0]), 1e-4);
        }
      });
    });
  });
}
