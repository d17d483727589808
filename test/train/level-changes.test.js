// What a level change in training does to the compressor state (Model API): PowerSGD keeps its error memory
// and re-draws Q from the seed, a matrix sent dense holds no Q, TopK keeps its memory.
import { expect } from 'chai';
import { Batcher, Model } from '../../lib/index.js';
import { syntheticImages } from '../helpers/train-worker.js';
import { float32Of as floatsOf } from '../helpers/outside.js';
import { byName, firstDifference, sameBytes } from '../helpers/training-runs.js';

describe('Accordion in training', function () {
  describe('level changes in training (Model API)', function () {
    const compressionSeed = 1234;
    const images = syntheticImages(21, 48, 10);
    const modelOptions = { architecture: 'resnet18', classes: 10, seed: 3, learningRate: 0.01, compressionSeed };
    const batcherFor = () => {
      const b = new Batcher(images, { batchSize: 16, shuffle: true, augment: false, seed: 5, mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] });
      b.startEpoch(0);
      return b;
    };
    const models = [];
    const create = async (options) => {
      const m = await Model.create({ ...modelOptions, ...options });
      models.push(m);
      return m;
    };
    afterEach(async function () {
      for (const m of models.splice(0)) await m.dispose();
    });

    /** Floats one worker sends per step: PowerSGD sends (n + m)·r when that beats n·m, TopK 2·⌊K·numel⌋. */
    function floatsPerStep(params, levels, compressor) {
      return params.reduce((sum, p, i) => {
        const numel = p.shape.reduce((a, b) => a * b, 1);
        if (p.shape.length < 2) return sum + numel;
        if (compressor === 'topk') return sum + 2 * Math.max(1, Math.floor(levels[i] * numel));
        const rows = p.shape[0];
        const cols = numel / rows;
        const r = Math.min(rows, cols, levels[i]);
        return sum + ((rows + cols) * r < rows * cols ? (rows + cols) * r : numel);
      }, 0);
    }

    it('PowerSGD: a switch keeps the error memory and re-draws Q from the seed; the same levels again change nothing', async function () {
      const model = await create({ compressor: 'powersgd', level: 2 });
      const params = model.parameters();
      const batcher = batcherFor();
      for (let s = 0; s < 2; s++) expect((await model.trainStep(batcher)).floatsSent).to.equal(floatsPerStep(params, params.map(() => 2), 'powersgd'));
      const before = byName(await model.stateDict(true));

      // Every other matrix goes to rank 1; the rest stay at 2 (1-D entries are ignored).
      let m = 0;
      const switched = params.map((p) => p.shape.length > 1 && m++ % 2 === 0);
      const levels = params.map((p, i) => (p.shape.length < 2 ? 0 : switched[i] ? 1 : 2));
      await model.setLevels(levels.map((l, i) => (params[i].shape.length < 2 ? Number.NaN : l)));
      expect(Array.from(await model.levels())).to.deep.equal(levels);
      const afterState = await model.stateDict(true);
      const after = byName(afterState);
      expect(Array.from(new Float64Array(after.get('compressor.levels').data.slice().buffer))).to.deep.equal(levels);

      const freshLow = byName(await (await create({ compressor: 'powersgd', level: 1 })).stateDict(true));
      const freshHigh = byName(await (await create({ compressor: 'powersgd', level: 2 })).stateDict(true));
      let memories = 0;
      for (const [name, t] of before) {
        if (name === 'compressor.levels') continue;
        if (name.startsWith('compressor.q.')) continue;
        expect(sameBytes(after.get(name), t), `${name} changed with the levels`).to.equal(true);
        if (name.startsWith('compressor.memory.')) {
          memories++;
          expect(floatsOf(t).some((x) => x !== 0), `${name} is still zero after 2 steps`).to.equal(true);
        }
      }
      expect(memories).to.equal(21);
      params.forEach((p, i) => {
        if (p.shape.length < 2) return;
        const q = `compressor.q.${p.name}`;
        if (switched[i]) {
          expect(after.get(q).shape, q).to.deep.equal(freshLow.get(q).shape);
          expect(sameBytes(after.get(q), freshLow.get(q)), `${q}: not the Q a fresh rank-1 model starts with`).to.equal(true);
        } else {
          expect(sameBytes(after.get(q), before.get(q)), `${q}: the warm-started Q of an unchanged level was replaced`).to.equal(true);
          expect(sameBytes(after.get(q), freshHigh.get(q)), `${q}: Q was never warm-started`).to.equal(false);
        }
      });

      await model.setLevels(levels);
      expect(firstDifference(await model.stateDict(true), afterState), 'setting the same levels again').to.equal(undefined);

      // Training goes on at the new levels; switching back draws the initial rank-2 Q again.
      expect((await model.trainStep(batcher)).floatsSent).to.equal(floatsPerStep(params, levels, 'powersgd'));
      const beforeBack = byName(await model.stateDict(true));
      await model.setLevels(params.map(() => 2));
      const back = byName(await model.stateDict(true));
      params.forEach((p, i) => {
        if (p.shape.length < 2) return;
        const q = `compressor.q.${p.name}`;
        const memory = `compressor.memory.${p.name}`;
        expect(sameBytes(back.get(memory), beforeBack.get(memory)), `${memory} after switching back`).to.equal(true);
        expect(sameBytes(back.get(q), switched[i] ? freshHigh.get(q) : beforeBack.get(q)), `${q} after switching back`).to.equal(true);
      });
    });

    it('PowerSGD: a matrix sent dense holds no Q, so its state resumes into a model started at any rank, and both go on alike', async function () {
      // Rank 1 for two steps, then dense: the Q of rank 1 must not be kept for a checkpoint that a
      // model started at rank 2 then cannot load (its Q for that matrix is (cols, 2)).
      const model = await create({ compressor: 'powersgd', level: 2 });
      const params = model.parameters();
      const batcher = batcherFor();
      const dense = params.map((p) => (p.shape.length < 2 ? Number.NaN : p.name === 'linear.weight' ? 0 : 1));
      await model.setLevels(params.map((p) => (p.shape.length < 2 ? Number.NaN : 1)));
      for (let s = 0; s < 2; s++) await model.trainStep(batcher);
      await model.setLevels(dense);
      await model.trainStep(batcher);
      const saved = await model.stateDict(true);
      const names = saved.map((t) => t.name);
      expect(names).to.include('compressor.memory.linear.weight');
      expect(names, 'the Q of a matrix sent dense').to.not.include('compressor.q.linear.weight');
      expect(names).to.include('compressor.q.conv1.weight');

      const resumed = await create({ compressor: 'powersgd', level: 2 });
      await resumed.loadStateDict(saved);
      expect(firstDifference(await resumed.stateDict(true), saved), 'the state as saved').to.equal(undefined);
      // Both take the same next step, and the dense matrix, back at rank 2, draws the same fresh Q.
      const twin = batcherFor();
      for (let s = 0; s < 3; s++) await twin.next();
      await resumed.trainStep(twin);
      await model.trainStep(batcher);
      await model.setLevels(params.map((p) => (p.shape.length < 2 ? Number.NaN : 2)));
      await resumed.setLevels(params.map((p) => (p.shape.length < 2 ? Number.NaN : 2)));
      expect(firstDifference(await resumed.stateDict(true), await model.stateDict(true)), 'after a step and a level change').to.equal(undefined);
    });

    it('TopK: a switch keeps the error memory and changes what is sent', async function () {
      const model = await create({ compressor: 'topk', level: 0.5 });
      const params = model.parameters();
      const batcher = batcherFor();
      expect((await model.trainStep(batcher)).floatsSent).to.equal(floatsPerStep(params, params.map(() => 0.5), 'topk'));
      const before = await model.stateDict(true);
      await model.setLevels(params.map(() => 0.1));
      const after = byName(await model.stateDict(true));
      for (const t of before) {
        if (t.name === 'compressor.levels') continue;
        expect(sameBytes(after.get(t.name), t), `${t.name} changed with the levels`).to.equal(true);
      }
      expect([...after.keys()].some((n) => n.startsWith('compressor.q.'))).to.equal(false);
      expect((await model.trainStep(batcher)).floatsSent).to.equal(floatsPerStep(params, params.map(() => 0.1), 'topk'));
    });
  });
});
