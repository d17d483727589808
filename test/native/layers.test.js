// The other layers (LayerProbe): ReLU, pooling, flatten, linear, dropout, the residual block and the
// cross-entropy loss, forward against references and gradients against central differences.
import { expect } from 'chai';
import { LayerProbe, crossEntropy } from '../../lib/testing.js';
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
  maxPool2dRef,
  linearRef,
  channelStats,
  batchNormRef,
} from '../helpers/gradcheck.js';
import { expectClose, layerSuite, numel, record, recordForward, stateOf, thrown } from '../helpers/layer-checks.js';

layerSuite('layers (LayerProbe)', function () {
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
      recordForward('linear forward vs float64', rel, out.data.length);
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

    it("draws the mask SplitMix64 gives from the first key of the layer's xoshiro256** stream (ops/dropout_mask.h), in BigInt", () => {
      const M = (1n << 64n) - 1n;
      const GOLDEN = 0x9e3779b97f4a7c15n;
      const finalise = (z) => {
        z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
        z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M;
        return z ^ (z >> 31n);
      };
      // SplitMix64's published first output from state 0.
      expect(finalise(GOLDEN)).to.equal(0xe220a8397b1dcdafn);
      // xoshiro256** seeded by SplitMix64 (state word k = finalise(seed + (k + 1)·golden)): its first
      // output is rotl(s1·5, 7)·9, the key of the first mask.
      const rotl = (x, k) => ((x << k) | (x >> (64n - k))) & M;
      const seed = 33n;
      const key = (rotl((finalise((seed + 2n * GOLDEN) & M) * 5n) & M, 7n) * 9n) & M;
      const keeps = (i) => Number(finalise((key + BigInt(i + 1) * GOLDEN) & M) >> 40n) * 2 ** -24 >= Math.fround(p);
      // Rows of features, as VGG's classifier and the LSTM drop them (the mask runs over the elements
      // in memory order).
      const rows = [21, 143];
      const { data } = new LayerProbe('dropout', { p, seed: Number(seed) }).forward(new Float32Array(numel(rows)).fill(1), rows, true);
      const want = Array.from(data, (_, i) => (keeps(i) ? scale : 0));
      expect(Array.from(data)).to.deep.equal(want);
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
        recordForward(`basicblock ${c.shortcut ? 'projection' : 'identity'} forward vs float64`, rel, data.length);
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
