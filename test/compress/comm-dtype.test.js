// Values sent in bf16 or fp16 (--comm-dtype): the rounding against PyTorch's conversions, the
// exchange's results against hand-computed and float64 references, error feedback absorbing the
// rounding, fp16's range, and the bytes counted.
import { spawnSync } from 'node:child_process';
import { expect } from 'chai';
import { ReducerProbe, roundTo } from '../../lib/testing.js';
import { makeRng } from '../helpers/gradcheck.js';
import { PYTHON, requireTorch } from '../helpers/outside.js';
import { thrownBy } from '../helpers/throws.js';

const numelOf = (shape) => shape.reduce((a, b) => a * b, 1);
const randn = (rng, n, scale = 1) => Float32Array.from({ length: n }, () => scale * rng.normal());
const bitsOf = (a) => Array.from(new Uint32Array(Float32Array.from(a).buffer));

/** Values where rounding is delicate: ties to even, subnormals, the edge of fp16's range, specials. */
function delicateValues() {
  const out = [0, -0, 1, -1, Infinity, -Infinity, NaN, 3.4028234663852886e38, -3.4028234663852886e38, 1.1754943508222875e-38, 1e-45];
  for (const base of [1, 2048, 1 / 1024, 6.103515625e-5]) {
    // For bf16 (7 mantissa bits) and fp16 (10): exactly half an ulp above base (a tie, kept at the even
    // neighbour), and a tie above base's odd neighbour (rounded up to the next even one).
    for (const bits of [7, 10]) {
      const ulp = base * 2 ** -bits;
      out.push(base + ulp / 2, base + 1.5 * ulp, base + ulp / 2 + ulp / 64, -(base + 1.5 * ulp));
    }
  }
  // fp16: the largest finite value, the last value that rounds to it, the first that overflows, a tie.
  out.push(65504, 65519.99609375, 65520, 65536, -65520, 70000, 65488, 65512);
  // fp16 subnormals: 2⁻²⁴ steps, a tie at half a step (to zero), 1.5 steps (to two), the smallest normal.
  out.push(2 ** -24, 2 ** -25, 1.5 * 2 ** -24, 2.5 * 2 ** -24, 2 ** -14, 2 ** -14 - 2 ** -25, 1023.5 * 2 ** -24, 2 ** -26);
  return Float32Array.from(out);
}

describe('values sent in 16 bits (--comm-dtype)', function () {
  describe('rounding', function () {
    it("rounds to nearest even exactly as PyTorch's bfloat16 and float16 conversions, on delicate and random values", function () {
      requireTorch();
      const rng = makeRng(5);
      const random = Float32Array.from({ length: 4000 }, (_, i) => rng.normal() * 10 ** ((i % 24) - 12));
      const values = Float32Array.from([...delicateValues(), ...random]);
      const script = [
        'import sys, json, torch',
        'bits = torch.tensor(json.load(sys.stdin), dtype=torch.int64).to(torch.int32)',
        'x = bits.view(torch.float32)',
        'out = {d: x.to(getattr(torch, t)).to(torch.float32).view(torch.int32).tolist() for d, t in (("bf16", "bfloat16"), ("fp16", "float16"))}',
        'print(json.dumps(out))',
      ].join('\n');
      const signed = Array.from(new Int32Array(values.buffer));
      const r = spawnSync(PYTHON, ['-c', script], { input: JSON.stringify(signed), encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '1' } });
      expect(r.status, r.stderr).to.equal(0);
      const reference = JSON.parse(r.stdout);
      for (const dtype of ['bf16', 'fp16']) {
        const ours = roundTo(values, dtype);
        const theirs = new Float32Array(Int32Array.from(reference[dtype]).buffer);
        values.forEach((v, i) => {
          if (Number.isNaN(theirs[i])) expect(Number.isNaN(ours[i]), `${dtype} of NaN`).to.equal(true);
          else expect(bitsOf([ours[i]])[0], `${dtype} of ${v} (PyTorch: ${theirs[i]}, ours: ${ours[i]})`).to.equal(bitsOf([theirs[i]])[0]);
        });
      }
      // fp32 is the identity.
      expect(bitsOf(roundTo(values, 'fp32'))).to.deep.equal(bitsOf(values));
    });

    it('agrees with hand-computed cases', function () {
      const cases = {
        bf16: [[1 + 2 ** -8, 1], [1 + 3 * 2 ** -8, 1 + 2 ** -6], [1 + 2 ** -8 + 2 ** -20, 1 + 2 ** -7], [3.4028234663852886e38, Infinity]],
        fp16: [[1 + 2 ** -11, 1], [1 + 3 * 2 ** -11, 1 + 2 ** -9], [65519, 65504], [65520, Infinity], [2 ** -25, 0], [3 * 2 ** -25, 2 ** -23], [50000, 49984]],
      };
      for (const [dtype, list] of Object.entries(cases)) {
        const out = roundTo(Float32Array.from(list.map(([x]) => x)), dtype);
        list.forEach(([x, expected], i) => expect(out[i], `${dtype}(${x})`).to.equal(expected));
      }
      expect(thrownBy(() => roundTo(new Float32Array(1), 'fp8')).message).to.include("unknown communication precision 'fp8' (known: fp32, bf16, fp16)");
    });
  });

  describe('the exchange (in-process workers)', function () {
    /** The result of the dense exchange of rank values xs (one per worker), by the documented steps in float64. */
    function denseReference(xs, dtype) {
      const W = xs.length;
      const round = (v) => roundTo(Float32Array.of(v), dtype)[0];
      let share = 0;
      for (const x of xs) share = Math.fround(share + round(Math.fround(x * Math.fround(1 / W))));
      return Math.fround(Math.fround(round(share) * W) * Math.fround(1 / W));
    }

    it('sends dense gradients divided by W and rounded, sums them in fp32, and gets every worker the same average', function () {
      for (const dtype of ['bf16', 'fp16']) {
        for (const W of [2, 3]) {
          const rng = makeRng(W + dtype.length);
          const shapes = [[7], [5, 3]];
          const p = new ReducerProbe(shapes, { workers: W, commDtype: dtype });
          const grads = Array.from({ length: W }, () => shapes.map((s) => randn(rng, numelOf(s), 3)));
          const { outputs, floatsSent, bytesSent } = p.step(grads);
          shapes.forEach((s, i) => {
            const expected = Array.from({ length: numelOf(s) }, (_, k) => denseReference(grads.map((g) => g[i][k]), dtype));
            for (let w = 0; w < W; w++) expect(Array.from(outputs[w][i]), `${dtype} W=${W} worker ${w} p${i}`).to.deep.equal(expected);
          });
          expect(floatsSent).to.equal(22);
          expect(bytesSent).to.equal(44);
        }
      }
    });

    it('sums in fp32: 2048 + 1 + 1 in fp16 shares gives 2050, where fp16 accumulation stays at 2048', function () {
      // Three workers send 6144, 3 and 3: divided by 3, fp16 holds 2048, 1 and 1 exactly.
      const p = new ReducerProbe([[1]], { workers: 3, commDtype: 'fp16' });
      const { outputs } = p.step([[Float32Array.of(6144)], [Float32Array.of(3)], [Float32Array.of(3)]]);
      for (let w = 0; w < 3; w++) expect(outputs[w][0][0]).to.equal(2050);
      // An fp16 accumulator rounds 2048 + 1 back to 2048 (a tie, to even) twice.
      const fp16 = (v) => roundTo(Float32Array.of(v), 'fp16')[0];
      expect(fp16(fp16(2048 + 1) + 1)).to.equal(2048);
    });

    it('keeps fp16 values that overflow only before the division by W (PyTorch casts first), and names a gradient that still overflows', function () {
      // 100000 / 2 = 50000 fits (rounded to 49984, a multiple of fp16's step of 32 there).
      let p = new ReducerProbe([[1]], { workers: 2, commDtype: 'fp16' });
      const { outputs } = p.step([[Float32Array.of(100000)], [Float32Array.of(0)]]);
      expect(outputs[0][0][0]).to.equal(49984);
      // 140000 / 2 = 70000 does not: the step stops on both workers, naming the parameter and the cure.
      p = new ReducerProbe([[3], [2, 2]], { workers: 2, commDtype: 'fp16' });
      const big = [[new Float32Array(3), Float32Array.of(1, 140000, 0, 0)], [new Float32Array(3), new Float32Array(4)]];
      const err = thrownBy(() => p.step(big));
      expect(err.code).to.equal('ERR_NUMERICAL');
      expect(err.message).to.include("the gradient of 'p1' left fp16's range in the exchange (a value sent beyond ±65504)");
      expect(err.message).to.include('bf16');
      // bf16 has fp32's range: the same step goes through.
      p = new ReducerProbe([[3], [2, 2]], { workers: 2, commDtype: 'bf16' });
      expect(p.step(big).outputs[1][1][1]).to.equal(70144); // 140000 / 2 = 70000 in bf16 (step 512): 70144 (69632 + 512)
    });

    it('TopK in fp16: a selected value beyond ±65504 is named, not sent as Inf into the weights', function () {
      const p = new ReducerProbe([[2, 4]], { workers: 2, compressor: 'topk', level: 0.25, commDtype: 'fp16' });
      const err = thrownBy(() => p.step([[Float32Array.of(0, 1e5, 0, 0, 0, 0, 0, 2)], [new Float32Array(8)]]));
      expect(err.code).to.equal('ERR_NUMERICAL');
      expect(err.message).to.include("'p0' left fp16's range");
    });

    /**
     * Runs 40 steps of W workers through `p` (and `exact`, the same reducer in fp32) and checks that
     * error feedback kept what rounding lost: Σ out + mean e = Σ mean g, while the outputs differ from fp32's.
     */
    function expectRoundingFedBack(p, exact, shapes, W, rng, what) {
      const sumOut = shapes.map((s) => new Float64Array(numelOf(s)));
      const sumG = shapes.map((s) => new Float64Array(numelOf(s)));
      let differs = 0;
      for (let t = 0; t < 40; t++) {
        const grads = Array.from({ length: W }, () => shapes.map((s) => randn(rng, numelOf(s))));
        const { outputs } = p.step(grads);
        const fp32 = exact.step(grads).outputs;
        shapes.forEach((_, i) => {
          outputs[0][i].forEach((v, k) => {
            sumOut[i][k] += v;
            if (v !== fp32[0][i][k]) differs++;
          });
          for (let w = 0; w < W; w++) grads[w][i].forEach((v, k) => (sumG[i][k] += v / W));
        });
      }
      expect(differs, `${what}: the rounding changed the outputs`).to.be.above(0);
      shapes.forEach((_, i) => {
        const lhs = Float64Array.from(sumOut[i]);
        for (let w = 0; w < W; w++) p.memory(w, i).forEach((v, k) => (lhs[k] += v / W));
        const scale = 1 + Math.max(...sumG[i].map(Math.abs));
        const worst = Math.max(...lhs.map((v, k) => Math.abs(v - sumG[i][k])));
        // fp32 arithmetic over 40 steps; a lost rounding (2⁻⁹ or 2⁻¹² of every value sent) is 10× larger.
        expect(worst, `${what} p${i}`).to.be.below(2e-4 * scale);
      });
    }

    it('feeds the rounding back: over 40 steps Σ out + mean e = Σ mean g (PowerSGD and TopK, W = 2 and 3), as in fp32', function () {
      const shapes = [[16, 8, 3, 3], [10, 20], [33, 5]];
      for (const compressor of ['powersgd', 'topk']) {
        for (const dtype of ['bf16', 'fp16']) {
          for (const W of [2, 3]) {
            const rng = makeRng(W * 7 + compressor.length + dtype.length);
            const level = compressor === 'powersgd' ? 2 : 0.05;
            const p = new ReducerProbe(shapes, { compressor, level, workers: W, minCompressionRate: 0, commDtype: dtype });
            const exact = new ReducerProbe(shapes, { compressor, level, workers: W, minCompressionRate: 0 });
            expectRoundingFedBack(p, exact, shapes, W, rng, `${compressor} ${dtype} W=${W}`);
          }
        }
      }
    });

    describe('a matrix sent dense in bf16 (level -1) in an fp32 exchange', function () {
      const shapes = [[6, 4], [5, 3], [7]];

      it('sends M = g + e divided by W and rounded to bf16, sums in fp32, keeps e = M − out; the other tensors travel in fp32', function () {
        for (const compressor of ['powersgd', 'topk']) {
          for (const W of [2, 3]) {
            const rng = makeRng(11 * W + compressor.length);
            const level = compressor === 'powersgd' ? 1 : 0.5;
            const p = new ReducerProbe(shapes, { compressor, level, workers: W, minCompressionRate: 0 });
            const fp32 = new ReducerProbe(shapes, { compressor, level, workers: W, minCompressionRate: 0 });
            p.setLevel(0, -1);
            fp32.setLevel(0, 0);
            expect(p.level(0)).to.equal(-1);
            expect(p.isCompressed(0)).to.equal(false);
            for (let t = 0; t < 3; t++) {
              const grads = Array.from({ length: W }, () => shapes.map((s) => randn(rng, numelOf(s), 3)));
              const memories = Array.from({ length: W }, (_, w) => p.memory(w, 0));
              const r = p.step(grads);
              const other = fp32.step(grads);
              const M = grads.map((g, w) => g[0].map((v, k) => Math.fround(v + memories[w][k])));
              const expected = Array.from({ length: 24 }, (_, k) => denseReference(M.map((m) => m[k]), 'bf16'));
              for (let w = 0; w < W; w++) {
                expect(Array.from(r.outputs[w][0]), `${compressor} W=${W} step ${t} worker ${w}: the bf16 average`).to.deep.equal(expected);
                expect(Array.from(p.memory(w, 0)), `worker ${w}: e = M − out`).to.deep.equal(Array.from(M[w], (m, k) => Math.fround(m - expected[k])));
                // The compressed matrix and the bias are what an fp32 exchange makes of them.
                expect(Array.from(r.outputs[w][2]), 'bias in fp32').to.deep.equal(Array.from(other.outputs[w][2]));
                expect(Array.from(r.outputs[w][1]), 'compressed matrix').to.deep.equal(Array.from(other.outputs[w][1]));
              }
              // Floats: 24 dense values; bytes: 2 each, the rest at fp32's 4.
              expect(r.floatsSent - other.floatsSent, 'floats as dense').to.equal(0);
              expect(other.bytesSent - r.bytesSent, 'bytes saved').to.equal(24 * 2);
            }
          }
        }
      });

      it('feeds the rounding back: over 40 steps Σ out + mean e = Σ mean g (W = 2 and 3)', function () {
        for (const W of [2, 3]) {
          const matrices = shapes.slice(0, 2);
          const p = new ReducerProbe(matrices, { compressor: 'powersgd', level: 1, workers: W, minCompressionRate: 0 });
          const exact = new ReducerProbe(matrices, { compressor: 'powersgd', level: 1, workers: W, minCompressionRate: 0 });
          for (const i of [0, 1]) {
            p.setLevel(i, -1);
            exact.setLevel(i, 0);
          }
          expectRoundingFedBack(p, exact, matrices, W, makeRng(W), `dense bf16 W=${W}`);
        }
      });

      it('alone: nothing is rounded, and the memory a compressed level left is paid into the gradient', function () {
        const rng = makeRng(8);
        const p = new ReducerProbe(shapes, { compressor: 'powersgd', level: 1, minCompressionRate: 0 });
        p.step([shapes.map((s) => randn(rng, numelOf(s)))]);
        const memory = p.memory(0, 0);
        expect(memory.some((v) => v !== 0), 'rank 1 leaves an error').to.equal(true);
        p.setLevel(0, -1);
        const g = shapes.map((s) => randn(rng, numelOf(s)));
        const out = p.step([g]).outputs[0][0];
        expect(Array.from(out)).to.deep.equal(Array.from(g[0], (v, k) => Math.fround(v + memory[k])));
        expect(p.memory(0, 0).every((v) => v === 0)).to.equal(true);
      });

      it("prices it as the relative error of rounding the epoch sum to bf16, at the floats of dense and 2 bytes a value", function () {
        const rng = makeRng(3);
        const p = new ReducerProbe(shapes, { compressor: 'powersgd', level: 1, accumulateNorms: true, minCompressionRate: 0 });
        const grads = [0, 1].map(() => shapes.map((s) => randn(rng, numelOf(s))));
        for (const g of grads) p.step([g]);
        const costs = p.levelCosts(0, [-1, 0, 1]);
        for (const i of [0, 1]) {
          const sum = Float32Array.from(grads[0][i], (v, k) => v + grads[1][i][k]);
          const rounded = roundTo(sum, 'bf16');
          let lost = 0, norm = 0;
          sum.forEach((v, k) => {
            lost += (v - rounded[k]) ** 2;
            norm += v * v;
          });
          const [bf16, dense] = costs[i];
          expect(bf16.level).to.equal(-1);
          expect(bf16.error).to.be.closeTo(Math.sqrt(lost / norm), 1e-12);
          expect(bf16.error, 'about 2⁻⁹ of each value').to.be.within(2 ** -12, 2 ** -8);
          expect(bf16.floats).to.equal(dense.floats);
          expect(bf16.bytes).to.equal(2 * sum.length);
          expect(dense.bytes).to.equal(4 * sum.length);
          expect(bf16.seconds).to.equal(0);
        }
      });

      it('names a matrix whose average left bf16\'s range, and what to do', function () {
        const p = new ReducerProbe(shapes, { compressor: 'powersgd', level: 1, workers: 2, minCompressionRate: 0 });
        p.setLevel(0, -1);
        // Each sends 3.4e38 / 2; their sum, 3.4e38, lies beyond bf16's largest finite 3.3895e38.
        const big = () => shapes.map((s, i) => (i === 0 ? new Float32Array(numelOf(s)).fill(3.4e38) : new Float32Array(numelOf(s))));
        const err = thrownBy(() => p.step([big(), big()]));
        expect(err.code).to.equal('ERR_NUMERICAL');
        expect(err.message).to.include("the gradient of 'p0' left bf16's range in the exchange (a value rounded to Inf)");
        expect(err.message).to.include('--auto-cost floats');
      });

      it('is refused where it is not a level: other negative values, 1-D tensors, no compressor', function () {
        const p = new ReducerProbe(shapes, { compressor: 'powersgd', level: 1 });
        expect(thrownBy(() => p.setLevel(0, -2)).message).to.include('a PowerSGD rank must be a positive integer (or 0: dense, -1: dense in bf16), got -2');
        expect(thrownBy(() => p.setLevel(2, -1)).message).to.include('the parameter is 1-D and always sent dense');
        expect(thrownBy(() => new ReducerProbe(shapes, {}).setLevel(0, -1)).message).to.include('no compressor is active');
      });
    });

    it('counts bytes as predicted from the shapes: 2 per value sent, 4 per TopK index', function () {
      const shapes = [[16, 8, 3, 3], [10, 20], [33]];
      for (const dtype of ['fp32', 'bf16']) {
        const v = dtype === 'fp32' ? 4 : 2;
        const W = 2;
        const ps = new ReducerProbe(shapes, { compressor: 'powersgd', level: 2, workers: W, minCompressionRate: 0, commDtype: dtype });
        const grads = Array.from({ length: W }, (_, w) => shapes.map((s) => randn(makeRng(w), numelOf(s))));
        // (n + m)·r per matrix: (16 + 72)·2 and (10 + 20)·2; the bias is dense.
        let r = ps.step(grads);
        expect(r.floatsSent).to.equal(176 + 60 + 33);
        expect(r.bytesSent).to.equal((176 + 60 + 33) * v);
        const tk = new ReducerProbe(shapes, { compressor: 'topk', level: 0.1, workers: W, commDtype: dtype });
        // s = ⌊0.1·numel⌋: 115 and 20 pairs from each of the 2 workers; indices 4 bytes, values v.
        r = tk.step(grads);
        expect(r.floatsSent).to.equal(2 * (115 + 20) * W + 33);
        expect(r.bytesSent).to.equal((115 + 20) * W * (4 + v) + 33 * v);
      }
    });
  });
});
