// Finite-difference gradient checks for float32 layers, plus float64 reference implementations
// used as forward oracles. Everything random here is seeded so a failure reproduces exactly.
import { assert } from 'chai';
import { mulberry32, normals } from '../../lib/base/random.js';

// ---------------------------------------------------------------------------------------------
// Seeded randomness (the engine's mulberry32 and Box-Muller): tests must not depend on Math.random.

/** One seeded stream: next() in [0, 1), uniform(lo, hi), int(n) in [0, n) and normal(), all drawing from it. */
export function makeRng(seed) {
  const next = mulberry32(seed);
  return {
    next,
    uniform: (lo, hi) => lo + (hi - lo) * next(),
    int: (n) => Math.floor(next() * n),
    normal: normals(next),
  };
}

const asRng = (r) => (typeof r === 'number' ? makeRng(r) : r);

export function randomNormal(n, rng, scale = 1, mean = 0) {
  const g = asRng(rng);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = mean + scale * g.normal();
  return out;
}

export function randomUniform(n, rng, lo, hi) {
  const g = asRng(rng);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = g.uniform(lo, hi);
  return out;
}

/**
 * Values of random sign whose magnitude is at least `margin`, so that a ±h perturbation with
 * h < margin never crosses a ReLU's kink.
 */
export function awayFromZero(n, rng, margin = 0.1, spread = 1) {
  const g = asRng(rng);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (g.next() < 0.5 ? -1 : 1) * (margin + spread * g.next());
  return out;
}

/**
 * A shuffled arithmetic progression centred on 0: all values distinct and at least `gap` apart,
 * so a ±h perturbation with 2h < gap cannot change which element of a pooling window is the max.
 */
export function distinctValues(n, rng, gap = 0.05) {
  const g = asRng(rng);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (i - (n - 1) / 2) * gap;
  for (let i = n - 1; i > 0; i--) {
    const j = g.int(i + 1);
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

/** `count` distinct indices in [0, n), sorted; all of them when count ≥ n. */
export function sampleIndices(n, count, rng) {
  if (count >= n) return Array.from({ length: n }, (_, i) => i);
  const g = asRng(rng);
  const idx = Array.from({ length: n }, (_, i) => i);
  for (let i = 0; i < count; i++) {
    const j = i + g.int(n - i);
    [idx[i], idx[j]] = [idx[j], idx[i]];
  }
  return idx.slice(0, count).sort((a, b) => a - b);
}

// ---------------------------------------------------------------------------------------------
// Finite differences

/** Σ out·R accumulated in float64, so the loss itself adds no float32 rounding. */
export function weightedSum(out, r) {
  assert.equal(out.length, r.length, 'output and projection lengths differ');
  let s = 0;
  for (let i = 0; i < out.length; i++) s += out[i] * r[i];
  return s;
}

/**
 * Central differences of `loss()` with respect to arr[i] for each i in `indices`. `arr` is
 * perturbed in place and restored. The divisor is the step actually taken after rounding to
 * float32, not 2h, because fround(x + h) − fround(x − h) can differ from 2h by an ulp of x.
 */
export function numericalGradient(loss, arr, indices, h) {
  const out = new Float64Array(indices.length);
  indices.forEach((i, k) => {
    const x0 = arr[i];
    arr[i] = x0 + h;
    const up = arr[i];
    const lp = loss();
    arr[i] = x0 - h;
    const down = arr[i];
    const lm = loss();
    arr[i] = x0;
    out[k] = (lp - lm) / (up - down);
  });
  return out;
}

export function unravel(index, shape) {
  if (!shape) return String(index);
  const coords = [];
  let r = index;
  for (let d = shape.length - 1; d >= 0; d--) {
    coords.unshift(r % shape[d]);
    r = Math.floor(r / shape[d]);
  }
  return `${index} [${coords.join(', ')}]`;
}

/**
 * Compares analytic[indices[k]] with numeric[k]. An entry passes when
 * |a − n| ≤ atol + rtol·max(|a|, |n|), with atol = atolFactor · (largest |gradient| of the tensor),
 * which absorbs float32 noise on entries whose true gradient is ~0. `worstRel` is
 * |a − n| / max(|a|, |n|, atol): a relative error that does not explode on zero entries.
 */
export function compareGradients(analytic, numeric, indices, { rtol = 1e-2, atolFactor = 1e-3, atol } = {}) {
  let scale = 0;
  for (const v of analytic) scale = Math.max(scale, Math.abs(v));
  for (const v of numeric) scale = Math.max(scale, Math.abs(v));
  const absTol = atol ?? atolFactor * scale;
  let worst = null;
  let worstRel = 0;
  let failures = 0;
  indices.forEach((i, k) => {
    const a = analytic[i];
    const n = numeric[k];
    const diff = Math.abs(a - n);
    const big = Math.max(Math.abs(a), Math.abs(n));
    const ratio = diff / (absTol + rtol * big) || 0;
    if (!(ratio <= 1)) failures++;
    worstRel = Math.max(worstRel, diff / Math.max(big, absTol) || 0);
    if (!worst || !(ratio <= worst.ratio)) worst = { index: i, analytic: a, numeric: n, ratio };
  });
  return { ok: failures === 0, failures, checked: indices.length, scale, atol: absTol, rtol, worst, worstRel };
}

function describeComparison(label, c, shape) {
  const w = c.worst;
  return (
    `${label}: ${c.failures}/${c.checked} entries outside |a−n| ≤ ${c.atol.toExponential(2)} + ${c.rtol}·max(|a|,|n|); ` +
    `worst at ${unravel(w.index, shape)}: analytic ${w.analytic}, numeric ${w.numeric} ` +
    `(${w.ratio.toFixed(2)}× the tolerance), gradient scale ${c.scale.toExponential(2)}`
  );
}

/** Throws an AssertionError naming the worst entry when any compared entry is out of tolerance. */
export function assertGradientsClose(analytic, numeric, indices, opts = {}, label = 'gradient', shape) {
  const c = compareGradients(analytic, numeric, indices, opts);
  assert(Number.isFinite(c.scale), `${label}: non-finite gradient`);
  if (!opts.allowZero) assert(c.scale > 0, `${label}: analytic and numeric gradients are all zero; the check proves nothing`);
  if (!c.ok) assert.fail(describeComparison(label, c, shape));
  return c;
}

/**
 * Central differences of `loss` w.r.t. arr[indices] compared with `analytic`, asserting agreement.
 * `steps` is [h, ...retries]: an entry that uses more than `opts.retryAbove` (default 0.5) of its
 * tolerance at h is re-estimated with every retry step and the closest estimate is kept. That is
 * for functions with kinks inside (ReLU after BN, where a perturbation can push a unit across
 * zero): the error of a kink crossing shrinks with the step, while a wrong analytic gradient
 * disagrees at every step. Retries do not change the tolerance.
 */
export function checkAgainstDifferences(analytic, loss, arr, indices, steps, opts = {}, label = 'gradient', shape) {
  const [h, ...retries] = steps;
  const retryAbove = opts.retryAbove ?? 0.5;
  const numeric = numericalGradient(loss, arr, indices, h);
  let retried = 0;
  if (retries.length) {
    const first = compareGradients(analytic, numeric, indices, opts);
    const ratio = (a, n) => Math.abs(a - n) / (first.atol + first.rtol * Math.max(Math.abs(a), Math.abs(n)));
    indices.forEach((i, k) => {
      if (ratio(analytic[i], numeric[k]) <= retryAbove) return;
      retried++;
      // All steps, not the first that passes: a step that still straddles the kink can land just
      // inside the tolerance by luck.
      for (const step of retries) {
        const [n] = numericalGradient(loss, arr, [i], step);
        if (ratio(analytic[i], n) < ratio(analytic[i], numeric[k])) numeric[k] = n;
      }
    });
    opts = { ...opts, atol: first.atol };
  }
  return { ...assertGradientsClose(analytic, numeric, indices, opts, label, shape), retried };
}

/**
 * Gradient check of a LayerProbe: the input and every parameter (or those in `params`) against
 * central differences of L = Σ forward(x)·R. Returns one comparison per checked tensor.
 *
 * Options: training (forward mode, default true), seed (for R and the sampled entries), h (step),
 * retrySteps (see checkAgainstDifferences), rtol, atolFactor, exhaustiveUpTo (check every entry of
 * tensors at most this large), sampleSize (entries checked in larger tensors), params (names to
 * check; default all parameters).
 */
export function checkLayerGradients(probe, x, shape, opts = {}) {
  const {
    training = true,
    seed = 12345,
    h = 1e-2,
    retrySteps = [],
    exhaustiveUpTo = 400,
    sampleSize = 240,
    params,
    label = 'layer',
  } = opts;
  const steps = [h, ...retrySteps];
  const rng = makeRng(seed);
  const input = Float32Array.from(x);
  const first = probe.forward(input, shape, training);
  const r = randomNormal(first.data.length, rng);
  const loss0 = weightedSum(first.data, r);
  const dx = probe.backward(r);
  assert.equal(dx.length, input.length, `${label}: dL/dx has the wrong length`);
  const state = probe.state();
  const loss = () => weightedSum(probe.forward(input, shape, training).data, r);

  // Finite differences are meaningless if the same input can give a different output.
  assert.equal(loss(), loss0, `${label}: forward is not deterministic`);

  const pick = (n) => sampleIndices(n, n <= exhaustiveUpTo ? n : sampleSize, rng);
  const results = [];
  const inputIdx = pick(input.length);
  results.push({
    name: 'input',
    ...checkAgainstDifferences(dx, loss, input, inputIdx, steps, opts, `${label} dL/dinput`, shape),
  });

  for (const entry of state) {
    if (entry.kind !== 'parameter' || (params && !params.includes(entry.name))) continue;
    const value = Float32Array.from(entry.value);
    const idx = pick(value.length);
    const lossP = () => {
      probe.setValue(entry.name, value);
      return loss();
    };
    try {
      results.push({
        name: entry.name,
        ...checkAgainstDifferences(entry.grad, lossP, value, idx, steps, opts, `${label} dL/d${entry.name}`, entry.shape),
      });
    } finally {
      probe.setValue(entry.name, entry.value);
    }
  }
  if (params) {
    const seen = new Set(results.map((res) => res.name));
    for (const name of params) assert(seen.has(name), `${label}: no parameter '${name}' to check`);
  }
  return results;
}

// ---------------------------------------------------------------------------------------------
// Float64 references (PyTorch semantics, NCHW row-major). Independent of the engine: they only
// read their Float32Array arguments.

/** Output size along one axis of a convolution or pooling window. */
const outSize = (size, kernel, stride, padding) => Math.floor((size + 2 * padding - kernel) / stride) + 1;

/**
 * Walks a convolution's terms for the references below: for each output element (k its NCHW index,
 * oc its channel) start(k, oc), then term(k, xi, wi) for each input element xi of its window inside
 * the image and the weight element wi it meets.
 */
function convTerms([n, c, h, w], [o, , kh, kw], stride, padding, start, term) {
  const oh = outSize(h, kh, stride, padding);
  const ow = outSize(w, kw, stride, padding);
  for (let b = 0; b < n; b++)
    for (let oc = 0; oc < o; oc++)
      for (let y = 0; y < oh; y++)
        for (let xo = 0; xo < ow; xo++) {
          const k = ((b * o + oc) * oh + y) * ow + xo;
          start(k, oc);
          for (let ic = 0; ic < c; ic++)
            for (let i = 0; i < kh; i++) {
              const iy = y * stride - padding + i;
              if (iy < 0 || iy >= h) continue;
              for (let j = 0; j < kw; j++) {
                const ix = xo * stride - padding + j;
                if (ix < 0 || ix >= w) continue;
                term(k, ((b * c + ic) * h + iy) * w + ix, ((oc * c + ic) * kh + i) * kw + j);
              }
            }
        }
}

/** Returns { data, shape, magnitude } where magnitude[i] = Σ|terms| of output i (its conditioning). */
export function conv2dRef(x, xShape, weight, wShape, bias, stride, padding) {
  const [n, c, h, w] = xShape;
  const [o, ci, kh, kw] = wShape;
  assert.equal(ci, c, 'conv2dRef: channel mismatch');
  const shape = [n, o, outSize(h, kh, stride, padding), outSize(w, kw, stride, padding)];
  const data = new Float64Array(n * o * shape[2] * shape[3]);
  const magnitude = new Float64Array(data.length);
  const start = (k, oc) => {
    data[k] = bias ? bias[oc] : 0;
    magnitude[k] = Math.abs(data[k]);
  };
  const term = (k, xi, wi) => {
    const t = weight[wi] * x[xi];
    data[k] += t;
    magnitude[k] += Math.abs(t);
  };
  convTerms(xShape, wShape, stride, padding, start, term);
  return { data, shape, magnitude };
}

/** Gradients of conv2dRef's output against dy: { dx, dw, db } in PyTorch layouts. */
export function conv2dBackwardRef(x, xShape, weight, wShape, dy, stride, padding) {
  const dx = new Float64Array(x.length);
  const dw = new Float64Array(weight.length);
  const db = new Float64Array(wShape[0]);
  let g = 0; // dy of the output element being walked
  const start = (k, oc) => {
    g = dy[k];
    db[oc] += g;
  };
  const term = (k, xi, wi) => {
    dw[wi] += g * x[xi];
    dx[xi] += g * weight[wi];
  };
  convTerms(xShape, wShape, stride, padding, start, term);
  return { dx, dw, db };
}

/** Max pooling with implicit −∞ padding, as PyTorch pads max pooling. */
export function maxPool2dRef(x, [n, c, h, w], kernel, stride, padding) {
  const oh = outSize(h, kernel, stride, padding);
  const ow = outSize(w, kernel, stride, padding);
  const data = new Float64Array(n * c * oh * ow);
  for (let p = 0; p < n * c; p++)
    for (let y = 0; y < oh; y++)
      for (let xo = 0; xo < ow; xo++) {
        let m = -Infinity;
        for (let i = 0; i < kernel; i++)
          for (let j = 0; j < kernel; j++) {
            const iy = y * stride - padding + i;
            const ix = xo * stride - padding + j;
            if (iy >= 0 && iy < h && ix >= 0 && ix < w) m = Math.max(m, x[(p * h + iy) * w + ix]);
          }
        data[(p * oh + y) * ow + xo] = m;
      }
  return { data, shape: [n, c, oh, ow] };
}

/** y = x·Wᵀ + b. */
export function linearRef(x, [n, f], weight, outFeatures, bias) {
  const data = new Float64Array(n * outFeatures);
  for (let r = 0; r < n; r++)
    for (let o = 0; o < outFeatures; o++) {
      let s = bias ? bias[o] : 0;
      for (let i = 0; i < f; i++) s += x[r * f + i] * weight[o * f + i];
      data[r * outFeatures + o] = s;
    }
  return { data, shape: [n, outFeatures] };
}

/** Per-channel mean and biased/unbiased variance over (N, H, W). */
export function channelStats(x, [n, c, h, w]) {
  const count = n * h * w;
  const mean = new Float64Array(c);
  const varBiased = new Float64Array(c);
  const varUnbiased = new Float64Array(c);
  for (let ch = 0; ch < c; ch++) {
    let s = 0;
    for (let b = 0; b < n; b++) for (let p = 0; p < h * w; p++) s += x[(b * c + ch) * h * w + p];
    const m = s / count;
    let q = 0;
    for (let b = 0; b < n; b++) for (let p = 0; p < h * w; p++) q += (x[(b * c + ch) * h * w + p] - m) ** 2;
    mean[ch] = m;
    varBiased[ch] = q / count;
    varUnbiased[ch] = q / (count - 1);
  }
  return { mean, varBiased, varUnbiased };
}

/** y = γ·(x − mean)/√(var + eps) + β per channel, with the given statistics. */
export function batchNormRef(x, [n, c, h, w], gamma, beta, mean, variance, eps = 1e-5) {
  const data = new Float64Array(x.length);
  for (let b = 0; b < n; b++)
    for (let ch = 0; ch < c; ch++) {
      const inv = 1 / Math.sqrt(variance[ch] + eps);
      for (let p = 0; p < h * w; p++) {
        const k = (b * c + ch) * h * w + p;
        data[k] = gamma[ch] * (x[k] - mean[ch]) * inv + beta[ch];
      }
    }
  return { data, shape: [n, c, h, w] };
}

/** Largest |got − want| / (|want| + floor) and where it occurs (0 where both are equal). */
export function maxRelativeError(got, want, floor = 0) {
  let worst = { index: -1, rel: 0, got: NaN, want: NaN };
  for (let i = 0; i < want.length; i++) {
    const diff = Math.abs(got[i] - want[i]);
    const rel = diff === 0 ? 0 : diff / (Math.abs(want[i]) + floor);
    if (!(rel <= worst.rel)) worst = { index: i, rel, got: got[i], want: want[i] };
  }
  return worst;
}

/** ‖a‖ (Euclidean). */
export function norm(a) {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * a[i];
  return Math.sqrt(s);
}

/** ‖a − b‖. */
export function distance(a, b) {
  let s = 0;
  for (let i = 0; i < b.length; i++) s += (a[i] - b[i]) ** 2;
  return Math.sqrt(s);
}

/** ‖a − b‖ / ‖b‖, or ‖a − b‖ where b is zero. */
export function relativeNorm(a, b) {
  const n = norm(b);
  return n === 0 ? distance(a, b) : distance(a, b) / n;
}
