// Error feedback (PowerSGD and TopK) and TopK's selection through ReducerProbe, against docs/oracles.md
// §2.3-2.4, on the CPU and on a GPU (pending without one).
import { expect } from 'chai';
import { DEVICES } from '../helpers/devices.js';
import { makeRng } from '../helpers/gradcheck.js';
import { expectClose, expectEqualArrays, f32, maxAbs, numelOf, probe, probesOn, randn, step1 } from '../helpers/compression-checks.js';

for (const target of DEVICES) {
  describe(`gradient compression (ReducerProbe) on ${target}`, function () {
    probesOn(target);

    describe('error feedback (docs/oracles.md §2.3)', function () {
      it('TopK s = 1 on g = [1, 0.5, 0.25, −0.75]: indices 0,3,0,1,3,0,2,3 and e₈ = [2, 2, 0.25, 0]', function () {
        const p = probe([[1, 4]], { compressor: 'topk', level: 0.25 });
        const g = f32([1, 0.5, 0.25, -0.75]);
        const sent = [];
        const total = new Float64Array(4);
        for (let t = 0; t < 8; t++) {
          const out = step1(p, g);
          const nonzero = [...out.keys()].filter((k) => out[k] !== 0);
          expect(nonzero, `step ${t}`).to.have.length(1);
          sent.push(nonzero[0]);
          out.forEach((v, k) => (total[k] += v));
        }
        expect(sent).to.deep.equal([0, 3, 0, 1, 3, 0, 2, 3]);
        const e = p.memory(0, 0);
        expectEqualArrays(e, [2, 2, 0.25, 0], 'e₈');
        expectEqualArrays(total.map((v, k) => v + e[k]), [8, 4, 2, -6], 'Σ out + e₈ = 8g');
      });

      it('telescopes over 50 random steps: Σ out + mean e = Σ mean g (W = 1 and 2, PowerSGD and TopK)', function () {
        const shapes = [[16, 8, 3, 3], [10, 20], [7], [33, 5]];
        for (const compressor of ['powersgd', 'topk']) {
          for (const W of [1, 2]) {
            const rng = makeRng(W * 31 + compressor.length);
            const level = compressor === 'powersgd' ? 2 : 0.05;
            const p = probe(shapes, { compressor, level, workers: W, minCompressionRate: 0 });
            const sumOut = shapes.map((s) => new Float64Array(numelOf(s)));
            const sumG = shapes.map((s) => new Float64Array(numelOf(s)));
            for (let t = 0; t < 50; t++) {
              const grads = Array.from({ length: W }, () => shapes.map((s) => randn(rng, numelOf(s))));
              const { outputs } = p.step(grads);
              shapes.forEach((_, i) => {
                outputs[0][i].forEach((v, k) => (sumOut[i][k] += v));
                for (let w = 0; w < W; w++) grads[w][i].forEach((v, k) => (sumG[i][k] += v / W));
              });
            }
            shapes.forEach((_, i) => {
              const lhs = Float64Array.from(sumOut[i]);
              for (let w = 0; w < W; w++) {
                const e = p.memory(w, i);
                if (e) e.forEach((v, k) => (lhs[k] += v / W));
              }
              // float32 rounding accumulates over the 50 steps; Σg has magnitude ~√50.
              expectClose(lhs, sumG[i], 2e-4 * (1 + maxAbs(sumG[i])), `${compressor} W=${W} p${i}`);
            });
          }
        }
      });
    });

    describe('TopK (docs/oracles.md §2.4)', function () {
      it('keeps the two largest |x| of [0.1, −3, 2, −0.5, 4] and remembers the rest', function () {
        const p = probe([[1, 5]], { compressor: 'topk', level: 0.4 });
        const r = p.step([[f32([0.1, -3, 2, -0.5, 4])]]);
        expectEqualArrays(r.outputs[0][0], f32([0, -3, 0, 0, 4]), 'out');
        expectEqualArrays(p.memory(0, 0), f32([0.1, 0, 2, -0.5, 0]), 'memory');
        expect(r.floatsSent).to.equal(4);
      });

      function checkSelection(values, K, what) {
        const n = values.length;
        const s = Math.max(1, Math.floor(K * n));
        const p = probe([[1, n]], { compressor: 'topk', level: K });
        const r = p.step([[values]]);
        const out = r.outputs[0][0];
        const e = p.memory(0, 0);
        expect(r.floatsSent, what).to.equal(2 * s);
        let kept = 0;
        let minKept = Infinity;
        let maxDropped = 0;
        let split = -1; // first entry neither sent whole nor kept whole in memory
        for (let k = 0; k < n; k++) {
          if (out[k] !== 0) {
            kept++;
            if (out[k] !== values[k] || e[k] !== 0) split = k;
            minKept = Math.min(minKept, Math.abs(values[k]));
          } else {
            if (e[k] !== values[k]) split = k;
            maxDropped = Math.max(maxDropped, Math.abs(values[k]));
          }
          if (split >= 0) break;
        }
        expect(split, `${what}: entry ${split} has x=${values[split]} out=${out[split]} e=${e[split]}`).to.equal(-1);
        expect(kept, `${what}: kept entries`).to.equal(s);
        expect(minKept, `${what}: kept ≥ dropped`).to.be.at.least(maxDropped);
        return out;
      }

      function distinctValues(rng, n, magnitude) {
        // A random permutation of distinct magnitudes with random signs, so that no two |x| tie.
        const order = Array.from({ length: n }, (_, i) => i);
        for (let i = n - 1; i > 0; i--) {
          const j = rng.int(i + 1);
          [order[i], order[j]] = [order[j], order[i]];
        }
        return Float32Array.from(order, (o) => magnitude(o) * (rng.next() < 0.5 ? -1 : 1));
      }

      it('keeps exactly s = max(1, ⌊K·numel⌋) entries of largest |a| on 1,000 and 100,000 elements', function () {
        const rng = makeRng(3);
        for (const n of [1000, 100000]) {
          const spread = distinctValues(rng, n, (o) => (o + 1) * 0.001);
          // All magnitudes in [1, 1.1): one radix bucket, so the exact in-bucket selection decides.
          const narrow = distinctValues(rng, n, (o) => 1 + o * 2 ** -20);
          for (const K of [0.001, 0.01, 0.1, 0.37, 0.5, 0.99]) {
            checkSelection(spread, K, `spread n=${n} K=${K}`);
            checkSelection(narrow, K, `narrow n=${n} K=${K}`);
          }
        }
      });

      it('breaks ties towards the lowest indices', function () {
        for (const n of [1000, 100000]) {
          const equal = Float32Array.from({ length: n }, (_, k) => (k % 3 === 0 ? -1.5 : 1.5));
          const out = checkSelection(equal, 0.3, `all equal n=${n}`);
          const s = Math.floor(0.3 * n);
          const wrong = out.findIndex((v, k) => (v !== 0) !== k < s);
          expect(wrong, `index ${wrong} kept=${out[wrong] !== 0}`).to.equal(-1);

          // Two clear winners far apart, then ties: the lowest-indexed ties fill the rest.
          const mixed = new Float32Array(n).fill(1);
          mixed[n - 1] = 5;
          mixed[7] = -5;
          const out2 = checkSelection(mixed, 10 / n, `winners + ties n=${n}`);
          const kept = [...out2.keys()].filter((k) => out2[k] !== 0);
          expect(kept).to.deep.equal([0, 1, 2, 3, 4, 5, 6, 7, 8, n - 1]);
        }
      });

      it('keeps at least one entry (K = 0.02 on 49 elements) and all of them at K = 1', function () {
        const rng = makeRng(4);
        const x = randn(rng, 49);
        const p = probe([[7, 7]], { compressor: 'topk', level: 0.02 });
        expect(p.floatsPerStep()).to.equal(2);
        const out = step1(p, x);
        const kept = [...out.keys()].filter((k) => out[k] !== 0);
        expect(kept).to.have.length(1);
        let argmax = 0;
        x.forEach((v, k) => Math.abs(v) > Math.abs(x[argmax]) && (argmax = k));
        expect(kept[0]).to.equal(argmax);

        const all = probe([[7, 7]], { compressor: 'topk', level: 1 });
        expectEqualArrays(step1(all, x), x, 'K = 1 sends everything');
        expectEqualArrays(all.memory(0, 0), new Float32Array(49), 'K = 1 leaves no error');
      });

      it('averages the workers’ sparse vectors, adding overlapping indices (W = 2)', function () {
        const p = probe([[2, 4]], { compressor: 'topk', level: 0.25, workers: 2 });
        const g0 = f32([5, -4, 0, 0, 1, 0, 0, 0]); // sends 0, 1
        const g1 = f32([3, 0, 0, 6, 0, 0, 0, -1]); // sends 3, 0
        const r = p.step([[g0], [g1]]);
        for (const w of [0, 1]) expectEqualArrays(r.outputs[w][0], f32([4, -2, 0, 3, 0, 0, 0, 0]), `out on worker ${w}`);
        expectEqualArrays(p.memory(0, 0), f32([0, 0, 0, 0, 1, 0, 0, 0]), 'e0');
        expectEqualArrays(p.memory(1, 0), f32([0, 0, 0, 0, 0, 0, 0, -1]), 'e1');
        expect(r.floatsSent).to.equal(2 * 2 * 2);
      });
    });
  });
}
