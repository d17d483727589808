// SharedData: the trainers of one process read each dataset once and train on the same bytes.
import { expect } from 'chai';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { SharedData, Trainer } from '../../lib/index.js';
import { connectLocalGroups } from '../../lib/comm/local.js';

describe('SharedData', function () {
  it('reads each key once and hands every caller the same value', function () {
    const shared = new SharedData();
    let reads = 0;
    const read = () => ({ n: ++reads });
    const a = shared.get('a', read);
    expect(shared.get('a', read)).to.equal(a);
    expect(shared.get('b', read)).to.not.equal(a);
    expect(reads).to.equal(2);
  });

  it('two trainers of one job given the same SharedData take their shards of one copy of the images', async function () {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-shared-'));
    const options = {
      model: 'resnet18', width: 0.25, dataset: 'synthetic', dataDir: path.join(tmp, 'data'), syntheticTrain: 32, syntheticTest: 16,
      batchSize: 8, evalBatchSize: 16, epochs: 1, workers: 2, outDir: path.join(tmp, 'run'),
    };
    const local = await connectLocalGroups(2, 30000);
    const sharedData = new SharedData();
    const trainers = await Promise.all(local.groups.map((group, rank) => Trainer.create(options, { group, localRank: rank, sharedData })));
    try {
      const [a, b] = trainers.map((t) => t.task.dataset);
      expect(b.train.images).to.equal(a.train.images);
      expect(b.test.labels).to.equal(a.test.labels);
    } finally {
      await Promise.all(trainers.map((t) => t.dispose()));
      await local.dispose();
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  });
});
