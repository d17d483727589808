// PowerSGD through ReducerProbe (accordion-engine/testing): its orthogonalisation and compression against
// docs/oracles.md §2.1-2.2 (formulas: docs/algorithms.md §3), on the CPU and on a GPU (pending without one).
// References are float64; the engine computes in float32, hence the tolerances.
import { expect } from 'chai';
import { DEVICES } from '../helpers/devices.js';
import { makeRng } from '../helpers/gradcheck.js';
import { expectClose, expectEqualArrays, f32, frobenius, maxAbs, numelOf, probe, probesOn, randn, step1 } from '../helpers/compression-checks.js';

// ---------------------------------------------------------------------------------------------
// Float64 references

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

// ---------------------------------------------------------------------------------------------

for (const target of DEVICES) {
  describe(`gradient compression (ReducerProbe) on ${target}`, function () {
    probesOn(target);

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
  });
}
