// Errors of the public API: bad inputs reaching the native code end in an AccordionError with a code
// and never kill the process (tried in a child process, where a crash shows as a signal), and the
// library's own checks throw AccordionErrors with codes too.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import * as library from '../../lib/index.js';
import { readWikiText, splitTextIntoWikiText } from '../../lib/data/wikitext.js';
import { CASES } from '../helpers/bad-inputs.js';
import { tinyImageSet } from '../helpers/images.js';

const { AccordionError, Batcher, Model } = library;
const HERE = path.dirname(fileURLToPath(import.meta.url));

describe('errors of the public API', function () {
  this.timeout(120000);

  it(`no bad input kills the process: ${CASES.length} cases through the API in a child process, each an AccordionError with its code`, function () {
    expect(CASES.length).to.be.at.least(20);
    const child = spawnSync(process.execPath, [path.join(HERE, '..', 'helpers', 'bad-inputs.js')], {
      encoding: 'utf8',
      timeout: 100000,
      env: { ...process.env, OMP_NUM_THREADS: '1' },
    });
    const lines = child.stdout.split('\n').filter((l) => l !== '');
    const started = lines.filter((l) => l.startsWith('start ')).map((l) => l.slice(6));
    const results = lines.filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
    const last = started[started.length - 1];
    expect(child.signal, `the child died of ${child.signal} during case '${last}'\n${child.stderr}`).to.equal(null);
    expect(child.status, `the child exited with ${child.status} during case '${last}'\n${child.stderr}`).to.equal(0);
    expect(results.map((r) => r.name)).to.deep.equal(CASES.map((c) => c.name));
    for (const [i, r] of results.entries()) {
      expect(r.accordion, `${r.name}: ${r.message} (code ${r.code})`).to.equal(true);
      expect(r.code, `${r.name}: ${r.message}`).to.equal(CASES[i].code);
      expect(r.message, r.name).to.not.equal('');
    }
  });

  describe('the library’s own checks', function () {
    let tmp;
    before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-errors-'))));
    after(() => fs.rmSync(tmp, { recursive: true, force: true }));

    async function caught(fn) {
      try {
        await fn();
      } catch (err) {
        return err;
      }
      return undefined;
    }

    const calls = [
      ['new Batcher with a label outside the classes', 'ERR_USAGE', () => {
        const set = tinyImageSet(4, 10, 1);
        set.labels[3] = 10;
        return new Batcher(set, { batchSize: 2 });
      }],
      ['new Batcher with labels that are not an Int32Array', 'ERR_USAGE', () => new Batcher({ ...tinyImageSet(2, 10, 1), labels: [0, 1] }, { batchSize: 2 })],
      ['new Batcher with a non-integer batch size', 'ERR_USAGE', () => new Batcher(tinyImageSet(2, 10, 1), { batchSize: 1.5 })],
      ['new Batcher with rank 2 of 2 workers', 'ERR_USAGE', () => new Batcher(tinyImageSet(2, 10, 1), { batchSize: 1, rank: 2, worldSize: 2 })],
      ['new Batcher with a seed that is a string', 'ERR_USAGE', () => new Batcher(tinyImageSet(2, 10, 1), { batchSize: 1, seed: '7' })],
      ['new Batcher on a device that is not one', 'ERR_USAGE', () => new Batcher(tinyImageSet(2, 10, 1), { batchSize: 1, device: 'tpu' })],
      ['Model.create of an unknown architecture', 'ERR_USAGE', () => Model.create({ architecture: 'alexnet' })],
      ['Model.create with 1 class', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', classes: 1 })],
      ['Model.create with layers 2.5', 'ERR_USAGE', () => Model.create({ architecture: 'lstm', classes: 10, layers: 2.5 })],
      ['Model.create with a negative learning rate', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', learningRate: -1 })],
      ['Model.create with an infinite momentum', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', momentum: Infinity })],
      ['Model.create with nesterov "yes"', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', nesterov: 'yes' })],
      ['Model.create with an unknown compressor', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', compressor: 'zip' })],
      ['Model.create with level 0', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', compressor: 'powersgd', level: 0 })],
      ['Model.create with buckets of -1 MiB', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', bucketMb: -1 })],
      ['Model.create with 0 threads', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', threads: 0 })],
      ['Model.create with a group that is not a ProcessGroup', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', group: {} })],
      ['Model.create on a device that is not one', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', device: 'gpu' })],
      ['Model.create with tf32 on the CPU (a GPU format)', 'ERR_UNSUPPORTED', () => Model.create({ architecture: 'resnet18', tf32: true })],
      ['Model.create with channels-first activations on the CPU (a GPU layout)', 'ERR_UNSUPPORTED', () => Model.create({ architecture: 'resnet18', memoryFormat: 'channels-first' })],
      ['Model.create with memory format "nhwc"', 'ERR_USAGE', () => Model.create({ architecture: 'resnet18', memoryFormat: 'nhwc' })],
      ['Model.create with PowerSGD rank 1.5 (refused by the addon)', 'ERR_INVALID_ARGUMENT', () => Model.create({ architecture: 'resnet18', compressor: 'powersgd', level: 1.5 })],
      ['setThreads(2.5)', 'ERR_USAGE', () => library.setThreads(2.5)],
      ['endOfEpoch with too few norms', 'ERR_USAGE', () => library.endOfEpoch(library.initialState(2), { epoch: 0, norms: [1], lrCurrent: 0.1, lrNext: 0.1 }, { eta: 0.5, interval: 1 })],
      ['loadImageDataset cifar10 without a directory', 'ERR_USAGE', () => library.loadImageDataset('cifar10', undefined, { train: 1, test: 1, seed: 0 })],
      ['readMetrics of a missing file', 'ERR_DATA', () => library.readMetrics(path.join(tmp, 'none.jsonl'))],
      ['readMetrics of a file with a broken line', 'ERR_DATA', () => {
        const file = path.join(tmp, 'broken.jsonl');
        fs.writeFileSync(file, '{"event":"start"}\n{oops\n{"event":"epoch"}\n');
        return library.readMetrics(file);
      }],
      ['readSafetensors of a missing file', 'ERR_CHECKPOINT', () => library.readSafetensors(path.join(tmp, 'none.safetensors'))],
      ['readWikiText of a missing directory', 'ERR_DATA', () => readWikiText(path.join(tmp, 'no-such-dir'))],
      ['splitTextIntoWikiText with fractions summing to 2', 'ERR_USAGE', () => splitTextIntoWikiText('a b\n', path.join(tmp, 'split'), [1, 0.5, 0.5])],
    ];
    for (const [name, code, fn] of calls)
      it(`${name}: an AccordionError with code ${code}`, async function () {
        const err = await caught(fn);
        expect(err, `${name} did not throw`).to.not.equal(undefined);
        expect(err, `${name}: ${err}`).to.be.instanceOf(AccordionError);
        expect(err.code, `${name}: ${err.message}`).to.equal(code);
      });

    describe('methods of a model', function () {
      let model;
      before(async () => (model = await Model.create({ architecture: 'resnet18', classes: 10 })));
      after(async () => model?.dispose());

      const methods = [
        ['evaluate without a Batcher', (m) => m.evaluate({})],
        ['trainStep with microBatches 0', (m) => m.trainStep(new Batcher(tinyImageSet(2, 10, 1), { batchSize: 2 }), 0)],
        ['trainStep with images of the wrong size', (m) => m.trainStep({ images: new Float32Array(10), labels: [1] })],
        ['predict with a count of 0', (m) => m.predict(new Float32Array(0), 0)],
        ['forward with train "yes"', (m) => m.forward(new Float32Array(3072), { train: 'yes' })],
        ['setLevels with strings', (m) => m.setLevels(['a'])],
        ['setLearningRate(NaN)', (m) => m.setLearningRate(NaN)],
        ['broadcastState(-1)', (m) => m.broadcastState(-1)],
        ['loadStateDict(42)', (m) => m.loadStateDict(42)],
        ['loadStateDict with a tensor whose data is a plain array', (m) => m.loadStateDict([{ name: 'linear.bias', dtype: 'F32', shape: [10], data: [0] }])],
        ['save with no path', (m) => m.save()],
        ['hiddenState of an image model', (m) => m.hiddenState()],
      ];
      for (const [name, fn] of methods)
        it(`${name}: a UsageError (ERR_USAGE)`, async function () {
          const err = await caught(() => fn(model));
          expect(err, `${name} did not throw`).to.be.instanceOf(library.UsageError);
          expect(err.code).to.equal('ERR_USAGE');
        });

      it('a state the addon refuses (a wrong shape) is an AccordionError with ERR_STATE_MISMATCH', async function () {
        const state = await model.stateDict();
        const bias = state.find((t) => t.name === 'linear.bias');
        const err = await caught(() => model.loadStateDict(state.map((t) => (t === bias ? { ...t, shape: [5, 2] } : t))));
        expect(err).to.be.instanceOf(AccordionError);
        expect(err.code).to.equal('ERR_STATE_MISMATCH');
      });

      it('a disposed model: a UsageError for every further call', async function () {
        const m = await Model.create({ architecture: 'resnet18', classes: 10 });
        await m.dispose();
        const err = await caught(() => m.levels());
        expect(err).to.be.instanceOf(library.UsageError);
      });
    });
  });
});
