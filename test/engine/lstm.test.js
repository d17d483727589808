// The word-level LSTM language model end to end: its parameter layout, its gradients (against
// central differences, with a carried hidden state and truncation at the window boundary), the loss
// on a case worked out by hand, gradient-norm clipping, and learning on real English text.
import { expect } from 'chai';
import path from 'node:path';

import { Model, Trainer } from '../../lib/index.js';
import { readWikiText, splitTextIntoWikiText, unigramPerplexity } from '../../lib/data/wikitext.js';
import { assertGradientsClose, compareGradients, makeRng } from '../helpers/gradcheck.js';
import { readShakespeare } from '../helpers/outside.js';
import { tempDirs } from '../helpers/temp-dirs.js';

const tmpDir = tempDirs('acc-lstm-');

// ---------------------------------------------------------------------------------------------
// State-dict plumbing. Tensors travel as little-endian float32 bytes; DataView makes the byte
// order explicit instead of trusting the host's.

function floats(entry) {
  const view = new DataView(entry.data.buffer, entry.data.byteOffset, entry.data.byteLength);
  const out = new Float32Array(entry.data.byteLength / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

function withValues(entry, values) {
  const data = new Uint8Array(values.length * 4);
  const view = new DataView(data.buffer);
  for (let i = 0; i < values.length; i++) view.setFloat32(4 * i, values[i], true);
  return { name: entry.name, dtype: entry.dtype, shape: [...entry.shape], data };
}

/** The state with one tensor's values replaced (the others shared, never mutated). */
function replaced(state, name, values) {
  return state.map((e) => (e.name === name ? withValues(e, values) : e));
}

function valuesByName(state) {
  return new Map(state.map((e) => [e.name, floats(e)]));
}

/** One SGD step with lr 1 and nothing else moves every weight by exactly −g (up to float32 rounding). */
function stepDifference(before, after) {
  const a = valuesByName(after);
  const g = new Map();
  for (const [name, b] of valuesByName(before)) {
    const p = a.get(name);
    const d = new Float64Array(b.length);
    for (let i = 0; i < b.length; i++) d[i] = b[i] - p[i];
    g.set(name, d);
  }
  return g;
}

function globalNorm(grads) {
  let s = 0;
  for (const g of grads.values()) for (const v of g) s += v * v;
  return Math.sqrt(s);
}

const plainSgd = { learningRate: 1, momentum: 0, weightDecay: 0, nesterov: false, clipNorm: 0 };

// ---------------------------------------------------------------------------------------------

describe('LSTM language model', function () {
  describe('parameters', function () {
    const expectedCount = (v, h, l) => v * h + v + l * (8 * h * h + 8 * h);

    for (const [vocabulary, count] of [
      [10, 6_776_910],
      [34_069, 28_949_319],
    ]) {
      it(`has 651·V + 6,770,400 = ${count.toLocaleString('en-US')} parameters for V = ${vocabulary} with the default 650 hidden, 2 layers`, async function () {
        const model = await Model.create({ architecture: 'lstm', classes: vocabulary });
        try {
          expect(651 * vocabulary + 6_770_400).to.equal(count);
          expect(model.parameterCount()).to.equal(count);
          expect(model.parameters()[0]).to.deep.equal({ name: 'encoder.weight', shape: [vocabulary, 650] });
        } finally {
          await model.dispose();
        }
      });
    }

    it('follows V·H + V + L·(8H² + 8H) with PyTorch names, order and shapes for a custom size (V 23, H 7, L 3)', async function () {
      const [v, h, l] = [23, 7, 3];
      const model = await Model.create({ architecture: 'lstm', classes: v, hidden: h, layers: l, dropout: 0 });
      try {
        const expected = [{ name: 'encoder.weight', shape: [v, h] }];
        for (let k = 0; k < l; k++)
          expected.push(
            { name: `rnn.weight_ih_l${k}`, shape: [4 * h, h] },
            { name: `rnn.weight_hh_l${k}`, shape: [4 * h, h] },
            { name: `rnn.bias_ih_l${k}`, shape: [4 * h] },
            { name: `rnn.bias_hh_l${k}`, shape: [4 * h] },
          );
        expected.push({ name: 'decoder.bias', shape: [v] });
        expect(model.parameters()).to.deep.equal(expected);
        expect(model.parameterCount()).to.equal(expectedCount(v, h, l)).and.to.equal(1528);
        // Tied weights: no separate decoder.weight in the state either.
        expect((await model.stateDict()).map((e) => e.name)).to.deep.equal(expected.map((e) => e.name));
      } finally {
        await model.dispose();
      }
    });
  });

  // -------------------------------------------------------------------------------------------

  describe('gradients against central differences (V 7, H 5, L 2, T 3, B 2, carried state)', function () {
    const V = 7, H = 5, L = 2, T = 3, B = 2;
    // Time-major (T, B). Word 6 is never an input, so its row of encoder.weight is reached only
    // through the tied decoder, while the other rows get both the embedding and decoder terms.
    const previous = { inputs: Int32Array.from([0, 3, 5, 1, 2, 4]), targets: Int32Array.from([5, 1, 2, 4, 6, 0]) };
    const checked = { inputs: Int32Array.from([4, 1, 2, 0, 5, 3]), targets: Int32Array.from([6, 2, 0, 6, 3, 1]) };
    const CHECKED = ['encoder.weight', ...[0, 1].flatMap((k) => ['weight_ih', 'weight_hh', 'bias_ih', 'bias_hh'].map((w) => `rnn.${w}_l${k}`)), 'decoder.bias'];
    const h = 1e-2;
    // float32 forward: the loss carries ~1e-7 noise, i.e. ~1e-5 on a difference quotient at this
    // step, plus O(h²) truncation; real errors (a missing term, a wrong gate) are O(1) relative.
    const tolerance = { rtol: 1e-2, atol: 2e-5 };

    let model, base, analytic, names, shapes;

    async function windowLoss(weights, { carriedFrom }) {
      // The preceding window runs with `carriedFrom`'s weights: the base weights reproduce the carried
      // state of the analytic step exactly (truncated BPTT treats it as a constant), the perturbed
      // weights let the perturbation act through the carried state as well.
      await model.resetState();
      await model.loadStateDict(carriedFrom === 'base' ? base : weights);
      await model.evaluate({ tokens: previous.inputs, targets: previous.targets, steps: T, batch: B });
      if (carriedFrom === 'base') await model.loadStateDict(weights);
      return (await model.evaluate({ tokens: checked.inputs, targets: checked.targets, steps: T, batch: B })).loss;
    }

    async function differences(name, carriedFrom) {
      const x = floats(base.find((e) => e.name === name));
      const numeric = new Float64Array(x.length);
      for (let i = 0; i < x.length; i++) {
        const up = Float32Array.from(x);
        const down = Float32Array.from(x);
        up[i] = x[i] + h;
        down[i] = x[i] - h;
        // The step actually taken after rounding to float32, not 2h.
        const taken = up[i] - down[i];
        const lossUp = await windowLoss(replaced(base, name, up), { carriedFrom });
        const lossDown = await windowLoss(replaced(base, name, down), { carriedFrom });
        numeric[i] = (lossUp - lossDown) / taken;
      }
      return numeric;
    }

    before(async function () {
      model = await Model.create({ architecture: 'lstm', classes: V, hidden: H, layers: L, dropout: 0, seed: 5, ...plainSgd });
      // Weights wider than the default initialisation, so the gates work away from their linear
      // range and every bias is non-zero (a dropped bias term would then show).
      const rng = makeRng(20240607);
      const init = await model.stateDict();
      base = init.map((e) => {
        const spread = e.name === 'encoder.weight' ? 1 : e.name.startsWith('rnn.weight') ? 0.7 : 0.5;
        return withValues(e, Float32Array.from(floats(e), () => rng.uniform(-spread, spread)));
      });
      names = base.map((e) => e.name);
      shapes = new Map(base.map((e) => [e.name, e.shape]));

      await model.loadStateDict(base);
      await model.resetState();
      await model.evaluate({ tokens: previous.inputs, targets: previous.targets, steps: T, batch: B });
      await model.trainStep({ tokens: checked.inputs, targets: checked.targets, steps: T, batch: B });
      analytic = stepDifference(base, await model.stateDict());
    });
    after(async () => model?.dispose());

    it("starts the checked window from a carried state that changes its loss and every tensor's gradient", async function () {
      await model.loadStateDict(base);
      await model.resetState();
      const fresh = (await model.evaluate({ tokens: checked.inputs, targets: checked.targets, steps: T, batch: B })).loss;
      const carried = await windowLoss(base, { carriedFrom: 'base' });
      // The loss is good to ~1e-7, so this difference is far from noise.
      expect(Math.abs(carried - fresh), `loss ${carried} after the preceding window vs ${fresh} from a zero state`).to.be.above(1e-4);
      // Gradients from a zero state must fail the tolerance used below by a wide margin: otherwise a
      // backward pass that ignored the carried h and c could pass the checks.
      await model.loadStateDict(base);
      await model.resetState();
      await model.trainStep({ tokens: checked.inputs, targets: checked.targets, steps: T, batch: B });
      const fromZero = stepDifference(base, await model.stateDict());
      for (const name of names) {
        const c = compareGradients(analytic.get(name), fromZero.get(name), Array.from(fromZero.get(name), (_, i) => i), tolerance);
        expect(c.worst.ratio, `${name}: gradient from a zero state vs from the carried state, in tolerances`).to.be.above(5);
      }
    });

    for (const name of CHECKED) {
      it(`${name}: every entry matches central differences with the carried state held fixed`, async function () {
        const numeric = await differences(name, 'base');
        const all = Array.from(numeric, (_, i) => i);
        assertGradientsClose(analytic.get(name), numeric, all, tolerance, name, shapes.get(name));
      });
    }

    it('encoder.weight: the row of a word that is only ever predicted gets the decoder term alone, and it is non-zero', function () {
      const g = analytic.get('encoder.weight');
      const row6 = Array.from(g.subarray(6 * H, 7 * H));
      expect(Math.max(...row6.map(Math.abs)), `row 6: ${row6}`).to.be.above(1e-3);
    });

    it('stops at the window boundary: perturbing the weights through the carried state changes the loss in ways the gradient ignores', async function () {
      // Full differences (the preceding window also sees the perturbed weights) include the path
      // through the carried state; truncated BPTT must not. The matches above already pin the
      // analytic gradient to the truncated differences; this shows the two really differ here, so
      // that a gradient leaking into the previous window could not have passed them.
      for (const name of ['rnn.weight_hh_l0', 'rnn.weight_ih_l1', 'encoder.weight']) {
        const full = await differences(name, 'perturbed');
        const c = compareGradients(analytic.get(name), full, Array.from(full, (_, i) => i), tolerance);
        const what = `${name} against full differences: ${c.failures}/${c.checked} entries off, worst analytic ${c.worst.analytic} vs full ${c.worst.numeric}`;
        expect(c.worst.ratio, what).to.be.above(10);
      }
    });

    it('covers every tensor of the state', function () {
      expect(CHECKED).to.deep.equal(names);
    });
  });

  // -------------------------------------------------------------------------------------------

  describe('loss and update on a hand-checkable case', function () {
    it('with every weight zero but decoder.bias = b, the loss is the cross-entropy of softmax(b) whatever the state, and b moves by the mean of softmax(b) − onehot', async function () {
      const V = 5, H = 3, T = 2, B = 3;
      const b = [0.5, -1, 2, 0, 0.25];
      // Dropout on: with a zero decoder weight it cannot reach the logits either.
      const model = await Model.create({ architecture: 'lstm', classes: V, hidden: H, layers: 2, dropout: 0.3, seed: 9, ...plainSgd });
      try {
        const inputs = Int32Array.from([0, 1, 2, 3, 4, 0]);
        const targets = Int32Array.from([2, 0, 4, 1, 2, 3]);
        // Leave a non-zero carried state behind with the random initial weights.
        await model.trainStep({ tokens: Int32Array.from([1, 2, 3, 4, 0, 1]), targets: Int32Array.from([2, 3, 4, 0, 1, 2]), steps: T, batch: B });
        const zeros = (await model.stateDict()).map((e) =>
          withValues(e, e.name === 'decoder.bias' ? Float32Array.from(b) : new Float32Array(e.data.byteLength / 4)),
        );
        await model.loadStateDict(zeros);

        const logZ = Math.log(b.reduce((s, x) => s + Math.exp(x), 0));
        const expectedLoss = Array.from(targets).reduce((s, t) => s + logZ - b[t], 0) / targets.length;
        const argmax = b.indexOf(Math.max(...b));
        const expectedCorrect = Array.from(targets).filter((t) => t === argmax).length;

        const evaluated = await model.evaluate({ tokens: inputs, targets, steps: T, batch: B });
        expect(evaluated.loss).to.be.closeTo(expectedLoss, 1e-6);
        expect(evaluated.correct).to.equal(expectedCorrect);
        expect(evaluated.samples).to.equal(T * B);

        const trained = await model.trainStep({ tokens: inputs, targets, steps: T, batch: B });
        expect(trained.loss).to.be.closeTo(expectedLoss, 1e-6);
        const moved = stepDifference(zeros, await model.stateDict()).get('decoder.bias');
        for (let j = 0; j < V; j++) {
          const p = Math.exp(b[j] - logZ);
          const expected = Array.from(targets).reduce((s, t) => s + p - (t === j ? 1 : 0), 0) / targets.length;
          expect(moved[j], `decoder.bias[${j}]`).to.be.closeTo(expected, 1e-6);
        }
      } finally {
        await model.dispose();
      }
    });
  });

  // -------------------------------------------------------------------------------------------

  describe('gradient-norm clipping', function () {
    const V = 11, H = 6, T = 4, B = 3;
    const rng = makeRng(77);
    const inputs = Int32Array.from({ length: T * B }, () => rng.int(V));
    const targets = Int32Array.from({ length: T * B }, () => rng.int(V));

    async function updateWithClip(clip) {
      const model = await Model.create({ architecture: 'lstm', classes: V, hidden: H, layers: 2, dropout: 0, seed: 31, ...plainSgd, clipNorm: clip });
      try {
        const before = await model.stateDict();
        const r = await model.trainStep({ tokens: inputs, targets, steps: T, batch: B });
        return { loss: r.loss, update: stepDifference(before, await model.stateDict()) };
      } finally {
        await model.dispose();
      }
    }

    it('scales the whole update by c/‖g‖ when ‖g‖ > c, and leaves it alone when ‖g‖ ≤ c', async function () {
      const free = await updateWithClip(0);
      const norm = globalNorm(free.update);
      expect(norm).to.be.above(0.05);

      const c = 0.3 * norm;
      const clipped = await updateWithClip(c);
      expect(clipped.loss).to.equal(free.loss);
      expect(globalNorm(clipped.update)).to.be.closeTo(c, 1e-4 * c);
      const scale = c / norm;
      for (const [name, g] of free.update) {
        const u = clipped.update.get(name);
        for (let i = 0; i < g.length; i++) expect(u[i], `${name}[${i}]`).to.be.closeTo(scale * g[i], 1e-6 + 1e-4 * Math.abs(scale * g[i]));
      }

      const loose = await updateWithClip(2 * norm);
      for (const [name, g] of free.update) {
        const u = loose.update.get(name);
        for (let i = 0; i < g.length; i++) expect(u[i], `${name}[${i}]`).to.equal(g[i]);
      }
    });
  });

  // -------------------------------------------------------------------------------------------

  describe('learning English (tinyshakespeare)', function () {
    it('brings validation perplexity well below the unigram baseline in 3 short epochs', async function () {
      const text = readShakespeare();
      const lines = text.split(/\r\n|\r|\n/);
      if (lines.at(-1) === '') lines.pop();
      // The 90/5/5 split's validation and test lines, but only the first 35% of its training lines,
      // to fit the time budget of two cores. The shortened text goes through splitTextIntoWikiText
      // itself, so the <unk> replacement is decided on the training text actually used.
      const trainEnd = Math.round(lines.length * 0.9);
      const validEnd = Math.round(lines.length * 0.95);
      const kept = Math.round(trainEnd * 0.35);
      const shortened = [...lines.slice(0, kept), ...lines.slice(trainEnd)];
      const f0 = kept / shortened.length;
      const f1 = (validEnd - trainEnd) / shortened.length;
      const dir = tmpDir();
      splitTextIntoWikiText(shortened.join('\n') + '\n', dir, [f0, f1, 1 - f0 - f1]);

      const corpus = readWikiText(dir);
      expect(corpus.valid.length).to.be.above(10_000);
      const unigram = unigramPerplexity(corpus.train, corpus.valid, corpus.vocabulary.length);

      const trainer = await Trainer.create({
        model: 'lstm',
        dataset: 'wikitext2',
        dataDir: dir,
        hidden: 64,
        layers: 2,
        dropout: 0.2,
        bptt: 35,
        batchSize: 20,
        evalBatchSize: 10,
        epochs: 3,
        lr: 2.5,
        warmupEpochs: 0,
        progress: false,
      });
      let summary;
      try {
        summary = await trainer.fit();
      } finally {
        await trainer.dispose();
      }
      const perplexities = summary.epochs.map((e) => e.validPerplexity);
      const last = summary.epochs.at(-1);
      const message =
        `validation perplexity ${perplexities.map((p) => p.toFixed(1)).join(' → ')} (test ${last.testPerplexity.toFixed(1)}) ` +
        `vs unigram ${unigram.toFixed(1)}; V ${corpus.vocabulary.length}, ${corpus.train.length} training tokens`;
      this.test.title += ` (${message})`;
      expect(last.validPerplexity).to.be.closeTo(Math.exp(last.validLoss), 1e-9 * last.validPerplexity);
      expect(last.validPerplexity, message).to.be.below(0.6 * unigram);
      expect(last.testPerplexity, message).to.be.below(0.7 * unigram);
      expect(perplexities[2], message).to.be.below(perplexities[0]);
    });
  });
});
