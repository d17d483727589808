import { expect, assert } from 'chai';
import os from 'node:os';

import { binding } from '../lib/native/binding.js';
import { LayerProbe, crossEntropy } from '../lib/testing.js';
import {
  makeRng,
  randomNormal,
  randomUniform,
  awayFromZero,
  distinctValues,
  weightedSum,
  numericalGradient,
  sampleIndices,
  assertGradientsClose,
  checkLayerGradients,
  conv2dRef,
  conv2dBackwardRef,
  maxPool2dRef,
  linearRef,
  channelStats,
  batchNormRef,
} from './helpers/gradcheck.js';

const numel = (shape) => shape.reduce((a, b) => a * b, 1);
const stateOf = (probe, name) => probe.state().find((e) => e.name === name);

// Worst relative error per layer, printed at the end when GRADCHECK_REPORT is set; useful when
// tuning tolerances or comparing oneDNN versions.
const report = new Map();
function record(layer, results) {
  for (const r of results) {
    const key = `${layer} ${r.name}`;
    const prev = report.get(key);
    if (!prev || r.worstRel > prev.worstRel)
      report.set(key, { worstRel: r.worstRel, worstRatio: r.worst.ratio, checked: r.checked, retried: r.retried ?? 0 });
  }
  return results;
}

/** Runs fn and returns what it threw, failing the test when nothing was thrown. */
function thrown(fn) {
  try {
    fn();
  } catch (err) {
    return err;
  }
  return assert.fail('expected an error to be thrown');
}

/**
 * Asserts |got[i] − want[i]| ≤ rtol·scale(i) everywhere, naming the worst entry on failure, and
 * returns the worst |got − want| / scale: the relative error on the scale that bounds it.
 */
function expectClose(got, want, scale, rtol, what) {
  expect(got.length, `${what}: length`).to.equal(want.length);
  let worst = { k: -1, rel: 0 };
  for (let k = 0; k < want.length; k++) {
    const d = Math.abs(got[k] - want[k]);
    const rel = d === 0 ? 0 : d / scale(k);
    if (!(rel <= worst.rel)) worst = { k, rel };
  }
  const k = worst.k;
  if (!(worst.rel <= rtol))
    assert.fail(`${what}: entry ${k} is ${got[k]}, reference ${want[k]}: |Δ| exceeds ${rtol} × ${scale(k).toExponential(3)}`);
  return worst.rel;
}

describe('layers (LayerProbe)', function () {
  // Finite differences run hundreds of forwards per tensor.
  this.timeout(20000);

  // Thousands of forwards on tiny tensors: with more than one OpenMP thread, each parallel region
  // costs more than the work, and on a loaded machine spinning threads made this file 10× slower.
  before(() => binding.setThreads(1));
  after(() => binding.setThreads(Number(process.env.OMP_NUM_THREADS) || os.availableParallelism()));

  after(() => {
    if (!process.env.GRADCHECK_REPORT) return;
    const rows = [...report].map(([k, v]) => ({
      check: k,
      'worst rel err': v.worstRel.toExponential(2),
      'worst/tol': v.worstRatio.toFixed(3),
      entries: v.checked,
      retried: v.retried ?? '',
    }));
    console.table(rows);
  });

  describe('conv2d', () => {
    const cases = [
      { x: [2, 3, 5, 6], out: 4, kernel: 3, stride: 1, padding: 1, bias: true },
      { x: [3, 2, 7, 5], out: 3, kernel: 3, stride: 2, padding: 0, bias: false },
      { x: [2, 4, 5, 5], out: 2, kernel: 1, stride: 1, padding: 0, bias: true },
      { x: [2, 3, 6, 7], out: 5, kernel: 1, stride: 2, padding: 1, bias: false },
      { x: [2, 3, 7, 6], out: 4, kernel: 3, stride: 2, padding: 1, bias: true },
      { x: [3, 5, 6, 5], out: 2, kernel: 3, stride: 1, padding: 0, bias: false },
    ];
    cases.forEach((c, i) => {
      const name = `k${c.kernel} s${c.stride} p${c.padding} ${c.bias ? 'bias' : 'no bias'}, input ${c.x.join('x')}`;
      it(`gradients w.r.t. input and parameters: ${name}`, () => {
        const probe = new LayerProbe('conv2d', {
          inChannels: c.x[1],
          outChannels: c.out,
          kernel: c.kernel,
          stride: c.stride,
          padding: c.padding,
          bias: c.bias,
          seed: 10 + i,
        });
        const x = randomNormal(numel(c.x), 100 + i);
        const res = record('conv2d', checkLayerGradients(probe, x, c.x, { seed: 200 + i, label: `conv2d ${name}` }));
        const names = res.map((r) => r.name);
        expect(names).to.deep.equal(c.bias ? ['input', 'weight', 'bias'] : ['input', 'weight']);
        const oh = Math.floor((c.x[2] + 2 * c.padding - c.kernel) / c.stride) + 1;
        const ow = Math.floor((c.x[3] + 2 * c.padding - c.kernel) / c.stride) + 1;
        expect(probe.forward(x, c.x).shape).to.deep.equal([c.x[0], c.out, oh, ow]);
      });
    });

    it('forward matches a float64 convolution (k3, stride 2, padding 1, bias, 7x6 input)', () => {
      const xShape = [2, 3, 7, 6];
      const wShape = [4, 3, 3, 3];
      const probe = new LayerProbe('conv2d', { inChannels: 3, outChannels: 4, kernel: 3, stride: 2, padding: 1, bias: true, seed: 3 });
      const x = randomNormal(numel(xShape), 31);
      const w = randomNormal(numel(wShape), 32, 0.3);
      const b = randomNormal(4, 33, 0.5);
      probe.setValue('weight', w);
      probe.setValue('bias', b);
      const { data, shape } = probe.forward(x, xShape);
      const ref = conv2dRef(x, xShape, w, wShape, b, 2, 1);
      expect(shape).to.deep.equal(ref.shape);
      // Relative to Σ|terms|: the attainable accuracy of a float32 dot product.
      const rel = expectClose(data, ref.data, (k) => ref.magnitude[k], 1e-4, 'conv2d forward');
      report.set('conv2d forward vs float64', { worstRel: rel, worstRatio: NaN, checked: data.length });
    });

    it('backward matches float64 dx, dW and db, with state() in PyTorch layout', () => {
      const xShape = [2, 3, 6, 5];
      const wShape = [4, 3, 3, 3];
      const probe = new LayerProbe('conv2d', { inChannels: 3, outChannels: 4, kernel: 3, stride: 2, padding: 1, bias: true, seed: 8 });
      const x = randomNormal(numel(xShape), 81);
      const out = probe.forward(x, xShape);
      const dy = randomNormal(out.data.length, 82);
      const dx = probe.backward(dy);
      const [w, b] = probe.state();
      const ref = conv2dBackwardRef(x, xShape, w.value, wShape, dy, 2, 1);
      // Checked together so that a failure says which of the three disagree.
      const verdicts = [
        ['db', b.grad, ref.db],
        ['dW', w.grad, ref.dw],
        ['dx', dx, ref.dx],
      ].map(([name, got, want]) => {
        let scale = 0;
        for (const v of want) scale = Math.max(scale, Math.abs(v));
        let worst = 0;
        for (let k = 0; k < want.length; k++) worst = Math.max(worst, Math.abs(got[k] - want[k]) / scale);
        return `${name} ${worst <= 1e-5 ? 'ok' : 'WRONG'} (max error ${worst.toExponential(2)} of max |ref|)`;
      });
      if (verdicts.some((v) => v.includes('WRONG'))) assert.fail(verdicts.join('; '));
    });

    it('reads its weight in PyTorch order (C_out, C_in, kH, kW)', () => {
      // A single non-zero tap makes the output a shifted copy of one input channel, so any
      // transposition of the weight shows up as the wrong channel or the wrong shift.
      const xShape = [1, 3, 5, 6];
      const probe = new LayerProbe('conv2d', { inChannels: 3, outChannels: 2, kernel: 3, stride: 1, padding: 1, bias: false, seed: 1 });
      const w = new Float32Array(2 * 3 * 3 * 3);
      const [o, ci, ki, kj] = [1, 2, 0, 2];
      w[((o * 3 + ci) * 3 + ki) * 3 + kj] = 1;
      probe.setValue('weight', w);
      expect(Array.from(stateOf(probe, 'weight').value)).to.deep.equal(Array.from(w));
      const x = distinctValues(numel(xShape), 5, 1);
      const { data } = probe.forward(x, xShape);
      const ref = conv2dRef(x, xShape, w, [2, 3, 3, 3], null, 1, 1);
      const bad = [];
      for (let k = 0; k < data.length; k++) if (data[k] !== ref.data[k]) bad.push(k);
      expect(bad, `outputs differing from y[0,1,i,j] = x[0,2,i−1,j+1] (first: ${bad[0]}: ${data[bad[0]]} vs ${ref.data[bad[0]]})`).to.be.empty;
    });

    it('rejects an input with the wrong channel count', () => {
      const probe = new LayerProbe('conv2d', { inChannels: 3, outChannels: 2, kernel: 3, stride: 1, padding: 1, seed: 1 });
      const err = thrown(() => probe.forward(new Float32Array(2 * 2 * 5 * 5), [2, 2, 5, 5]));
      expect(err).to.be.instanceOf(Error);
      expect(err.code).to.equal('ERR_INVALID_ARGUMENT');
      expect(err.message).to.include('(N, 3, H, W)');
      expect(err.message).to.include('(2, 2, 5, 5)');
    });

    it('refuses backward before any forward', () => {
      const probe = new LayerProbe('conv2d', { inChannels: 2, outChannels: 2, kernel: 3, seed: 1 });
      const err = thrown(() => probe.backward(new Float32Array(8)));
      expect(err.code).to.equal('ERR_INVALID_STATE');
    });
  });

  describe('batchnorm2d', () => {
    const shape = [2, 3, 5, 6];
    const gamma = new Float32Array([1.5, -0.7, 0.9]);
    const beta = new Float32Array([0.2, -0.1, 0.4]);
    // Per-channel offsets and scales so that normalisation does real work.
    function input(seed) {
      const rng = makeRng(seed);
      const x = randomNormal(numel(shape), rng);
      const offset = [3, -1, 0.5];
      const scale = [2, 0.5, 1.2];
      for (let k = 0; k < x.length; k++) {
        const ch = Math.floor(k / (shape[2] * shape[3])) % shape[1];
        x[k] = x[k] * scale[ch] + offset[ch];
      }
      return x;
    }
    function probeWith(params = true) {
      const probe = new LayerProbe('batchnorm2d', { channels: 3 });
      if (params) {
        probe.setValue('weight', gamma);
        probe.setValue('bias', beta);
      }
      return probe;
    }

    it('train-mode gradients w.r.t. input, weight and bias', () => {
      const res = record('batchnorm2d train', checkLayerGradients(probeWith(), input(1), shape, { seed: 2, label: 'batchnorm2d train' }));
      expect(res.map((r) => r.name)).to.deep.equal(['input', 'weight', 'bias']);
    });

    it('train-mode gradients with the default parameters (γ = 1, β = 0)', () => {
      record('batchnorm2d train default', checkLayerGradients(probeWith(false), input(3), [2, 3, 5, 6], { seed: 4, label: 'batchnorm2d default' }));
    });

    it('eval-mode gradients (running statistics are constants)', () => {
      const probe = probeWith();
      probe.setValue('running_mean', new Float32Array([2.5, -0.8, 0.3]));
      probe.setValue('running_var', new Float32Array([3.5, 0.3, 1.6]));
      record('batchnorm2d eval', checkLayerGradients(probe, input(5), shape, { seed: 6, training: false, label: 'batchnorm2d eval' }));
    });

    it('train-mode forward matches the float64 formula with the biased variance', () => {
      const x = input(7);
      const { data } = probeWith().forward(x, shape, true);
      const s = channelStats(x, shape);
      const ref = batchNormRef(x, shape, gamma, beta, s.mean, s.varBiased);
      const rel = expectClose(data, ref.data, (k) => Math.max(1, Math.abs(ref.data[k])), 1e-4, 'batchnorm2d forward');
      report.set('batchnorm2d forward vs float64', { worstRel: rel, worstRatio: NaN, checked: data.length });
    });

    it('updates running_mean and running_var by PyTorch’s rule (unbiased variance, momentum 0.1)', () => {
      const x = input(8);
      const probe = probeWith();
      const rm0 = new Float32Array([0.5, -0.25, 1]);
      const rv0 = new Float32Array([2, 0.5, 1.5]);
      probe.setValue('running_mean', rm0);
      probe.setValue('running_var', rv0);
      probe.forward(x, shape, true);
      const s = channelStats(x, shape);
      const rm = stateOf(probe, 'running_mean');
      const rv = stateOf(probe, 'running_var');
      expect(rm.kind).to.equal('buffer');
      expect(rv.kind).to.equal('buffer');
      for (let c = 0; c < 3; c++) {
        const wantMean = 0.9 * rm0[c] + 0.1 * s.mean[c];
        const wantVar = 0.9 * rv0[c] + 0.1 * s.varUnbiased[c];
        expect(rm.value[c], `running_mean[${c}]`).to.be.closeTo(wantMean, 1e-5 * Math.max(1, Math.abs(wantMean)));
        // The biased variance would be off by 0.1·var/(n−1) ≈ 2e-3·var here: far outside this bound.
        expect(rv.value[c], `running_var[${c}]`).to.be.closeTo(wantVar, 1e-5 * wantVar);
      }
    });

    it('eval mode normalises with the running statistics and leaves them unchanged', () => {
      const x = input(9);
      const probe = probeWith();
      probe.forward(input(10), shape, true); // one training step so the running stats are not the defaults
      const rm = stateOf(probe, 'running_mean').value;
      const rv = stateOf(probe, 'running_var').value;
      const { data } = probe.forward(x, shape, false);
      const ref = batchNormRef(x, shape, gamma, beta, rm, rv);
      expectClose(data, ref.data, (k) => Math.max(1, Math.abs(ref.data[k])), 1e-4, 'batchnorm2d eval forward');
      expect(Array.from(stateOf(probe, 'running_mean').value)).to.deep.equal(Array.from(rm));
      expect(Array.from(stateOf(probe, 'running_var').value)).to.deep.equal(Array.from(rv));
    });
  });

  describe('relu', () => {
    const shape = [3, 2, 5, 7];
    it('gradient w.r.t. the input (inputs kept ≥ 0.1 away from the kink)', () => {
      const probe = new LayerProbe('relu', {});
      record('relu', checkLayerGradients(probe, awayFromZero(numel(shape), 11, 0.1), shape, { seed: 12, label: 'relu' }));
    });

    it('forward and backward are exact', () => {
      const probe = new LayerProbe('relu', {});
      const x = awayFromZero(numel(shape), 13, 0.1);
      const dy = randomNormal(x.length, 14);
      const { data } = probe.forward(x, shape);
      const dx = probe.backward(dy);
      expect(Array.from(data)).to.deep.equal(Array.from(x, (v) => (v > 0 ? v : 0)));
      expect(Array.from(dx)).to.deep.equal(Array.from(x, (v, k) => (v > 0 ? dy[k] : 0)));
    });
  });

  describe('maxpool2d', () => {
    const cases = [
      { x: [2, 3, 6, 7], kernel: 2, stride: 2, padding: 0 },
      { x: [3, 2, 7, 5], kernel: 3, stride: 2, padding: 1 },
    ];
    cases.forEach((c, i) => {
      const name = `${c.kernel}x${c.kernel} stride ${c.stride} padding ${c.padding}, input ${c.x.join('x')}`;
      // Distinct values 0.05 apart and h = 0.01: the arg-max of every window is stable under ±h.
      it(`gradient w.r.t. the input: ${name}`, () => {
        const probe = new LayerProbe('maxpool2d', { kernel: c.kernel, stride: c.stride, padding: c.padding });
        const x = distinctValues(numel(c.x), 40 + i, 0.05);
        record(`maxpool2d ${c.kernel}x${c.kernel}`, checkLayerGradients(probe, x, c.x, { seed: 50 + i, label: `maxpool2d ${name}` }));
      });

      it(`forward matches a naive max (−∞ padding): ${name}`, () => {
        const probe = new LayerProbe('maxpool2d', { kernel: c.kernel, stride: c.stride, padding: c.padding });
        // All-negative values: zero padding instead of −∞ would show up on every border window.
        const x = distinctValues(numel(c.x), 60 + i, 0.05).map((v) => v - 10);
        const { data, shape } = probe.forward(x, c.x);
        const ref = maxPool2dRef(x, c.x, c.kernel, c.stride, c.padding);
        expect(shape).to.deep.equal(ref.shape);
        expect(Array.from(data)).to.deep.equal(Array.from(ref.data));
      });
    });
  });

  describe('globalavgpool', () => {
    const shape = [2, 3, 5, 6];
    it('gradient w.r.t. the input', () => {
      const probe = new LayerProbe('globalavgpool', {});
      record('globalavgpool', checkLayerGradients(probe, randomNormal(numel(shape), 70), shape, { seed: 71, label: 'globalavgpool' }));
    });

    it('forward is the mean over H and W', () => {
      const probe = new LayerProbe('globalavgpool', {});
      const x = randomNormal(numel(shape), 72);
      const out = probe.forward(x, shape);
      expect(out.shape).to.deep.equal([2, 3]);
      const hw = shape[2] * shape[3];
      const ref = Array.from({ length: 6 }, (_, p) => x.slice(p * hw, (p + 1) * hw).reduce((a, b) => a + b, 0) / hw);
      expectClose(out.data, ref, (k) => Math.max(1, Math.abs(ref[k])), 1e-6, 'globalavgpool forward');
    });
  });

  describe('flatten', () => {
    it('gradient w.r.t. the input', () => {
      const shape = [2, 3, 5, 6];
      const probe = new LayerProbe('flatten', {});
      record('flatten', checkLayerGradients(probe, randomNormal(numel(shape), 80), shape, { seed: 81, label: 'flatten' }));
    });

    // Channel-major flattening of NCHW row-major data leaves the bytes where they are.
    for (const shape of [
      [2, 3, 5, 6],
      [3, 4, 1, 1],
    ]) {
      it(`forward and backward keep PyTorch's channel-major order exactly (${shape.join('x')})`, () => {
        const probe = new LayerProbe('flatten', {});
        const x = randomNormal(numel(shape), 82);
        const out = probe.forward(x, shape);
        expect(out.shape).to.deep.equal([shape[0], shape[1] * shape[2] * shape[3]]);
        expect(Array.from(out.data)).to.deep.equal(Array.from(x));
        const dy = randomNormal(x.length, 83);
        expect(Array.from(probe.backward(dy))).to.deep.equal(Array.from(dy));
      });
    }
  });

  describe('linear', () => {
    it('gradients w.r.t. input, weight and bias', () => {
      const probe = new LayerProbe('linear', { inFeatures: 5, outFeatures: 4, seed: 90 });
      const res = record('linear', checkLayerGradients(probe, randomNormal(15, 91), [3, 5], { seed: 92, label: 'linear' }));
      expect(res.map((r) => r.name)).to.deep.equal(['input', 'weight', 'bias']);
    });

    it('forward is x·Wᵀ + b', () => {
      const probe = new LayerProbe('linear', { inFeatures: 6, outFeatures: 3, seed: 93 });
      const x = randomNormal(12, 94);
      const w = stateOf(probe, 'weight');
      const b = stateOf(probe, 'bias');
      expect(w.shape).to.deep.equal([3, 6]);
      expect(b.shape).to.deep.equal([3]);
      const out = probe.forward(x, [2, 6]);
      expect(out.shape).to.deep.equal([2, 3]);
      const ref = linearRef(x, [2, 6], w.value, 3, b.value);
      const rel = expectClose(out.data, ref.data, (k) => Math.max(1, Math.abs(ref.data[k])), 1e-5, 'linear forward');
      report.set('linear forward vs float64', { worstRel: rel, worstRatio: NaN, checked: out.data.length });
    });

    it('rejects an input with the wrong feature count', () => {
      const probe = new LayerProbe('linear', { inFeatures: 6, outFeatures: 3, seed: 1 });
      const err = thrown(() => probe.forward(new Float32Array(10), [2, 5]));
      expect(err.code).to.equal('ERR_INVALID_ARGUMENT');
      expect(err.message).to.include('(N, 6)');
    });
  });

  describe('dropout', () => {
    const shape = [2, 3, 5, 6];
    const p = 0.3;
    // The engine scales by 1/(1 − p) computed in float32.
    const scale = Math.fround(1 / Math.fround(1 - Math.fround(p)));

    it('backward applies the forward mask: dx = dy · mask / (1 − p) exactly', () => {
      const probe = new LayerProbe('dropout', { p, seed: 21 });
      const x = awayFromZero(numel(shape), 22, 0.1);
      const { data } = probe.forward(x, shape, true);
      const keep = Array.from(data, (v) => v !== 0);
      const kept = keep.filter(Boolean).length;
      expect(kept, 'some entries dropped').to.be.below(x.length);
      expect(kept, 'some entries kept').to.be.above(0);
      for (let k = 0; k < x.length; k++) if (keep[k]) expect(data[k], `y[${k}]`).to.equal(Math.fround(x[k] * scale));
      const dy = randomNormal(x.length, 23);
      const want = Array.from(dy, (g, k) => (keep[k] ? Math.fround(g * scale) : 0));
      expect(Array.from(probe.backward(dy))).to.deep.equal(want);
      // Backward must not redraw the mask.
      expect(Array.from(probe.backward(dy))).to.deep.equal(want);
    });

    it('drops about a fraction p, draws a fresh mask per forward, and is reproducible from the seed', () => {
      const big = [4, 5, 25, 40];
      const x = new Float32Array(numel(big)).fill(1);
      const a = new LayerProbe('dropout', { p, seed: 5 });
      const b = new LayerProbe('dropout', { p, seed: 5 });
      const m1 = a.forward(x, big).data;
      const m2 = a.forward(x, big).data;
      expect(Array.from(b.forward(x, big).data)).to.deep.equal(Array.from(m1));
      const dropped = m1.filter((v) => v === 0).length / m1.length;
      // 20 000 Bernoulli(0.3) draws: σ ≈ 0.0032.
      expect(dropped).to.be.closeTo(p, 0.015);
      expect(Array.from(m2)).to.not.deep.equal(Array.from(m1));
    });

    it('is the identity in eval mode, forward and backward', () => {
      const probe = new LayerProbe('dropout', { p, seed: 24 });
      const x = randomNormal(numel(shape), 25);
      const out = probe.forward(x, shape, false);
      expect(out.shape).to.deep.equal(shape);
      expect(Array.from(out.data)).to.deep.equal(Array.from(x));
      const dy = randomNormal(x.length, 26);
      expect(Array.from(probe.backward(dy))).to.deep.equal(Array.from(dy));
    });
  });

  describe('basicblock', () => {
    const blocks = [
      { name: 'identity shortcut', inPlanes: 3, planes: 3, stride: 1, x: [2, 3, 6, 5], out: [2, 3, 6, 5], shortcut: false },
      { name: 'projection shortcut, stride 2', inPlanes: 2, planes: 4, stride: 2, x: [2, 2, 7, 6], out: [2, 4, 4, 3], shortcut: true },
    ];
    blocks.forEach((c, i) => {
      it(`gradients w.r.t. input and every parameter: ${c.name}`, () => {
        const probe = new LayerProbe('basicblock', { inPlanes: c.inPlanes, planes: c.planes, stride: c.stride, seed: 30 + i });
        const names = probe.state().filter((e) => e.kind === 'parameter').map((e) => e.name);
        const expected = ['conv1.weight', 'bn1.weight', 'bn1.bias', 'conv2.weight', 'bn2.weight', 'bn2.bias'];
        if (c.shortcut) expected.push('shortcut.0.weight', 'shortcut.1.weight', 'shortcut.1.bias');
        expect(names).to.deep.equal(expected);
        // Non-trivial BN affine parameters so their gradients are exercised away from γ = 1, β = 0.
        const rng = makeRng(300 + i);
        for (const e of probe.state())
          if (e.kind === 'parameter' && /bn|shortcut\.1/.test(e.name))
            probe.setValue(e.name, e.name.endsWith('weight') ? randomUniform(c.planes, rng, 0.5, 1.5) : randomNormal(c.planes, rng, 0.3));
        const x = randomNormal(numel(c.x), 34 + i);
        expect(probe.forward(x, c.x).shape).to.deep.equal(c.out);
        const res = record(`basicblock ${c.shortcut ? 'projection' : 'identity'}`, checkLayerGradients(probe, x, c.x, {
          seed: 36 + i,
          // ReLUs after BN: a step can carry units across zero, and a weight step moves a whole
          // channel, so steps are smaller than for single layers and suspicious entries are
          // re-estimated (see checkAgainstDifferences).
          h: 3e-3,
          retrySteps: [1e-3],
          label: `basicblock ${c.name}`,
        }));
        expect(res.map((r) => r.name)).to.deep.equal(['input', ...expected]);
      });

      it(`forward matches a float64 composition of the reference layers: ${c.name}`, () => {
        const probe = new LayerProbe('basicblock', { inPlanes: c.inPlanes, planes: c.planes, stride: c.stride, seed: 40 + i });
        const rng = makeRng(400 + i);
        const values = {};
        for (const e of probe.state()) {
          if (e.kind !== 'parameter') continue;
          values[e.name] = /conv|shortcut\.0/.test(e.name)
            ? randomNormal(e.value.length, rng, 0.3)
            : e.name.endsWith('weight')
              ? randomUniform(e.value.length, rng, 0.5, 1.5)
              : randomNormal(e.value.length, rng, 0.3);
          probe.setValue(e.name, values[e.name]);
        }
        const x = randomNormal(numel(c.x), 44 + i);
        const { data, shape } = probe.forward(x, c.x);
        const P = c.planes;
        const bnTrain = (v, s, prefix) => {
          const st = channelStats(v, s);
          return batchNormRef(v, s, values[`${prefix}.weight`], values[`${prefix}.bias`], st.mean, st.varBiased).data;
        };
        const relu = (v) => v.map((t) => Math.max(t, 0));
        const c1 = conv2dRef(x, c.x, values['conv1.weight'], [P, c.inPlanes, 3, 3], null, c.stride, 1);
        const a1 = relu(bnTrain(c1.data, c1.shape, 'bn1'));
        const c2 = conv2dRef(a1, c1.shape, values['conv2.weight'], [P, P, 3, 3], null, 1, 1);
        const main = bnTrain(c2.data, c2.shape, 'bn2');
        let skip = Float64Array.from(x);
        if (c.shortcut) {
          const s0 = conv2dRef(x, c.x, values['shortcut.0.weight'], [P, c.inPlanes, 1, 1], null, c.stride, 0);
          skip = bnTrain(s0.data, s0.shape, 'shortcut.1');
        }
        const ref = relu(main.map((v, k) => v + skip[k]));
        expect(shape).to.deep.equal(c2.shape);
        // BN outputs are O(1); errors are relative to that scale.
        const rel = expectClose(data, ref, (k) => Math.max(1, Math.abs(ref[k])), 1e-4, `basicblock ${c.name} forward`);
        report.set(`basicblock ${c.shortcut ? 'projection' : 'identity'} forward vs float64`, { worstRel: rel, worstRatio: NaN, checked: data.length });
      });
    });
  });

  describe('crossEntropy', () => {
    it('hand-computed example: logits [1, 2, 3], label 2', () => {
      const r = crossEntropy(new Float32Array([1, 2, 3]), 1, 3, new Int32Array([2]));
      expect(r.loss).to.be.closeTo(Math.log(Math.E + Math.E ** 2 + Math.E ** 3) - 3, 1e-7);
      expect(r.loss).to.be.closeTo(0.40760596, 1e-7);
      expect(r.correct).to.equal(1);
      const z = Math.E + Math.E ** 2 + Math.E ** 3;
      expectClose(r.grad, [Math.E / z, Math.E ** 2 / z, Math.E ** 3 / z - 1], () => 1, 1e-7, 'crossEntropy grad');
    });

    it('is stable for large logits (shift invariance)', () => {
      const r = crossEntropy(new Float32Array([1001, 1002, 1003, -1000, -999, -998]), 2, 3, new Int32Array([2, 0]));
      expect(r.loss).to.be.closeTo((0.40760596 + 2.40760596) / 2, 1e-6);
      expect(r.correct).to.equal(1);
    });

    it('counts the rows whose arg-max is the label', () => {
      const logits = new Float32Array([1, 2, 3, 3, 1, 2, 0, 5, 1, 2, 2.5, 1]);
      const r = crossEntropy(logits, 4, 3, new Int32Array([2, 2, 1, 0]));
      expect(r.correct).to.equal(2);
    });

    it('loss matches float64 and its gradient matches finite differences', () => {
      const n = 3;
      const k = 5;
      const logits = randomNormal(n * k, 120, 2);
      const labels = new Int32Array([1, 4, 0]);
      const r = crossEntropy(logits, n, k, labels);
      let want = 0;
      for (let row = 0; row < n; row++) {
        const z = Array.from(logits.slice(row * k, (row + 1) * k));
        const m = Math.max(...z);
        want += m + Math.log(z.reduce((s, v) => s + Math.exp(v - m), 0)) - z[labels[row]];
      }
      // The engine forms z − max(z) in float32 before going to float64.
      expect(r.loss).to.be.closeTo(want / n, 1e-6 * Math.max(1, want / n));
      const x = Float32Array.from(logits);
      const idx = sampleIndices(x.length, x.length, 1);
      const num = numericalGradient(() => crossEntropy(x, n, k, labels).loss, x, idx, 1e-2);
      const c = assertGradientsClose(r.grad, num, idx, {}, 'crossEntropy dL/dlogits', [n, k]);
      record('crossEntropy', [{ name: 'logits', ...c }]);
      // Σ_j dL/dz_j = 0 per row: softmax sums to 1.
      for (let row = 0; row < n; row++) expect(weightedSum(r.grad.slice(row * k, (row + 1) * k), new Float32Array(k).fill(1))).to.be.closeTo(0, 1e-6);
    });

    it('rejects a label outside 0..K−1', () => {
      for (const bad of [3, 7, -1]) {
        const err = thrown(() => crossEntropy(new Float32Array([1, 2, 3, 4, 5, 6]), 2, 3, new Int32Array([0, bad])));
        expect(err, `label ${bad}`).to.be.instanceOf(Error);
        expect(err.code, `label ${bad}`).to.equal('ERR_INVALID_ARGUMENT');
        expect(err.message).to.include(String(bad));
      }
    });
  });
});
