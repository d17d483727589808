// bf16 compute on the CPU (--precision bf16), against outside references: the rounding of what the
// products take against the reference conversion (itself checked against PyTorch's in
// comm-dtype.test.js); convolutions and products against float64 over the rounded inputs (fp32's
// accuracy) and over the exact ones (within bf16's bound, and beyond fp32's somewhere); the same on a
// CPU without bf16 instructions (oneDNN limited to AVX2); a training step beside PyTorch 1.13's CPU
// autocast from the same weights and batch; fp32 master weights; fp32 gradients for the exchange.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { expect } from 'chai';
import { Model, buildInfo, readSafetensors, writeSafetensors } from '../../lib/index.js';
import { LayerProbe, roundTo } from '../../lib/testing.js';
import { conv2dBackwardRef, conv2dRef, linearRef, makeRng, randomNormal } from '../helpers/gradcheck.js';
import { PYTHON, bytesOf, requireTorch } from '../helpers/outside.js';
import { ROOT, ORACLES } from '../helpers/paths.js';

/** bf16's unit roundoff: 8 significant bits. */
const U = 2 ** -8;
const bf16 = (a) => roundTo(Float32Array.from(a), 'bf16');
const abs = (a) => Float64Array.from(a, Math.abs);

/** The largest |got − want| / scale over the entries, and where. */
function worst(got, want, scale) {
  let at = 0, value = 0;
  for (let i = 0; i < got.length; i++) {
    const e = Math.abs(got[i] - want[i]) / (scale[i] || 1);
    if (e > value) [at, value] = [i, e];
  }
  return { at, value };
}

describe('bf16 compute (--precision bf16)', function () {
  this.timeout(120000);

  it('a product takes its inputs rounded to nearest even as the reference conversion rounds them (normal values; oneDNN flushes subnormals to 0)', function () {
    const rng = makeRng(3);
    const values = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -(1 + 2 ** -8), 2.5, 1e-30, 3e38, 1.1754943508222875e-38];
    for (let i = 0; i < 3000; i++) values.push(rng.normal() * 10 ** ((i % 40) - 20));
    const x = Float32Array.from(values);
    const conv = new LayerProbe('conv2d', { inChannels: 1, outChannels: 1, kernel: 1, bias: false, precision: 'bf16' });
    conv.setValue('weight', Float32Array.of(1));
    const linear = new LayerProbe('linear', { inFeatures: 1, outFeatures: 1, precision: 'bf16' });
    linear.setValue('weight', Float32Array.of(1));
    linear.setValue('bias', Float32Array.of(0));
    const expected = Array.from(bf16(x));
    expect(Array.from(conv.forward(x, [1, 1, 1, x.length]).data), 'convolution').to.deep.equal(expected);
    expect(Array.from(linear.forward(x, [x.length, 1]).data), 'matrix product').to.deep.equal(expected);
    expect(Array.from(conv.forward(Float32Array.of(1e-40, -3e-39), [1, 1, 1, 2]).data).map(Math.abs)).to.deep.equal([0, 0]);
  });

  /** A conv2d probe in bf16 on random data, and its float64 references over rounded and exact inputs. */
  function convCase(seed) {
    const xShape = [2, 5, 7, 6], wShape = [4, 5, 3, 3];
    const rng = makeRng(seed);
    const x = randomNormal(xShape.reduce((a, b) => a * b), rng), w = randomNormal(wShape.reduce((a, b) => a * b), rng, 0.3);
    const b = randomNormal(4, rng, 0.5);
    const probe = new LayerProbe('conv2d', { inChannels: 5, outChannels: 4, kernel: 3, stride: 2, padding: 1, bias: true, precision: 'bf16' });
    probe.setValue('weight', w);
    probe.setValue('bias', b);
    const y = probe.forward(x, xShape);
    const dy = randomNormal(y.data.length, rng);
    const dx = probe.backward(dy);
    const grads = Object.fromEntries(probe.state().filter((e) => e.kind === 'parameter').map((e) => [e.name, e.grad]));
    return { x, w, b, dy, xShape, wShape, y: y.data, dx, dw: grads.weight, db: grads.bias };
  }

  it('conv2d forward and backward equal float64 over bf16-rounded inputs to fp32 accuracy, and stay within bf16 bounds of float64 over the exact ones', function () {
    const c = convCase(7);
    const [rx, rw, rdy] = [bf16(c.x), bf16(c.w), bf16(c.dy)];
    // Over the rounded inputs: the products are exact in fp32; only the sums' order differs.
    const fwd = conv2dRef(rx, c.xShape, rw, c.wShape, c.b, 2, 1);
    expect(worst(c.y, fwd.data, fwd.magnitude).value, 'forward').to.be.below(1e-5);
    const bwd = conv2dBackwardRef(rx, c.xShape, rw, c.wShape, rdy, 2, 1);
    const mag = conv2dBackwardRef(abs(rx), c.xShape, abs(rw), c.wShape, abs(rdy), 2, 1);
    expect(worst(c.dx, bwd.dx, mag.dx).value, 'input gradient').to.be.below(1e-5);
    expect(worst(c.dw, bwd.dw, mag.dw).value, 'weight gradient').to.be.below(1e-5);
    expect(worst(c.db, bwd.db, mag.db).value, 'bias gradient (fp32 sums of the exact dy)').to.be.below(1e-5);
    // Over the exact inputs: each product off by at most (1 + U)² − 1 of its magnitude.
    const bound = 2 * U + U * U + 1e-5;
    const exact = conv2dRef(c.x, c.xShape, c.w, c.wShape, c.b, 2, 1);
    const off = worst(c.y, exact.data, exact.magnitude).value;
    expect(off, 'forward against exact inputs').to.be.below(bound);
    expect(off, 'bf16 rounding shows (fp32 would stay below 1e-6)').to.be.above(1e-4);
    const exactBwd = conv2dBackwardRef(c.x, c.xShape, c.w, c.wShape, c.dy, 2, 1);
    const exactMag = conv2dBackwardRef(abs(c.x), c.xShape, abs(c.w), c.wShape, abs(c.dy), 2, 1);
    expect(worst(c.dx, exactBwd.dx, exactMag.dx).value).to.be.below(bound);
    expect(worst(c.dw, exactBwd.dw, exactMag.dw).value).to.be.below(bound);
  });

  it('linear forward and backward likewise (the products of the linear layers and the LSTM)', function () {
    const rng = makeRng(11);
    const [n, f, o] = [6, 40, 9];
    const x = randomNormal(n * f, rng), w = randomNormal(o * f, rng, 0.2), b = randomNormal(o, rng);
    const probe = new LayerProbe('linear', { inFeatures: f, outFeatures: o, precision: 'bf16' });
    probe.setValue('weight', w);
    probe.setValue('bias', b);
    const y = probe.forward(x, [n, f]).data;
    const ref = linearRef(bf16(x), [n, f], bf16(w), o, b);
    const mag = linearRef(abs(bf16(x)), [n, f], abs(bf16(w)), o, abs(b));
    expect(worst(y, ref.data, mag.data).value).to.be.below(1e-5);
    const exact = linearRef(x, [n, f], w, o, b);
    const off = worst(y, exact.data, mag.data).value;
    expect(off).to.be.below(2 * U + U * U + 1e-5).and.above(1e-4);
    // dx = dy·W and dW = dyᵀ·x over the rounded factors.
    const dy = randomNormal(n * o, rng);
    const dx = probe.backward(dy);
    const dw = probe.state().find((e) => e.name === 'weight').grad;
    const [rdy, rx, rw] = [bf16(dy), bf16(x), bf16(w)];
    for (let r = 0; r < n; r++)
      for (let i = 0; i < f; i++) {
        let s = 0, m = 0;
        for (let k = 0; k < o; k++) (s += rdy[r * o + k] * rw[k * f + i]), (m += Math.abs(rdy[r * o + k] * rw[k * f + i]));
        expect(Math.abs(dx[r * f + i] - s), `dx[${r}, ${i}]`).to.be.at.most(1e-5 * m);
      }
    for (let k = 0; k < o; k++)
      for (let i = 0; i < f; i++) {
        let s = 0, m = 0;
        for (let r = 0; r < n; r++) (s += rdy[r * o + k] * rx[r * f + i]), (m += Math.abs(rdy[r * o + k] * rx[r * f + i]));
        expect(Math.abs(dw[k * f + i] - s), `dW[${k}, ${i}]`).to.be.at.most(1e-5 * m);
      }
  });

  it('on a CPU without bf16 instructions (oneDNN held to AVX2) rounds the same inputs, subnormals to zero as bf16 instructions read them, and says so', function () {
    const script = `
      import { LayerProbe } from ${JSON.stringify(path.join(ROOT, 'lib/testing.js'))};
      import { buildInfo } from ${JSON.stringify(path.join(ROOT, 'lib/index.js'))};
      const x = Float32Array.from(JSON.parse(process.argv[1]));
      const conv = new LayerProbe('conv2d', { inChannels: 1, outChannels: 1, kernel: 1, bias: false, precision: 'bf16' });
      conv.setValue('weight', Float32Array.of(1));
      const linear = new LayerProbe('linear', { inFeatures: 1, outFeatures: 1, precision: 'bf16' });
      linear.setValue('weight', Float32Array.of(1));
      linear.setValue('bias', Float32Array.of(0));
      console.log(JSON.stringify({ cpu: buildInfo().cpu, conv: Array.from(conv.forward(x, [1, 1, 1, x.length]).data), linear: Array.from(linear.forward(x, [x.length, 1]).data) }));`;
    const values = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -2.5, 0.1, 12345.678, 1e-40, -3e-39];
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script, JSON.stringify(values)], { encoding: 'utf8', env: { ...process.env, DNNL_MAX_CPU_ISA: 'AVX2' } });
    expect(r.status, r.stderr).to.equal(0);
    const out = JSON.parse(r.stdout);
    expect(out.cpu).to.include({ isa: 'avx2', bf16: 'rounded' });
    const expected = [...Array.from(bf16(values.slice(0, -2))), 0, 0];
    expect(out.conv.map((v, i) => (i < values.length - 2 ? v : Math.abs(v)))).to.deep.equal(expected);
    expect(out.linear.map((v, i) => (i < values.length - 2 ? v : Math.abs(v)))).to.deep.equal(expected);
  });

  describe('a training step beside PyTorch (Debian python3-torch 1.13)', function () {
    let tmp;
    before(function () {
      requireTorch();
      tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-bf16-'));
    });
    after(() => tmp && fs.rmSync(tmp, { recursive: true, force: true }));

    /** One step of `architecture` in fp32 and in bf16 from the same weights and batch, and PyTorch's gradients of it. */
    async function stepBeside(architecture, options, batch, inputsOf, oracle) {
      const engine = {};
      for (const precision of ['fp32', 'bf16']) {
        const model = await Model.create({ ...options, architecture, seed: 4, dropout: 0, keepGradients: true, threads: 2, precision });
        if (precision === 'fp32') writeSafetensors(path.join(tmp, `${architecture}-in.safetensors`), [...(await model.stateDict()).filter((e) => e.name !== 'decoder.weight'), ...inputsOf()]);
        const { loss } = await model.trainStep(batch);
        engine[precision] = { loss, gradients: await model.gradients() };
        await model.dispose();
      }
      const out = path.join(tmp, `${architecture}-out.safetensors`);
      const r = spawnSync(PYTHON, [path.join(ORACLES, 'torch_gradients.py'), ...oracle, '--autocast', `${path.join(tmp, `${architecture}-in.safetensors`)}:${out}`],
        { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '2' }, timeout: 240000 });
      expect(r.status, r.stderr).to.equal(0);
      const torch = readSafetensors(out).tensors;
      const f64 = (name) => new Float64Array(torch.get(name).data.slice().buffer);
      const names = [...engine.fp32.gradients.keys()];
      const ours = (precision) => (k) => engine[precision].gradients.get(k).data;
      const theirs = (kind) => (k) => f64(`${kind}.${k}`);
      // Distances between two sets of gradients, over the whole model, relative to float64's norm.
      const squares = (a, b) => names.reduce((s, k) => {
        const [x, y] = [a(k), b ? b(k) : null];
        return s + x.reduce((t, v, i) => t + (v - (y ? y[i] : 0)) ** 2, 0);
      }, 0);
      const scale = Math.sqrt(squares(theirs('f64')));
      const apart = (a, b) => Math.sqrt(squares(a, b)) / scale;
      return {
        loss: { ours: engine.bf16.loss, autocast: f64('loss.bf16')[0], exact: f64('loss')[0] },
        autocast: apart(theirs('bf16'), theirs('f64')),
        ours: apart(ours('bf16'), theirs('f64')),
        oursFromAutocast: apart(ours('bf16'), theirs('bf16')),
        fp32: apart(ours('fp32'), theirs('f64')),
      };
    }

    for (const architecture of ['resnet18', 'vgg19bn'])
      it(`${architecture} (width 0.25): the loss and every gradient as close to float64 as PyTorch's autocast, and to autocast as autocast is to float64`, async function () {
        const rng = makeRng(5);
        const images = randomNormal(8 * 3 * 32 * 32, rng);
        const labels = Int32Array.from({ length: 8 }, () => rng.int(10));
        const inputs = () => [
          { name: 'input.images', dtype: 'F32', shape: [8, 3, 32, 32], data: bytesOf(images) },
          { name: 'input.labels', dtype: 'I32', shape: [8], data: bytesOf(labels) },
        ];
        const r = await stepBeside(architecture, { width: 0.25, classes: 10 }, { images, labels }, inputs, ['--model', architecture, '--width', '0.25']);
        // The loss: ours and autocast's each within a few bf16 roundings of float64's.
        expect(Math.abs(r.loss.ours - r.loss.exact) / r.loss.exact).to.be.below(8 * U);
        expect(Math.abs(r.loss.autocast - r.loss.exact) / r.loss.exact).to.be.below(8 * U);
        // bf16's gradients at initialisation are far from float64's (batch norm's backward cancels
        // most of what reaches it); ours no farther than autocast's, and fp32 steps stay fp32.
        expect(r.fp32, 'fp32 steps stay fp32').to.be.below(r.autocast / 20);
        expect(r.ours, `ours ${r.ours.toExponential(2)} against autocast's ${r.autocast.toExponential(2)} from float64`).to.be.below(2 * r.autocast);
        expect(r.oursFromAutocast, 'ours from autocast').to.be.below(3 * r.autocast);
      });

    it("the LSTM (2 layers of 16, a 6 × 8 window): bf16 gates and decoder no farther from float64 than autocast, which keeps PyTorch's LSTM in fp32", async function () {
      const rng = makeRng(6);
      const [steps, batch, vocabulary, hidden] = [6, 8, 50, 16];
      const tokens = Int32Array.from({ length: steps * batch }, () => rng.int(vocabulary));
      const targets = Int32Array.from({ length: steps * batch }, () => rng.int(vocabulary));
      const zeros = new Float32Array(2 * batch * hidden);
      const inputs = () => [
        { name: 'input.tokens', dtype: 'I32', shape: [steps, batch], data: bytesOf(tokens) },
        { name: 'input.targets', dtype: 'I32', shape: [steps, batch], data: bytesOf(targets) },
        { name: 'input.h', dtype: 'F32', shape: [2, batch, hidden], data: bytesOf(zeros) },
        { name: 'input.c', dtype: 'F32', shape: [2, batch, hidden], data: bytesOf(zeros) },
      ];
      const r = await stepBeside('lstm', { classes: vocabulary, hidden, layers: 2, clipNorm: 0 }, { tokens, targets, steps, batch }, inputs,
        ['--model', 'lstm', '--vocabulary', String(vocabulary), '--hidden', String(hidden), '--layers', '2']);
      expect(Math.abs(r.loss.ours - r.loss.exact) / r.loss.exact).to.be.below(8 * U);
      expect(r.fp32, 'fp32 steps stay fp32').to.be.below(1e-5);
      // Ours rounds the gates' products too, autocast only the decoder's (and its logits, to bf16).
      expect(r.ours, 'bf16 rounding shows').to.be.above(10 * r.fp32);
      expect(r.ours, `ours ${r.ours.toExponential(2)} against autocast's ${r.autocast.toExponential(2)} from float64`).to.be.below(2 * r.autocast);
    });
  });

  it("rounds a weight for a step's products once and keeps that copy only for the step: a second step equals the same step taken afresh from the first one's state, bit for bit", async function () {
    const options = { architecture: 'resnet18', width: 0.125, seed: 4, precision: 'bf16', learningRate: 0.5, threads: 2 };
    const rng = makeRng(10);
    const batches = [0, 1].map(() => ({ images: randomNormal(4 * 3 * 32 * 32, rng), labels: Int32Array.of(1, 2, 3, 4) }));
    const [both, fresh] = [await Model.create(options), await Model.create(options)];
    try {
      for (const b of batches) await both.trainStep(b);
      await fresh.trainStep(batches[0]);
      const again = await Model.create(options);
      try {
        await again.loadStateDict(await fresh.stateDict(true));
        const loss = (await again.trainStep(batches[1])).loss;
        const [a, b] = [await both.stateDict(true), await again.stateDict(true)];
        expect(a.map((t) => t.name)).to.deep.equal(b.map((t) => t.name));
        for (let i = 0; i < a.length; i++) expect(Buffer.from(a[i].data).equals(Buffer.from(b[i].data)), a[i].name).to.equal(true);
        expect(loss).to.be.above(0);
      } finally {
        await again.dispose();
      }
    } finally {
      await both.dispose();
      await fresh.dispose();
    }
  });

  it('keeps fp32 master weights: a step too small to move a bf16 weight moves the fp32 one', async function () {
    const model = await Model.create({ architecture: 'resnet18', width: 0.125, seed: 2, precision: 'bf16', learningRate: 1e-6, momentum: 0, weightDecay: 0, threads: 2 });
    const before = new Map((await model.stateDict()).map((t) => [t.name, new Float32Array(t.data.slice().buffer)]));
    const rng = makeRng(8);
    await model.trainStep({ images: randomNormal(4 * 3 * 32 * 32, rng), labels: Int32Array.of(1, 2, 3, 4) });
    const after = new Map((await model.stateDict()).map((t) => [t.name, new Float32Array(t.data.slice().buffer)]));
    const w0 = before.get('layer1.0.conv1.weight'), w1 = after.get('layer1.0.conv1.weight');
    let moved = 0, belowBf16 = 0;
    for (let i = 0; i < w0.length; i++) {
      if (w0[i] === w1[i]) continue;
      moved++;
      // bf16 has 2⁻⁸ of a weight's size between neighbours: these updates are far below it.
      if (Math.abs(w1[i] - w0[i]) < U * Math.abs(w0[i]) / 16) belowBf16++;
    }
    expect(moved).to.be.above(w0.length / 2);
    expect(belowBf16).to.be.above(moved / 2);
    await model.dispose();
  });

  it('hands the exchange fp32 gradients, as fp32 training does (not bf16 values)', async function () {
    const model = await Model.create({ architecture: 'resnet18', width: 0.125, seed: 2, precision: 'bf16', keepGradients: true, threads: 2 });
    const rng = makeRng(9);
    await model.trainStep({ images: randomNormal(4 * 3 * 32 * 32, rng), labels: Int32Array.of(1, 2, 3, 4) });
    const g = (await model.gradients()).get('layer2.0.conv1.weight').data;
    const representable = g.filter((v, i) => roundTo(g.subarray(i, i + 1), 'bf16')[0] === v).length;
    expect(representable / g.length, 'gradients that happen to be bf16 values').to.be.below(0.05);
    expect(buildInfo().cpu.bf16).to.be.oneOf(['native', 'rounded']);
    await model.dispose();
  });
});
