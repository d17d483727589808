// Training on the caller's data: a step on in-memory tensors is the Batcher's step, bit for bit on the
// CPU; forward in both modes; the local gradients a step keeps (against central differences); the
// LSTM's logits and carried state; VGG's dropout option; strict loading; argument validation.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { Model, Batcher } from '../../lib/index.js';
import { writeSafetensors } from '../../lib/engine/safetensors.js';
import { assertGradientsClose } from '../helpers/gradcheck.js';
import { tinyImageSet } from '../helpers/images.js';

const bytesOf = (t) => Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
const floats = (e) => new Float32Array(e.data.slice().buffer);
const sameState = (a, b) => a.length === b.length && a.every((e, i) => e.name === b[i].name && bytesOf(e).equals(bytesOf(b[i])));
const withValues = (e, values) => ({ ...e, data: new Uint8Array(values.buffer.slice(0)) });

async function rejects(promise) {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  expect.fail('expected a rejection');
}

describe('training on caller data', function () {
  this.timeout(300000);

  it('a step on caller tensors equals, bit for bit, the step through a Batcher that yields them', async function () {
    const data = tinyImageSet(8, 10, 3);
    const options = { batchSize: 4, shuffle: false, augment: false, mean: [0.49, 0.48, 0.45], std: [0.25, 0.24, 0.26] };
    const opts = { architecture: 'resnet18', classes: 10, seed: 4, learningRate: 0.05 };
    const viaBatcher = await Model.create(opts);
    const viaTensors = await Model.create(opts);
    try {
      const batcher = new Batcher(data, options);
      const source = new Batcher(data, options); // the same batches, read out as tensors
      batcher.startEpoch(0);
      source.startEpoch(0);
      for (let step = 0; step < 2; step++) {
        const batch = await source.next();
        const a = await viaBatcher.trainStep(batcher);
        const b = await viaTensors.trainStep({ images: batch.images, labels: batch.labels });
        expect(b.loss).to.equal(a.loss);
        expect(b.correct).to.equal(a.correct);
        expect(b.samples).to.equal(4);
        expect(b.floatsSent).to.equal(a.floatsSent);
      }
      expect(sameState(await viaBatcher.stateDict(true), await viaTensors.stateDict(true))).to.equal(true);
    } finally {
      await viaBatcher.dispose();
      await viaTensors.dispose();
    }
  });

  it('forward in training mode differs from evaluation mode for a batch-norm model; evaluation equals predict', async function () {
    const model = await Model.create({ architecture: 'resnet18', classes: 10, seed: 2 });
    try {
      const images = new Float32Array(3 * 3 * 32 * 32).map((_, i) => Math.sin(i * 0.37));
      const predicted = await model.predict(images, 3);
      const evaluated = await model.forward(images);
      expect(Array.from(evaluated)).to.deep.equal(Array.from(predicted));
      const trained = await model.forward(images, { train: true });
      expect(trained.length).to.equal(30);
      expect(Array.from(trained)).to.not.deep.equal(Array.from(evaluated));
    } finally {
      await model.dispose();
    }
  });

  it("VGG's classifier dropout is an option: 0 makes training-mode forward deterministic", async function () {
    const images = new Float32Array(2 * 3 * 32 * 32).map((_, i) => Math.cos(i * 0.11));
    // Frozen batch norm: the only difference left between the modes is dropout.
    const off = await Model.create({ architecture: 'vgg19bn', classes: 10, seed: 1, dropout: 0, frozenBatchNorm: true });
    const on = await Model.create({ architecture: 'vgg19bn', classes: 10, seed: 1, frozenBatchNorm: true });
    try {
      expect(Array.from(await off.forward(images, { train: true }))).to.deep.equal(Array.from(await off.forward(images)));
      expect(Array.from(await on.forward(images, { train: true }))).to.not.deep.equal(Array.from(await on.forward(images)));
      // The dropout layers stay in the classifier: the state_dict names are VGG's either way.
      expect(off.parameters().map((p) => p.name)).to.deep.equal(on.parameters().map((p) => p.name));
    } finally {
      await off.dispose();
      await on.dispose();
    }
    const err = await rejects(Model.create({ architecture: 'vgg19bn', dropout: 1 }));
    expect(err.code).to.equal('ERR_USAGE');
    expect(err.message).to.match(/dropout/);
  });

  describe('the language model on caller windows (V 6, H 8, one layer, no dropout)', function () {
    const V = 6, T = 3, B = 2;
    const tokens = Int32Array.from([0, 3, 5, 1, 2, 4]);
    const targets = Int32Array.from([5, 1, 2, 4, 0, 3]);
    let model;
    before(async () => {
      model = await Model.create({ architecture: 'lstm', classes: V, hidden: 8, layers: 1, dropout: 0, seed: 5, keepGradients: true, weightDecay: 0, clipNorm: 0 });
    });
    after(async () => model?.dispose());

    it('keeps local gradients that equal central differences of the window loss', async function () {
      const base = await model.stateDict();
      await model.resetState();
      const step = await model.trainStep({ tokens, targets, steps: T, batch: B });
      expect(step.samples).to.equal(T * B);
      const grads = await model.gradients();
      expect([...grads.keys()]).to.deep.equal(model.parameters().map((p) => p.name));
      const loss = async (state) => {
        await model.loadStateDict(state);
        await model.resetState();
        return (await model.evaluate({ tokens, targets, steps: T, batch: B })).loss;
      };
      const h = 1e-2;
      for (const name of ['encoder.weight', 'rnn.weight_ih_l0', 'rnn.weight_hh_l0', 'rnn.bias_hh_l0', 'decoder.bias']) {
        const entry = base.find((e) => e.name === name);
        const x = floats(entry);
        const indices = [0, 5, 13, x.length - 1].filter((i) => i < x.length);
        const numeric = [];
        for (const i of indices) {
          const up = Float32Array.from(x), down = Float32Array.from(x);
          up[i] += h;
          down[i] -= h;
          const lu = await loss(base.map((e) => (e.name === name ? withValues(e, up) : e)));
          const ld = await loss(base.map((e) => (e.name === name ? withValues(e, down) : e)));
          numeric.push((lu - ld) / (up[i] - down[i]));
        }
        assertGradientsClose(grads.get(name).data, Float64Array.from(numeric), indices, { rtol: 2e-2, atol: 5e-5, allowZero: true }, name);
      }
      await model.loadStateDict(base);
    });

    it('returns logits per position and gets and sets the carried state', async function () {
      await model.resetState();
      expect(await model.hiddenState()).to.equal(null);
      const logits = await model.forward(tokens, { steps: T, batch: B });
      expect(logits.length).to.equal(T * B * V);
      const state = await model.hiddenState();
      expect(state.batch).to.equal(B);
      expect(state.h).to.have.length(1);
      expect(state.h[0].length).to.equal(B * 8);
      // The loss of a window equals the cross-entropy of forward's logits from the same state.
      const next = Int32Array.from([2, 2, 1, 0, 4, 5]);
      const again = await model.forward(next, { steps: T, batch: B });
      await model.setHiddenState(state);
      const { loss } = await model.evaluate({ tokens: next, targets, steps: T, batch: B });
      let sum = 0;
      for (let r = 0; r < T * B; r++) {
        const row = Array.from(again.subarray(r * V, (r + 1) * V));
        const max = Math.max(...row);
        const lse = max + Math.log(row.reduce((s, v) => s + Math.exp(v - max), 0));
        sum += lse - row[targets[r]];
      }
      expect(loss).to.be.closeTo(sum / (T * B), 1e-5);
      const err = await rejects(model.setHiddenState({ batch: B, h: [new Float32Array(3)], c: [new Float32Array(3)] }));
      expect(err.code).to.equal('ERR_USAGE');
      expect(err.message).to.match(/h\[0\]/);
    });

    it('refuses an untied decoder.weight and accepts a tied one', async function () {
      const state = await model.stateDict();
      const encoder = state.find((e) => e.name === 'encoder.weight');
      await model.loadStateDict([...state, { ...encoder, name: 'decoder.weight' }]); // PyTorch lists the tied weight twice
      const untied = withValues(encoder, floats(encoder).map((v) => v + 1));
      const err = await rejects(model.loadStateDict([...state, { ...untied, name: 'decoder.weight' }]));
      expect(err.message).to.match(/'decoder\.weight' differs from 'encoder\.weight'/);
    });
  });

  describe('one step for every model: micro-batches and clipping', function () {
    // At learning rate 0 the weights stay put, so each batch's gradient can be taken alone and compared.
    // Within float32 rounding of the hand-computed value: |got − want| ≤ 1e-6 · max(1, |want|) everywhere.
    const close = (got, want, what) => {
      let worst = -1;
      for (let i = 0; i < want.length; i++)
        if (Math.abs(got[i] - want[i]) > 1e-6 * Math.max(1, Math.abs(want[i])) && worst < 0) worst = i;
      expect(worst, worst < 0 ? what : `${what}[${worst}]: ${got[worst]} vs ${want[worst]}`).to.equal(-1);
    };
    const norm = (grads) => Math.sqrt([...grads.values()].reduce((sum, g) => sum + g.data.reduce((s, v) => s + v * v, 0), 0));
    const images = (seed) => {
      const data = tinyImageSet(4, 10, seed);
      return { images: Float32Array.from(data.images, (v) => v / 255 - 0.5), labels: data.labels };
    };
    const windows = [0, 1].map((k) => ({
      tokens: Int32Array.from({ length: 12 }, (_, i) => (i * 5 + k * 7) % 9),
      targets: Int32Array.from({ length: 12 }, (_, i) => (i * 2 + k) % 9),
      steps: 4,
      batch: 3,
    }));
    const cases = [
      { name: 'resnet18, two batches of images', options: { architecture: 'resnet18', classes: 10, seed: 3 }, batches: [images(1), images(2)] },
      { name: 'the lstm, two consecutive windows (the state carried through)', options: { architecture: 'lstm', classes: 9, hidden: 6, layers: 2, dropout: 0, seed: 3 }, batches: windows },
    ];
    for (const c of cases)
      it(`${c.name}: a step over micro-batches keeps the mean of their gradients, each taken alone`, async function () {
        const model = await Model.create({ ...c.options, learningRate: 0, keepGradients: true, clipNorm: 0 });
        try {
          const alone = [];
          for (const batch of c.batches) {
            await model.trainStep(batch);
            alone.push(await model.gradients());
          }
          if (c.options.architecture === 'lstm') await model.resetState();
          const step = await model.trainStep(c.batches);
          expect(step.samples).to.equal(c.batches.reduce((n, b) => n + (b.labels ?? b.targets).length, 0));
          for (const [name, g] of await model.gradients())
            close(g.data, g.data.map((_, i) => (alone[0].get(name).data[i] + alone[1].get(name).data[i]) / 2), name);
        } finally {
          await model.dispose();
        }
      });

    it('resnet18: --clip scales the local gradients to the clip norm, by clip / (norm + 1e-6), as clip_grad_norm_', async function () {
      const batch = images(4);
      const free = await Model.create({ architecture: 'resnet18', classes: 10, seed: 3, learningRate: 0, keepGradients: true, clipNorm: 0 });
      let clipped;
      try {
        await free.trainStep(batch);
        const g = await free.gradients();
        const n = norm(g);
        clipped = await Model.create({ architecture: 'resnet18', classes: 10, seed: 3, learningRate: 0, keepGradients: true, clipNorm: n / 2 });
        await clipped.trainStep(batch);
        const scale = n / 2 / (n + 1e-6);
        for (const [name, h] of await clipped.gradients()) close(h.data, g.get(name).data.map((v) => v * scale), name);
      } finally {
        await free.dispose();
        await clipped?.dispose();
      }
    });
  });

  describe('strict loading', function () {
    let model, state;
    before(async () => {
      model = await Model.create({ architecture: 'resnet18', classes: 10, seed: 7 });
      state = await model.stateDict();
    });
    after(async () => model?.dispose());

    it('names unknown entries', async function () {
      const extra = { ...state[1], name: 'head.weight' };
      const err = await rejects(model.loadStateDict([...state, extra]));
      expect(err.message).to.match(/unknown entry 'head\.weight'/);
    });

    it('names missing entries', async function () {
      const err = await rejects(model.loadStateDict(state.filter((e) => e.name !== 'linear.bias' && e.name !== 'bn1.running_mean')));
      expect(err.message).to.include("'bn1.running_mean'").and.include("'linear.bias'");
    });

    it('names unknown entries of a safetensors file', async function () {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-caller-'));
      try {
        const file = path.join(dir, 'w.safetensors');
        writeSafetensors(file, [...state, { ...state[1], name: 'fc.bias' }]);
        const err = await rejects(model.load(file));
        expect(err.code).to.equal('ERR_CHECKPOINT');
        expect(err.message).to.include("'fc.bias'");
      } finally {
        fs.rmSync(dir, { recursive: true, force: true });
      }
    });

    it('casts float64 tensors to float32 with a note', async function () {
      const weight = state.find((e) => e.name === 'linear.weight');
      const values = floats(weight).map((v) => v * 0.5);
      const f64 = { ...weight, dtype: 'F64', data: new Uint8Array(Float64Array.from(values).buffer) };
      const warned = [];
      const onWarning = (w) => warned.push(w.message);
      process.on('warning', onWarning);
      let notes;
      try {
        notes = await model.loadStateDict(state.map((e) => (e.name === 'linear.weight' ? f64 : e)));
        await new Promise((r) => setImmediate(r));
      } finally {
        process.off('warning', onWarning);
      }
      expect(notes).to.have.length(1);
      expect(notes[0]).to.match(/float64.*'linear\.weight'/);
      expect(warned.some((m) => m.includes('linear.weight'))).to.equal(true);
      const loaded = (await model.stateDict()).find((e) => e.name === 'linear.weight');
      expect(Array.from(floats(loaded))).to.deep.equal(Array.from(values));
      await model.loadStateDict(state);
    });
  });

  describe('validation before native work', function () {
    let model;
    before(async () => {
      model = await Model.create({ architecture: 'resnet18', classes: 10, seed: 7 });
    });
    after(async () => model?.dispose());
    const images = new Float32Array(2 * 3 * 32 * 32);

    const cases = [
      ['images of the wrong dtype', () => ({ images: new Float64Array(2 * 3072), labels: [0, 1] }), /images must be a Float32Array/],
      ['images of the wrong length', () => ({ images: new Float32Array(3072), labels: [0, 1] }), /images hold 3072 floats, not 2 images/],
      ['a label out of range', () => ({ images, labels: Int32Array.from([0, 10]) }), /labels\[1\] is 10, outside the classes \[0, 10\)/],
      ['a negative label', () => ({ images, labels: [-1, 0] }), /labels\[0\] is -1/],
      ['a fractional label', () => ({ images, labels: [0, 1.5] }), /labels\[1\] is 1\.5, not an integer/],
      ['labels of the wrong dtype', () => ({ images, labels: new Float32Array([0, 1]) }), /labels must be an Int32Array or an array of integers/],
      ['a bad height', () => ({ images, labels: [0, 1], height: 0 }), /height must be a positive integer/],
      ['a token window for an image model', () => ({ tokens: [0], targets: [0], steps: 1, batch: 1 }), /takes images \(\{ images, labels \}\), not token windows/],
      ['an empty list of micro-batches', () => [], /an empty list of batches/],
    ];
    for (const [what, make, message] of cases)
      it(`trainStep refuses ${what}`, async function () {
        const err = await rejects(model.trainStep(make()));
        expect(err.code).to.equal('ERR_USAGE');
        expect(err.message).to.match(message);
      });

    it('forward and gradients name their problem', async function () {
      let err = await rejects(model.forward(new Float32Array(100)));
      expect(err.message).to.match(/forward: images hold 100 floats/);
      err = await rejects(model.forward(images, { train: 'yes' }));
      expect(err.message).to.match(/train must be a boolean/);
      err = await rejects(model.gradients());
      expect(err.message).to.match(/keepGradients/);
    });

    it('the language model refuses tokens outside the vocabulary and windows of the wrong size', async function () {
      const lm = await Model.create({ architecture: 'lstm', classes: 5, hidden: 4, layers: 1 });
      try {
        let err = await rejects(lm.trainStep({ tokens: [0, 1, 7, 2], targets: [1, 2, 3, 4], steps: 2, batch: 2 }));
        expect(err.message).to.match(/tokens\[2\] is 7, outside the vocabulary \[0, 5\)/);
        err = await rejects(lm.trainStep({ tokens: [0, 1, 2], targets: [1, 2, 3], steps: 2, batch: 2 }));
        expect(err.message).to.match(/tokens hold 3 ids, not steps × batch = 4/);
        err = await rejects(lm.trainStep({ tokens: Int32Array.from([0, 1]), targets: Int32Array.from([1, 9]), steps: 2, batch: 1 }));
        expect(err.message).to.match(/targets\[1\] is 9/);
        err = await rejects(lm.trainStep({ images, labels: [0, 1] }));
        expect(err.message).to.match(/token windows/);
      } finally {
        await lm.dispose();
      }
    });
  });
});
