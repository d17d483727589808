// Gradient compression (PowerSGD, TopK, dense) through ReducerProbe (accordion-engine/testing), checked against the
// oracles of docs/oracles.md §2 (formulas: docs/algorithms.md §3), on the CPU and on a GPU (pending
// without one). Reference arithmetic here is float64; the engine computes in float32, hence the
// tolerances.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Model } from '../lib/index.js';
import { ReducerProbe } from '../lib/testing.js';
import { DEVICES, requireDevice } from './helpers/devices.js';
import { makeRng } from './helpers/gradcheck.js';
import { thrownBy } from './helpers/throws.js';

const testingUrl = new URL('../lib/testing.js', import.meta.url).href;

// ---------------------------------------------------------------------------------------------
// Helpers

/** `n` standard normal floats from a seeded stream (makeRng), so that failures reproduce. */
function randn(rng, n) {
  return Float32Array.from({ length: n }, () => rng.normal());
}

function numelOf(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

function f32(values) {
  return Float32Array.from(values.flat(Infinity));
}

function maxAbsDiff(a, b) {
  expect(a.length, 'length').to.equal(b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]));
  return worst;
}

function maxAbs(a) {
  let m = 0;
  for (const v of a) m = Math.max(m, Math.abs(v));
  return m;
}

function expectClose(actual, expected, tol, what) {
  const flat = Array.isArray(expected) ? expected.flat(Infinity) : expected;
  const d = maxAbsDiff(actual, flat);
  expect(d, `${what}: max |diff| ${d} > ${tol}\n got      ${Array.from(actual)}\n expected ${Array.from(flat)}`).to.be.at.most(tol);
}

function expectEqualArrays(actual, expected, what) {
  expect(Array.from(actual), what).to.deep.equal(Array.from(expected));
}

function frobenius(a) {
  let s = 0;
  for (const v of a) s += v * v;
  return Math.sqrt(s);
}

// Row-major float64 matrices as { rows, cols, data }.
function mat(rows, cols, data) {
  return { rows, cols, data: Float64Array.from(data) };
}

function matmul(A, B) {
  expect(A.cols).to.equal(B.rows);
  const C = new Float64Array(A.rows * B.cols);
  for (let i = 0; i < A.rows; i++)
    for (let k = 0; k < A.cols; k++) {
      const a = A.data[i * A.cols + k];
      for (let j = 0; j < B.cols; j++) C[i * B.cols + j] += a * B.data[k * B.cols + j];
    }
  return mat(A.rows, B.cols, C);
}

function transpose(A) {
  const T = new Float64Array(A.rows * A.cols);
  for (let i = 0; i < A.rows; i++) for (let j = 0; j < A.cols; j++) T[j * A.rows + i] = A.data[i * A.cols + j];
  return mat(A.cols, A.rows, T);
}

// Modified Gram-Schmidt on the columns, no epsilon (the reference in float64).
function orthonormalColumns(A) {
  const P = mat(A.rows, A.cols, A.data);
  const { rows, cols, data } = P;
  for (let i = 0; i < cols; i++) {
    let norm = 0;
    for (let k = 0; k < rows; k++) norm += data[k * cols + i] ** 2;
    norm = Math.sqrt(norm);
    for (let k = 0; k < rows; k++) data[k * cols + i] /= norm;
    for (let j = i + 1; j < cols; j++) {
      let dot = 0;
      for (let k = 0; k < rows; k++) dot += data[k * cols + i] * data[k * cols + j];
      for (let k = 0; k < rows; k++) data[k * cols + j] -= dot * data[k * cols + i];
    }
  }
  return P;
}

// Gauss-Jordan inverse of a small square matrix.
function inverse(A) {
  const n = A.rows;
  const w = 2 * n;
  const a = new Float64Array(n * w);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) a[i * w + j] = A.data[i * n + j];
    a[i * w + n + i] = 1;
  }
  for (let c = 0; c < n; c++) {
    let pivot = c;
    for (let r = c + 1; r < n; r++) if (Math.abs(a[r * w + c]) > Math.abs(a[pivot * w + c])) pivot = r;
    for (let j = 0; j < w; j++) [a[c * w + j], a[pivot * w + j]] = [a[pivot * w + j], a[c * w + j]];
    const d = a[c * w + c];
    for (let j = 0; j < w; j++) a[c * w + j] /= d;
    for (let r = 0; r < n; r++) {
      if (r === c) continue;
      const f = a[r * w + c];
      for (let j = 0; j < w; j++) a[r * w + j] -= f * a[c * w + j];
    }
  }
  const inv = new Float64Array(n * n);
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) inv[i * n + j] = a[i * w + n + j];
  return mat(n, n, inv);
}

// With one worker out = P̂·Q'ᵀ, so P̂ = out·Q'·(Q'ᵀQ')⁻¹: the engine's orthonormal basis made observable.
function recoverPHat(out, qPrime, n, m, r) {
  const O = mat(n, m, out);
  const Q = mat(m, r, qPrime);
  return matmul(matmul(O, Q), inverse(matmul(transpose(Q), Q)));
}

function identity(n) {
  const I = new Float64Array(n * n);
  for (let i = 0; i < n; i++) I[i * n + i] = 1;
  return I;
}

// The device the suite below runs on: every oracle holds on the CPU and on a GPU alike.
let device = 'cpu';

function probe(shapes, options) {
  return new ReducerProbe(shapes, { device, ...options });
}

// One worker, one parameter.
function step1(p, g) {
  return p.step([[g]]).outputs[0][0];
}

function expectThrowsCode(fn, code, messagePart) {
  const caught = thrownBy(fn);
  expect(caught, 'expected a throw').to.be.instanceOf(Error);
  expect(caught.code, caught.message).to.equal(code);
  if (messagePart) expect(caught.message).to.include(messagePart);
  return caught;
}

// ---------------------------------------------------------------------------------------------

for (const target of DEVICES) {
  describe(`gradient compression (ReducerProbe) on ${target}`, function () {
    before(function () {
      requireDevice(this, target);
      device = target;
    });
    after(() => {
      device = 'cpu';
    });

    describe('PowerSGD orthogonalisation (docs/oracles.md §2.1)', function () {
      it('turns A = [[3,1],[4,1],[0,1]] into the documented P̂ (M = A, Q = I₂)', function () {
        // P = M·Q = A. P̂ is not returned directly; with one worker it is recovered exactly from out and Q'.
        const p = probe([[3, 2]], { compressor: 'powersgd', level: 2, minCompressionRate: 0 });
        p.setQ(0, f32([[1, 0], [0, 1]]));
        const A = [[3, 1], [4, 1], [0, 1]];
        const out = step1(p, f32(A));
        const qPrime = p.q(0, 0);
        // Q' = AᵀP̂ = Rᵀ where A = P̂R: R = [[5, 1.4], [0, √1.04]].
        expectClose(qPrime, [5, 0, 1.4, Math.sqrt(1.04)], 1e-5, "Q' = Rᵀ");
        const pHat = recoverPHat(out, qPrime, 3, 2, 2);
        expectClose(pHat.data, [[0.6, 0.156893], [0.8, -0.11767], [0, 0.980581]], 1e-5, 'P̂');
        expectClose(matmul(transpose(pHat), pHat).data, identity(2), 1e-5, 'P̂ᵀP̂');
        // Full rank, so the projection reproduces A.
        expectClose(out, A, 1e-5, 'out');
      });

      it('outputs the projection of M onto span(M·Q), and compressing that output again returns it', function () {
        const rng = makeRng(11);
        const [n, m, r] = [8, 6, 3];
        const M = randn(rng, n * m);
        const Q = randn(rng, m * r);
        const p = probe([[n, m]], { compressor: 'powersgd', level: r, minCompressionRate: 0 });
        p.setQ(0, Q);
        const out = step1(p, M);
        const M64 = mat(n, m, M);
        const pHat = orthonormalColumns(matmul(M64, mat(m, r, Q)));
        const projection = matmul(pHat, matmul(transpose(pHat), M64));
        expectClose(out, projection.data, 1e-5, 'out = P̂P̂ᵀM');
        // Residual is orthogonal to the basis and the projection does not grow the norm.
        const residual = mat(n, m, M.map((v, i) => v - out[i]));
        expectClose(matmul(transpose(pHat), residual).data, new Float64Array(r * m), 1e-5, 'P̂ᵀ(M − out)');
        expect(frobenius(out)).to.be.at.most(frobenius(M));
        // out·Q lies in span(P̂), so a fresh compressor with the same Q finds the same basis.
        const again = probe([[n, m]], { compressor: 'powersgd', level: r, minCompressionRate: 0 });
        again.setQ(0, Q);
        expectClose(step1(again, out), out, 1e-5, 'compress(out)');
      });

      it('keeps a zero column of P at zero instead of producing NaN (eps 1e-8)', function () {
        const p = probe([[3, 2], [2, 3]], { compressor: 'powersgd', level: 2, minCompressionRate: 0 });
        // Second column of Q is zero, so the second column of P is zero.
        p.setQ(0, f32([[1, 0], [0, 0]]));
        const M = f32([[1, 2], [3, 4], [5, 6]]);
        // An all-zero gradient makes every column of P zero.
        const { outputs } = p.step([[M, new Float32Array(6)]]);
        for (const v of outputs[0][0]) expect(Number.isFinite(v)).to.equal(true);
        // Only the first direction survives: out = p̂₀p̂₀ᵀM with p̂₀ ∝ M[:,0].
        const c = mat(3, 1, [1, 3, 5]);
        const pHat = orthonormalColumns(c);
        expectClose(outputs[0][0], matmul(pHat, matmul(transpose(pHat), mat(3, 2, M))).data, 1e-5, 'out');
        expectEqualArrays(outputs[0][1], new Float32Array(6), 'zero gradient → zero output');
        for (const v of p.q(0, 1)) expect(Number.isFinite(v)).to.equal(true);
      });
    });

    describe('PowerSGD compression (docs/oracles.md §2.2)', function () {
      const M = [[1, 2], [3, 4], [5, 6]];

      it('reconstructs M exactly when the rank reaches min(n, m), clipping larger ranks', function () {
        const full = probe([[3, 2]], { compressor: 'powersgd', level: 2, minCompressionRate: 0 });
        full.setQ(0, f32([[1, 0], [0, 1]]));
        expectClose(step1(full, f32(M)), M, 1e-5, 'rank 2, Q = I');
        expectClose(full.memory(0, 0), new Float32Array(6), 1e-5, 'no error left');

        // rank 4 on 3×2 uses r = 2: Q is (2, 2), floats (3 + 2)·2.
        const clipped = probe([[3, 2]], { compressor: 'powersgd', level: 4, minCompressionRate: 0 });
        expect(clipped.level(0)).to.equal(4);
        expect(clipped.q(0, 0)).to.have.length(4);
        expect(clipped.floatsPerStep()).to.equal(10);
        const r = clipped.step([[f32(M)]]);
        expect(r.floatsSent).to.equal(10);
        expectClose(r.outputs[0][0], M, 1e-5, 'rank 4 → 2, seeded Q');

        // r = n < m: 2×4 with rank 2 and 3 (clipped to 2), the seeded Q.
        const wide = [[1, -2, 0.5, 3], [2, 1, -1, 0.25]];
        for (const level of [2, 3]) {
          const p = probe([[2, 4]], { compressor: 'powersgd', level, minCompressionRate: 0 });
          expect(p.q(0, 0)).to.have.length(8);
          const out = step1(p, f32(wide));
          expectClose(out, wide, 1e-5, `2×4 rank ${level}`);
        }
      });

      it('reproduces the single-worker worked example (rank 1, Q = [1, 1]ᵀ)', function () {
        const p = probe([[3, 2]], { compressor: 'powersgd', level: 1, minCompressionRate: 0 });
        p.setQ(0, f32([1, 1]));
        const r = p.step([[f32(M)]]);
        const out = r.outputs[0][0];
        expectClose(out, [[1.324022, 1.675978], [3.089385, 3.910615], [4.854749, 6.145251]], 1e-5, 'M̂');
        expectClose(p.memory(0, 0), [[-0.324022, 0.324022], [-0.089385, 0.089385], [0.145251, -0.145251]], 1e-5, 'e = M − M̂');
        expectClose(p.q(0, 0), [5.904737, 7.474351], 1e-5, "Q'");
        expectClose(recoverPHat(out, p.q(0, 0), 3, 2, 1).data, [0.224231, 0.523205, 0.822179], 1e-5, 'P̂');
        expect(r.floatsSent).to.equal(5);
      });

      it('reproduces the two-worker worked example (rank 1, Q = [1, 0]ᵀ)', function () {
        const p = probe([[3, 2]], { compressor: 'powersgd', level: 1, workers: 2, minCompressionRate: 0 });
        p.setQ(0, f32([1, 0]));
        const M1 = [[1, 0], [0, 2], [1, 1]];
        const M2 = [[3, 2], [0, 0], [1, -1]];
        const { outputs, floatsSent } = p.step([[f32(M1)], [f32(M2)]]);
        for (const w of [0, 1]) {
          expectClose(outputs[w][0], [[2, 0.8], [0, 0], [1, 0.4]], 1e-5, `out on worker ${w}`);
          expectClose(p.q(w, 0), [2.236068, 0.894427], 1e-5, `Q̄ on worker ${w}`);
        }
        expectClose(p.memory(0, 0), [[-1, -0.8], [0, 2], [0, 0.6]], 1e-5, 'e1');
        expectClose(p.memory(1, 0), [[1, 1.2], [0, 0], [0, -1.4]], 1e-5, 'e2');
        expect(floatsSent).to.equal(5);
      });

      it('keeps mean(e) + out = mean(M) for W = 2 and 4 (PowerSGD and TopK), with identical outputs on all workers', function () {
        const shapes = [[12, 5], [4, 3, 2, 2], [7]];
        for (const compressor of ['powersgd', 'topk']) {
          for (const W of [2, 4]) {
            const rng = makeRng(100 + W);
            const level = compressor === 'powersgd' ? 2 : 0.2;
            const p = probe(shapes, { compressor, level, workers: W, minCompressionRate: 0 });
            for (let t = 0; t < 4; t++) {
              const grads = Array.from({ length: W }, () => shapes.map((s) => randn(rng, numelOf(s))));
              // M_i = g_i + e_i, with e_i read before the step.
              const inputs = grads.map((gs, w) =>
                gs.map((g, i) => {
                  const e = p.memory(w, i);
                  return e ? g.map((v, k) => v + e[k]) : g;
                }),
              );
              const { outputs } = p.step(grads);
              for (let i = 0; i < shapes.length; i++) {
                for (let w = 1; w < W; w++) expectEqualArrays(outputs[w][i], outputs[0][i], `${compressor} W=${W} p${i} worker ${w}`);
                const n = numelOf(shapes[i]);
                const lhs = new Float64Array(n);
                const rhs = new Float64Array(n);
                for (let w = 0; w < W; w++) {
                  const e = p.memory(w, i);
                  for (let k = 0; k < n; k++) {
                    lhs[k] += (e ? e[k] : 0) / W;
                    rhs[k] += inputs[w][i][k] / W;
                  }
                }
                for (let k = 0; k < n; k++) lhs[k] += outputs[0][i][k];
                expectClose(lhs, rhs, 1e-5 * (1 + maxAbs(rhs)), `${compressor} W=${W} step ${t} p${i}`);
              }
            }
          }
        }
      });

      it('gives with several workers what one worker gives on the mean gradient (linearity, same Q)', function () {
        const shape = [9, 2, 3, 1];
        const [n, m] = [9, 6];
        const W = 3;
        const rng = makeRng(7);
        const Q = randn(rng, m * 2);
        const multi = probe([shape], { compressor: 'powersgd', level: 2, workers: W, minCompressionRate: 0 });
        const single = probe([shape], { compressor: 'powersgd', level: 2, minCompressionRate: 0 });
        multi.setQ(0, Q);
        single.setQ(0, Q);
        // Holds at every step: the single worker's memory equals the workers' mean memory.
        for (let t = 0; t < 5; t++) {
          const grads = Array.from({ length: W }, () => [randn(rng, n * m)]);
          const mean = new Float32Array(n * m).map((_, k) => grads.reduce((s, g) => s + g[0][k], 0) / W);
          const a = multi.step(grads).outputs[0][0];
          const b = step1(single, mean);
          expectClose(a, b, 2e-5 * (1 + maxAbs(b)), `out, step ${t}`);
          expectClose(multi.q(0, 0), single.q(0, 0), 2e-5 * (1 + maxAbs(single.q(0, 0))), `Q, step ${t}`);
        }
      });

      it('converges by warm start to the best rank-1 error: ‖M − out‖_F → √(5² + 1² + 0.5²)', function () {
        const [n, m] = [6, 4];
        const rng = makeRng(2024);
        const U = orthonormalColumns(mat(n, m, Array.from({ length: n * m }, rng.normal)));
        const V = orthonormalColumns(mat(m, m, Array.from({ length: m * m }, rng.normal)));
        const sigma = [10, 5, 1, 0.5];
        const S = mat(m, m, identity(m).map((v, i) => v * sigma[Math.floor(i / m)]));
        const M64 = matmul(matmul(U, S), transpose(V));
        const M = Float32Array.from(M64.data);
        const p = probe([[n, m]], { compressor: 'powersgd', level: 1, minCompressionRate: 0 });
        // Without error feedback every step would compress the same M. The reducer always adds its
        // memory e, so feeding g = M − e makes its input g + e = M again: plain subspace iteration.
        let out;
        for (let t = 0; t < 60; t++) {
          const e = p.memory(0, 0);
          out = step1(p, M.map((v, k) => v - e[k]));
        }
        const error = frobenius(M.map((v, k) => v - out[k]));
        expect(error).to.be.closeTo(Math.sqrt(25 + 1 + 0.25), 1e-4);
        // ... and out is then the leading term σ₁u₁v₁ᵀ.
        const u1 = mat(n, 1, Array.from({ length: n }, (_, i) => U.data[i * m]));
        const v1 = mat(1, m, Array.from({ length: m }, (_, j) => V.data[j * m]));
        expectClose(out, matmul(u1, v1).data.map((v) => 10 * v), 1e-4, 'σ₁u₁v₁ᵀ');
      });

      it('applies the min_compression_rate test (rate 2) and counts the floats actually sent', function () {
        const shapes = [[64, 64, 3, 3], [10, 512], [10]];
        const W = 2;
        const p = probe(shapes, { compressor: 'powersgd', level: 1, workers: W, minCompressionRate: 2 });
        expect(p.isCompressed(0), 'conv rank 1: 1280 < 36864').to.equal(true);
        expect(p.isCompressed(1)).to.equal(true);
        expect(p.isCompressed(2), 'bias').to.equal(false);
        p.setLevel(1, 4);
        expect(p.isCompressed(1), 'linear rank 4: 4176 < 5120').to.equal(true);
        expect(p.floatsPerStep()).to.equal(640 + 522 * 4 + 10);
        const rng = makeRng(5);
        const grads = () => Array.from({ length: W }, () => shapes.map((s) => randn(rng, numelOf(s))));
        expect(p.step(grads()).floatsSent).to.equal(p.floatsPerStep());

        // Rank 5: 5220 ≥ 5120, so the linear layer goes dense: no memory use, exact average.
        const q = probe(shapes, { compressor: 'powersgd', level: 5, workers: W, minCompressionRate: 2 });
        expect(q.isCompressed(1)).to.equal(false);
        expect(q.floatsPerStep()).to.equal((64 + 576) * 5 + 5120 + 10);
        const g = grads();
        const r = q.step(g);
        expect(r.floatsSent).to.equal(q.floatsPerStep());
        for (let w = 0; w < W; w++) {
          const average = g[0][1].map((v, k) => Math.fround(v + g[1][1][k]) * 0.5);
          expectEqualArrays(r.outputs[w][1], average, 'dense average');
          const e = q.memory(w, 1);
          if (e !== null) expectEqualArrays(e, new Float32Array(5120), 'memory of the dense matrix');
          expectEqualArrays(r.outputs[w][2], g[0][2].map((v, k) => Math.fround(v + g[1][2][k]) * 0.5), 'bias average');
        }
      });
    });

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

    describe('repeating one round (the benchmark\'s restart)', function () {
      it('restart() gives the round of setInput() again: the same gradients, zero memories and the first Q', function () {
        const shapes = [[6, 3, 3, 3], [10, 8], [6]];
        const rng = makeRng(12);
        const grads = shapes.map((s) => randn(rng, numelOf(s)));
        for (const [compressor, level] of [['powersgd', 2], ['topk', 0.2]]) {
          const p = probe(shapes, { compressor, level, minCompressionRate: 0 });
          const state = () => shapes.map((_, i) => [p.memory(0, i), p.q(0, i)]);
          const q0 = shapes.map((_, i) => p.q(0, i));
          p.setInput([grads]);
          p.run();
          const first = state();
          // A second round on the first one's output and memory. For PowerSGD that is another state
          // (Q warm-started, another memory); a lone TopK worker's second input, sparse(a) + e, is a again.
          p.run();
          if (compressor === 'powersgd') expect(state(), `${compressor}: the second round`).to.not.deep.equal(first);
          p.restart();
          shapes.forEach((_, i) => {
            if (p.memory(0, i)) expect(Array.from(p.memory(0, i)).every((v) => v === 0), `${compressor}: memory ${i} after restart`).to.equal(true);
            expect(p.q(0, i), `${compressor}: Q ${i} after restart`).to.deep.equal(q0[i]);
          });
          p.run();
          expect(state(), `${compressor}: the round after restart`).to.deep.equal(first);
        }
      });

      it('refuses restart() before setInput() and inputs of the wrong size', function () {
        const p = probe([[4, 3]], { compressor: 'topk', level: 0.5 });
        expect(() => p.restart()).to.throw(/setInput/);
        expect(() => p.setInput([[new Float32Array(11)]])).to.throw(/12 floats/);
        expect(() => p.setInput([])).to.throw(/one array per worker/);
      });
    });

    describe('levels (docs/algorithms.md §4.6)', function () {
      it('rejects invalid levels with ERR_INVALID_ARGUMENT, and levels of 1-D parameters', function () {
        const p = probe([[4, 3], [4]], { compressor: 'powersgd', level: 1 });
        // -1 is a level (dense in bf16, test/comm-dtype.test.js); no other negative value is.
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

    describe('non-finite gradients', function () {
      const shapes = [[6, 4], [4], [3, 5]];

      function twins(options) {
        return [probe(shapes, options), probe(shapes, options)];
      }

      it('refuses NaN/Inf with ERR_NUMERICAL naming the parameter, leaving memory, Q and norms untouched', function () {
        for (const compressor of ['powersgd', 'topk']) {
          const options = { compressor, level: compressor === 'powersgd' ? 2 : 0.25, accumulateNorms: true, minCompressionRate: 0 };
          const [p, twin] = twins(options);
          const rng = makeRng(21);
          const first = shapes.map((s) => randn(rng, numelOf(s)));
          p.step([first]);
          twin.step([first]);
          for (const [param, bad] of [[2, NaN], [1, Infinity], [0, -Infinity]]) {
            const before = shapes.map((_, i) => [p.memory(0, i), p.q(0, i)]);
            const grads = shapes.map((s) => randn(rng, numelOf(s)));
            grads[param][3] = bad;
            expectThrowsCode(() => p.step([grads]), 'ERR_NUMERICAL', `'p${param}'`);
            shapes.forEach((_, i) => {
              const [e, q] = before[i];
              if (e) expectEqualArrays(p.memory(0, i), e, `${compressor} memory p${i}`);
              else expect(p.memory(0, i)).to.equal(null);
              if (q) expectEqualArrays(p.q(0, i), q, `${compressor} Q p${i}`);
            });
          }
          // The refused steps left no trace: both probes continue identically.
          const next = shapes.map((s) => randn(rng, numelOf(s)));
          const a = p.step([next]).outputs[0];
          const b = twin.step([next]).outputs[0];
          a.forEach((o, i) => expectEqualArrays(o, b[i], `${compressor} output p${i} after the refusal`));
          expectEqualArrays(p.norms(0), twin.norms(0), `${compressor} norms`);
        }
      });

      it('refuses a step where every worker has a non-finite gradient (W = 2)', function () {
        const p = probe(shapes, { compressor: 'powersgd', level: 1, workers: 2, minCompressionRate: 0 });
        const rng = makeRng(22);
        const grads = [0, 1].map(() => shapes.map((s) => randn(rng, numelOf(s))));
        grads[0][0][0] = NaN;
        grads[1][0][5] = Infinity;
        expectThrowsCode(() => p.step(grads), 'ERR_NUMERICAL', "'p0'");
        for (const w of [0, 1]) expectEqualArrays(p.memory(w, 0), new Float32Array(24), `memory of worker ${w}`);
        const ok = [0, 1].map(() => shapes.map((s) => randn(rng, numelOf(s))));
        const { outputs } = p.step(ok);
        outputs[0].forEach((o) => o.forEach((v) => expect(Number.isFinite(v)).to.equal(true)));
      });

      it('refuses a step where only one of two workers has a NaN, without hanging', function () {
        // Run in a child process: if the healthy worker waits forever in the all-reduce, the test
        // must fail rather than hang mocha.
        const script = `
          import { ReducerProbe } from ${JSON.stringify(testingUrl)};
          const p = new ReducerProbe([[3, 2]], { compressor: 'powersgd', level: 1, workers: 2, minCompressionRate: 0, device: ${JSON.stringify(device)} });
          const good = new Float32Array([1, 2, 3, 4, 5, 6]);
          const bad = new Float32Array([1, NaN, 3, 4, 5, 6]);
          let code = null;
          try { p.step([[good], [bad]]); } catch (err) { code = err.code + ' ' + err.message; }
          const memories = [Array.from(p.memory(0, 0)), Array.from(p.memory(1, 0))];
          console.log(JSON.stringify({ code, memories }));
        `;
        const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
          encoding: 'utf8',
          timeout: 5000,
          cwd: fileURLToPath(new URL('..', import.meta.url)),
        });
        expect(child.error?.code ?? null, 'the step hung (deadlock: the healthy worker waits in the all-reduce)').to.equal(null);
        expect(child.status, child.stderr).to.equal(0);
        const { code, memories } = JSON.parse(child.stdout.trim().split('\n').pop());
        expect(code).to.match(/^ERR_NUMERICAL .*'p0'/);
        expect(memories).to.deep.equal([new Array(6).fill(0), new Array(6).fill(0)]);
      });
    });

    describe('gradient norms for Accordion (docs/algorithms.md §4.1)', function () {
      it('accumulates the norm of the summed raw local gradients, and restarts on reading', function () {
        const shapes = [[5, 4], [4]];
        const W = 2;
        const p = probe(shapes, { compressor: 'powersgd', level: 1, workers: W, accumulateNorms: true, minCompressionRate: 0 });
        const rng = makeRng(31);
        const g = Array.from({ length: W }, () => shapes.map((s) => randn(rng, numelOf(s))));
        const neg = g.map((gs) => gs.map((x) => x.map((v) => -v)));
        p.step(g);
        p.step(neg);
        for (let w = 0; w < W; w++) {
          const norms = p.norms(w);
          expect(norms).to.be.instanceOf(Float64Array);
          expect(Array.from(norms), 'g then −g').to.deep.equal([0, 0]);
        }
        p.step(g);
        p.step(g);
        for (let w = 0; w < W; w++) {
          // Each worker's own raw gradients, not the compressed average.
          const norms = p.norms(w);
          shapes.forEach((_, i) => expect(norms[i], `worker ${w} p${i}`).to.be.closeTo(2 * frobenius(g[w][i]), 1e-5));
          expect(Array.from(p.norms(w)), 'restarted').to.deep.equal([0, 0]);
        }
      });

      it('refuses norms() when they are not accumulated', function () {
        const p = probe([[3, 3]], { compressor: 'topk', level: 0.5 });
        expectThrowsCode(() => p.norms(0), 'ERR_INVALID_ARGUMENT');
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
