// Convolution and batch normalisation (LayerProbe): forward against references, gradients against
// central differences, and their running statistics.
import { expect, assert } from 'chai';
import { LayerProbe } from '../../lib/testing.js';
import { makeRng, randomNormal, distinctValues, checkLayerGradients, conv2dRef, conv2dBackwardRef, channelStats, batchNormRef } from '../helpers/gradcheck.js';
import { expectClose, layerSuite, numel, record, recordForward, stateOf, thrown } from '../helpers/layer-checks.js';

layerSuite('layers (LayerProbe): convolution and batch norm', function () {
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
      recordForward('conv2d forward vs float64', rel, data.length);
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

    it('lets go of its input once backward has used it: a second backward needs a forward, and says so', () => {
      for (const [kind, options] of [['conv2d', { inChannels: 2, outChannels: 2, kernel: 3, padding: 1, seed: 1 }], ['batchnorm2d', { channels: 2 }], ['relu', {}], ['linear', { inFeatures: 50, outFeatures: 3, seed: 1 }]]) {
        const probe = new LayerProbe(kind, options);
        const shape = kind === 'linear' ? [1, 50] : [1, 2, 5, 5];
        const { data } = probe.forward(Float32Array.from({ length: 50 }, (_, i) => Math.sin(i)), shape);
        const dy = Float32Array.from(data, (_, i) => Math.cos(i));
        const first = probe.backward(dy);
        const err = thrown(() => probe.backward(dy));
        expect(err.code, kind).to.equal('ERR_INVALID_STATE');
        expect(err.message, kind).to.include('backward without a forward since the last backward');
        probe.forward(Float32Array.from({ length: 50 }, (_, i) => Math.sin(i)), shape);
        expect(Array.from(probe.backward(dy)), `${kind}: backward after a new forward`).to.deep.equal(Array.from(first));
      }
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
      recordForward('batchnorm2d forward vs float64', rel, data.length);
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

    describe('with its ReLU fused (relu: true), as the models build it', () => {
      // Batch norm then a ReLU module, the two layers PyTorch has: the reference, bit for bit.
      function unfused(x, xShape, dy, training, channels, params) {
        const bn = new LayerProbe('batchnorm2d', { channels });
        const relu = new LayerProbe('relu', {});
        params(bn);
        const out = relu.forward(bn.forward(x, xShape, training).data, xShape, training).data;
        const dx = bn.backward(relu.backward(dy));
        return { out, dx, state: bn.state() };
      }
      function fused(x, xShape, dy, training, channels, params) {
        const bn = new LayerProbe('batchnorm2d', { channels, relu: true });
        params(bn);
        const out = bn.forward(x, xShape, training).data;
        return { out, dx: bn.backward(dy), state: bn.state() };
      }
      const cases = [
        { name: '3 channels, training', xShape: shape, training: true, params: (p) => { p.setValue('weight', gamma); p.setValue('bias', beta); } },
        { name: '3 channels, running statistics', xShape: shape, training: false, params: (p) => {
          p.setValue('weight', gamma); p.setValue('bias', beta);
          p.setValue('running_mean', new Float32Array([2.5, -0.8, 0.3])); p.setValue('running_var', new Float32Array([3.5, 0.3, 1.6]));
        } },
        // Past the fused kernel's row on the stack (1024 channels): batch norm and ReLU run apart.
        { name: '1100 channels, training', xShape: [2, 1100, 2, 3], training: true, params: () => {} },
      ];
      for (const c of cases) {
        it(`forward and backward equal batch norm then ReLU bit for bit: ${c.name}`, () => {
          const x = c.xShape === shape ? input(11) : randomNormal(numel(c.xShape), 12);
          const dy = randomNormal(x.length, 13);
          const want = unfused(x, c.xShape, dy, c.training, c.xShape[1], c.params);
          const got = fused(x, c.xShape, dy, c.training, c.xShape[1], c.params);
          const zeros = want.out.filter((v) => v === 0).length;
          expect(zeros, 'the ReLU cuts some outputs and keeps others').to.be.within(0.2 * x.length, 0.8 * x.length);
          expect(Buffer.from(got.out.buffer).equals(Buffer.from(want.out.buffer)), 'forward').to.equal(true);
          expect(Buffer.from(got.dx.buffer).equals(Buffer.from(want.dx.buffer)), 'dx').to.equal(true);
          for (const name of ['weight', 'bias']) {
            const [g, w] = [got, want].map((r) => r.state.find((e) => e.name === name).grad);
            expect(Buffer.from(g.buffer).equals(Buffer.from(w.buffer)), `d${name}`).to.equal(true);
          }
        });
      }

      it('training forward is max(0, ·) of the float64 formula', () => {
        const x = input(14);
        const { out: data } = fused(x, shape, new Float32Array(x.length), true, 3, (p) => { p.setValue('weight', gamma); p.setValue('bias', beta); });
        const s = channelStats(x, shape);
        const ref = batchNormRef(x, shape, gamma, beta, s.mean, s.varBiased).data.map((v) => Math.max(0, v));
        expectClose(data, ref, (k) => Math.max(1, Math.abs(ref[k])), 1e-4, 'fused batch norm forward');
      });
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
});
