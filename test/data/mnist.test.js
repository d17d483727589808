// MNIST-format files (IDX in gzip) and Fashion-MNIST as the CNNs take it: exact pixels in CIFAR's
// layout checked against a hand-built file, every malformed file a DataError naming the file and the
// fault (and random damage never anything else), and Debian's Fashion-MNIST read whole.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';

import { readIdx } from '../../lib/data/idx.js';
import { readMnist } from '../../lib/data/mnist.js';
import { firstImages, loadImageDataset } from '../../lib/data/datasets.js';
import { DataError } from '../../lib/base/errors.js';
import { engineError, thrownBy } from '../helpers/throws.js';
import { makeRng } from '../helpers/gradcheck.js';
import { FASHION_MNIST, requireFashionMnist } from '../helpers/outside.js';

const SIDE = 28;

/** An IDX file of unsigned bytes: magic 0x0000 08 rank, the dimensions big-endian, the data. */
function idx(dims, data) {
  const header = Buffer.alloc(4 + 4 * dims.length);
  header.writeUInt32BE((0x08 << 8) | dims.length, 0);
  dims.forEach((d, i) => header.writeUInt32BE(d, 4 + 4 * i));
  return Buffer.concat([header, Buffer.from(data)]);
}

/** `count` images whose pixel (y, x) of image i is (i·31 + y·7 + x·3 + 1) mod 256: any misplacement shows. */
function imageBytes(count) {
  const data = new Uint8Array(count * SIDE * SIDE);
  for (let i = 0; i < count; i++)
    for (let y = 0; y < SIDE; y++) for (let x = 0; x < SIDE; x++) data[(i * SIDE + y) * SIDE + x] = (i * 31 + y * 7 + x * 3 + 1) & 255;
  return data;
}

/** Writes a split's two files into `dir` (gzip unless `plain`). */
function writeSplit(dir, prefix, images, labels, plain = false) {
  const write = (name, bytes) => fs.writeFileSync(path.join(dir, plain ? name : `${name}.gz`), plain ? bytes : zlib.gzipSync(bytes));
  write(`${prefix}-images-idx3-ubyte`, images);
  write(`${prefix}-labels-idx1-ubyte`, labels);
}

const dataError = (fn) => engineError(fn, DataError, 'ERR_DATA');

describe('MNIST-format readers', () => {
  let dir;
  const labels = Uint8Array.from([3, 0, 9, 4, 7]);
  beforeEach(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-mnist-'));
    writeSplit(dir, 'train', idx([5, SIDE, SIDE], imageBytes(5)), idx([5], labels));
    writeSplit(dir, 't10k', idx([2, SIDE, SIDE], imageBytes(2)), idx([2], labels.subarray(0, 2)));
  });
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('centres each 28×28 image in a black 32×32 frame, the same in all three channels, with its label', () => {
    const set = readMnist('fashion-mnist', dir, 'train');
    expect(set.count).to.equal(5);
    expect([...set.labels]).to.deep.equal([...labels]);
    expect(set.images.length).to.equal(5 * 3 * 32 * 32);
    for (let i = 0; i < 5; i++)
      for (let c = 0; c < 3; c++)
        for (let y = 0; y < 32; y++)
          for (let x = 0; x < 32; x++) {
            const inside = y >= 2 && y < 30 && x >= 2 && x < 30;
            const expected = inside ? (i * 31 + (y - 2) * 7 + (x - 2) * 3 + 1) & 255 : 0;
            const got = set.images[((i * 3 + c) * 32 + y) * 32 + x];
            if (got !== expected) expect.fail(`image ${i} channel ${c} (${y}, ${x}): ${got}, expected ${expected}`);
          }
    expect(readMnist('mnist', dir, 'test').count).to.equal(2);
  });

  it('reads the files without .gz as well, to the same images', () => {
    const gz = readMnist('mnist', dir, 'train');
    const plain = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-mnist-'));
    try {
      writeSplit(plain, 'train', idx([5, SIDE, SIDE], imageBytes(5)), idx([5], labels), true);
      const read = readMnist('mnist', plain, 'train');
      expect(Buffer.compare(read.images, gz.images)).to.equal(0);
      expect([...read.labels]).to.deep.equal([...gz.labels]);
    } finally {
      fs.rmSync(plain, { recursive: true, force: true });
    }
  });

  it('takes the first N training images and the first M test images, each split whole where not given', () => {
    const ds = loadImageDataset('fashion-mnist', dir, {});
    const cut = firstImages(ds, { train: 3 });
    expect(cut.train.count).to.equal(3);
    expect([...cut.train.labels]).to.deep.equal([3, 0, 9]);
    expect(Buffer.compare(cut.train.images, ds.train.images.subarray(0, 3 * 3072))).to.equal(0);
    expect(cut.test).to.equal(ds.test);
    const tested = firstImages(ds, { test: 1 });
    expect(tested.train).to.equal(ds.train);
    expect(tested.test.count).to.equal(1);
    expect([...tested.test.labels]).to.deep.equal([ds.test.labels[0]]);
    expect(Buffer.compare(tested.test.images, ds.test.images.subarray(0, 3072))).to.equal(0);
    const whole = firstImages(ds, { train: 99, test: 99 });
    expect([whole.train, whole.test]).to.deep.equal([ds.train, ds.test]);
  });

  it('names a missing directory, a missing file and a file that is a directory', () => {
    expect(dataError(() => readMnist('fashion-mnist', path.join(dir, 'none'), 'train')).message).to.match(/data directory not found/);
    fs.rmSync(path.join(dir, 't10k-labels-idx1-ubyte.gz'));
    expect(dataError(() => readMnist('fashion-mnist', dir, 'test')).message).to.equal(`Fashion-MNIST test split: missing t10k-labels-idx1-ubyte.gz in ${dir}`);
    fs.mkdirSync(path.join(dir, 't10k-labels-idx1-ubyte.gz'));
    expect(dataError(() => readMnist('fashion-mnist', dir, 'test')).message).to.match(/not a regular file/);
  });

  const faults = [
    ['a file that is not gzip', (f) => fs.writeFileSync(f, 'hello'), /not a gzip file/],
    ['a truncated gzip stream', (f) => fs.writeFileSync(f, fs.readFileSync(f).subarray(0, 100)), /gzip stream is damaged or truncated/],
    ['the wrong magic number', (f) => fs.writeFileSync(f, zlib.gzipSync(idx([5], labels))), /magic number 0x00000801 at offset 0, expected 0x00000803/],
    ['images of another size', (f) => fs.writeFileSync(f, zlib.gzipSync(idx([5, 32, 32], new Uint8Array(5 * 1024)))), /dimension 1 is 32 \(at offset 8\), expected 28/],
    ['truncated pixels', (f) => fs.writeFileSync(f, zlib.gzipSync(idx([5, SIDE, SIDE], imageBytes(5)).subarray(0, 16 + 3 * 784 + 10))), /truncated: .* 3920 bytes of data, the file holds 2362 \(item 3 of 5 is incomplete\)/],
    ['bytes after the data', (f) => fs.writeFileSync(f, zlib.gzipSync(Buffer.concat([idx([5, SIDE, SIDE], imageBytes(5)), Buffer.from([1, 2])]))), /2 bytes after the 5×28×28/],
    ['a header cut short', (f) => fs.writeFileSync(f, zlib.gzipSync(Buffer.from([0, 0, 8, 3, 0, 0]))), /too short for the header of 3 dimensions/],
    ['no items', (f) => fs.writeFileSync(f, zlib.gzipSync(idx([0, SIDE, SIDE], []))), /counts 0 items/],
  ];
  for (const [what, damage, message] of faults)
    it(`refuses ${what}, naming the file`, () => {
      const file = path.join(dir, 'train-images-idx3-ubyte.gz');
      damage(file);
      const err = dataError(() => readMnist('fashion-mnist', dir, 'train'));
      expect(err.message).to.include(file);
      expect(err.message).to.match(message);
    });

  it('refuses a label out of range, naming the item and its offset, and a count that differs from the images', () => {
    const file = path.join(dir, 'train-labels-idx1-ubyte.gz');
    fs.writeFileSync(file, zlib.gzipSync(idx([5], [3, 0, 10, 4, 7])));
    expect(dataError(() => readMnist('fashion-mnist', dir, 'train')).message).to.equal(
      `${file}: label 10 of item 2 at byte offset 10; Fashion-MNIST labels must be 0..9`,
    );
    fs.writeFileSync(file, zlib.gzipSync(idx([4], [3, 0, 1, 4])));
    expect(dataError(() => readMnist('fashion-mnist', dir, 'train')).message).to.match(/4 labels for the 5 images of/);
  });

  it('random damage to a file gives the same images or a DataError, nothing else (400 cases)', () => {
    const rng = makeRng(41);
    const good = idx([5, SIDE, SIDE], imageBytes(5));
    const file = path.join(dir, 'train-images-idx3-ubyte.gz');
    const reference = readMnist('mnist', dir, 'train');
    const outcomes = { same: 0, refused: 0 };
    for (let n = 0; n < 400; n++) {
      let bytes = Buffer.from(good);
      const kind = n % 4;
      if (kind === 0) bytes = bytes.subarray(0, rng.int(bytes.length));
      else if (kind === 1) for (let k = 0; k < 1 + rng.int(4); k++) bytes[rng.int(16)] = rng.int(256);
      else if (kind === 2) bytes = Buffer.concat([bytes, Buffer.alloc(1 + rng.int(8))]);
      let stored = zlib.gzipSync(bytes);
      if (kind === 3) {
        stored = Buffer.from(stored);
        for (let k = 0; k < 1 + rng.int(4); k++) stored[rng.int(stored.length)] ^= 1 << rng.int(8);
      }
      fs.writeFileSync(file, stored);
      const err = thrownBy(() => {
        const set = readMnist('mnist', dir, 'train');
        if (Buffer.compare(set.images, reference.images) !== 0) throw new Error(`case ${n}: a damaged file read as other images`);
      });
      if (err === undefined) outcomes.same++;
      else if (err instanceof DataError && err.message.includes(file)) outcomes.refused++;
      else throw err;
    }
    expect(outcomes.refused).to.be.above(300);
  });

  it('tells a CIFAR-10 reader pointed at MNIST-format files which --dataset to add', () => {
    expect(dataError(() => loadImageDataset('cifar10', dir, {})).message).to.match(/it holds MNIST-format files: add --dataset fashion-mnist or --dataset mnist\)$/);
  });

  it('reads a dimension count other than the expected one as a wrong magic number', () => {
    const file = path.join(dir, 'x.gz');
    fs.writeFileSync(file, zlib.gzipSync(idx([2, 2], [1, 2, 3, 4])));
    expect(dataError(() => readIdx(file, 1, [])).message).to.match(/expected 0x00000801 \(unsigned bytes in 1 dimension\)/);
    expect(readIdx(file, 2, [2]).data).to.deep.equal(Uint8Array.from([1, 2, 3, 4]));
  });
});

describe("Debian's Fashion-MNIST", () => {
  it('reads 60,000 training and 10,000 test images, 6,000 and 1,000 of each class, as distributed', function () {
    this.timeout(60000);
    requireFashionMnist();
    const ds = loadImageDataset('fashion-mnist', FASHION_MNIST, {});
    expect([ds.train.count, ds.test.count, ds.classes]).to.deep.equal([60000, 10000, 10]);
    for (const [set, each] of [[ds.train, 6000], [ds.test, 1000]]) {
      const counts = new Array(10).fill(0);
      for (const l of set.labels) counts[l]++;
      expect(counts).to.deep.equal(new Array(10).fill(each));
    }
    // The mean grey level of the 28×28 training pixels is the normalisation's mean.
    let sum = 0;
    for (let i = 0; i < ds.train.count; i++)
      for (let y = 2; y < 30; y++) for (let x = 2; x < 30; x++) sum += ds.train.images[i * 3072 + y * 32 + x];
    expect(sum / (ds.train.count * 784 * 255)).to.be.closeTo(ds.mean[0], 5e-4);
  });
});

describe('training on MNIST-format files', function () {
  this.timeout(120000);
  let dir;
  before(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-mnist-train-'));
    const labels = (n) => Uint8Array.from({ length: n }, (_, i) => i % 10);
    writeSplit(dir, 'train', idx([64, SIDE, SIDE], imageBytes(64)), idx([64], labels(64)));
    writeSplit(dir, 't10k', idx([16, SIDE, SIDE], imageBytes(16)), idx([16], labels(16)));
  });
  after(() => fs.rmSync(dir, { recursive: true, force: true }));

  const options = (extra) => ({
    model: 'resnet18', width: 0.125, dataset: 'fashion-mnist', dataDir: dir, trainImages: 48, batchSize: 16, evalBatchSize: 16, epochs: 1,
    progress: false, seed: 3, ...extra,
  });

  it('trains a narrow model on the first N images; a resume keeps width and data size, and reads a checkpoint older than both options; --test-images evaluates on the first M, which a resume may change', async function () {
    const { Trainer, readSafetensors, writeSafetensors } = await import('../../lib/index.js');
    const out = path.join(dir, 'run');
    const trainer = await Trainer.create(options({ outDir: out }));
    const summary = await trainer.fit();
    expect(trainer.model.parameters().find((p) => p.name === 'conv1.weight').shape).to.deep.equal([8, 3, 3, 3]);
    await trainer.dispose();
    expect(summary.epochs[0].samples).to.equal(48);
    const config = JSON.parse(fs.readFileSync(path.join(out, 'config.json'), 'utf8'));
    expect([config.width, config.trainImages, config.dataset]).to.deep.equal([0.125, 48, 'fashion-mnist']);

    for (const [changed, words] of [[{ width: 0.25 }, 'width = 0.125, this run gives 0.25'], [{ trainImages: 64 }, 'trainImages = 48, this run gives 64']]) {
      const err = await Trainer.create(options({ resume: out, epochs: 2, ...changed })).then(() => null, (e) => e);
      expect(err?.code, JSON.stringify(changed)).to.equal('ERR_USAGE');
      expect(err.message).to.include(words);
    }

    // --test-images: the same training (every training figure equal), evaluated on the first 8 test
    // images; a resume may change it, as it may change the evaluations.
    const tested = path.join(dir, 'run-tested');
    const t = await Trainer.create(options({ outDir: tested, testImages: 8 }));
    const testedSummary = await t.fit();
    await t.dispose();
    const start = fs.readFileSync(path.join(tested, 'metrics.jsonl'), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l)).find((e) => e.event === 'start');
    expect([start.trainSamples, start.testSamples]).to.deep.equal([48, 8]);
    expect([testedSummary.epochs[0].trainLoss, testedSummary.epochs[0].trainAccuracy]).to.deep.equal([summary.epochs[0].trainLoss, summary.epochs[0].trainAccuracy]);
    expect(testedSummary.epochs[0].testLoss).to.not.equal(summary.epochs[0].testLoss);
    const resumedTested = await Trainer.create(options({ resume: tested, epochs: 2, testImages: 16 }));
    await resumedTested.dispose();

    // A checkpoint written before --width and --train-images existed holds neither: width 1 and all images.
    const checkpoint = path.join(out, 'checkpoints', fs.readFileSync(path.join(out, 'checkpoints', 'latest'), 'utf8').trim(), 'trainer.safetensors');
    const saved = readSafetensors(checkpoint);
    const position = JSON.parse(saved.metadata.position);
    delete position.config.width;
    delete position.config.trainImages;
    writeSafetensors(checkpoint, [...saved.tensors.values()], { ...saved.metadata, position: JSON.stringify(position) });
    const old = await Trainer.create(options({ resume: out, epochs: 2, width: 0.125 })).then(() => null, (e) => e);
    expect(old?.message).to.include('width = 1, this run gives 0.125');
  });
});
