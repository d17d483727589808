// The CIFAR-10 and CIFAR-100 readers on hand-made binary files: exact pixels and labels in order, and
// a DataError naming the file and what is wrong for every malformed input.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { readCifar } from '../../lib/data/cifar.js';
import { DataError } from '../../lib/base/errors.js';
import { engineError } from '../helpers/throws.js';

const IMG = 3072;

/** Distinct, position-dependent pixel bytes so any misplacement shows up. */
function pixels(seed) {
  const p = new Uint8Array(IMG);
  for (let i = 0; i < IMG; i++) p[i] = (i * 7 + seed * 131 + (i >> 10) * 29) & 255;
  return p;
}

function cifar10File(records) {
  const buf = new Uint8Array(records.length * (IMG + 1));
  records.forEach(([label, px], i) => {
    buf[i * (IMG + 1)] = label;
    buf.set(px, i * (IMG + 1) + 1);
  });
  return buf;
}

function cifar100File(records) {
  const buf = new Uint8Array(records.length * (IMG + 2));
  records.forEach(([coarse, fine, px], i) => {
    buf[i * (IMG + 2)] = coarse;
    buf[i * (IMG + 2) + 1] = fine;
    buf.set(px, i * (IMG + 2) + 2);
  });
  return buf;
}

/** Runs fn, asserts it throws a DataError, and returns the error for message checks. */
function dataError(fn) {
  return engineError(fn, DataError, 'ERR_DATA');
}

describe('CIFAR readers', () => {
  let dir;
  beforeEach(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-'));
  });
  afterEach(() => {
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('reads CIFAR-10 batches that exist, in order, with exact pixels and labels', () => {
    const b1 = [
      [3, pixels(1)],
      [0, pixels(2)],
    ];
    const b2 = [[9, pixels(3)]];
    const b4 = [
      [5, pixels(4)],
      [1, pixels(5)],
    ];
    // data_batch_3 and _5 deliberately absent: the reader takes whichever exist.
    fs.writeFileSync(path.join(dir, 'data_batch_1.bin'), cifar10File(b1));
    fs.writeFileSync(path.join(dir, 'data_batch_2.bin'), cifar10File(b2));
    fs.writeFileSync(path.join(dir, 'data_batch_4.bin'), cifar10File(b4));
    fs.writeFileSync(path.join(dir, 'test_batch.bin'), cifar10File([[7, pixels(6)]]));

    const train = readCifar('cifar10', dir, 'train');
    const all = [...b1, ...b2, ...b4];
    expect(train.count).to.equal(5);
    expect(train.classes).to.equal(10);
    expect([train.height, train.width, train.channels]).to.deep.equal([32, 32, 3]);
    expect(Array.from(train.labels)).to.deep.equal(all.map((r) => r[0]));
    expect(train.labels).to.be.instanceOf(Int32Array);
    expect(train.images.byteLength).to.equal(5 * IMG);
    all.forEach(([, px], i) => {
      expect(Buffer.compare(train.images.subarray(i * IMG, (i + 1) * IMG), px), `image ${i}`).to.equal(0);
    });

    const test = readCifar('cifar10', dir, 'test');
    expect(test.count).to.equal(1);
    expect(Array.from(test.labels)).to.deep.equal([7]);
    expect(Buffer.compare(test.images, pixels(6))).to.equal(0);
  });

  it('reads CIFAR-100 with the fine label', () => {
    const recs = [
      [19, 99, pixels(10)],
      [0, 0, pixels(11)],
      [7, 42, pixels(12)],
    ];
    fs.writeFileSync(path.join(dir, 'train.bin'), cifar100File(recs));
    fs.writeFileSync(path.join(dir, 'test.bin'), cifar100File([[1, 2, pixels(13)]]));

    const train = readCifar('cifar100', dir, 'train');
    expect(train.count).to.equal(3);
    expect(train.classes).to.equal(100);
    expect(Array.from(train.labels)).to.deep.equal([99, 0, 42]);
    recs.forEach(([, , px], i) => {
      expect(Buffer.compare(train.images.subarray(i * IMG, (i + 1) * IMG), px), `image ${i}`).to.equal(0);
    });
    const test = readCifar('cifar100', dir, 'test');
    expect(Array.from(test.labels)).to.deep.equal([2]);
    expect(Buffer.compare(test.images, pixels(13))).to.equal(0);
  });

  it('rejects a missing data directory', () => {
    const missing = path.join(dir, 'nope');
    const err = dataError(() => readCifar('cifar10', missing, 'train'));
    expect(err.message).to.equal(`data directory not found: ${missing}`);
  });

  it('rejects a data path that is a file', () => {
    const f = path.join(dir, 'file');
    fs.writeFileSync(f, 'x');
    const err = dataError(() => readCifar('cifar10', f, 'test'));
    expect(err.message).to.include('not a directory').and.include(f);
  });

  it('names the expected files when no CIFAR-10 train batch exists', () => {
    const err = dataError(() => readCifar('cifar10', dir, 'train'));
    for (let i = 1; i <= 5; i++) expect(err.message).to.include(`data_batch_${i}.bin`);
    expect(err.message).to.include(dir);
  });

  it('names the missing test file, for both datasets', () => {
    fs.writeFileSync(path.join(dir, 'data_batch_1.bin'), cifar10File([[0, pixels(0)]]));
    fs.writeFileSync(path.join(dir, 'train.bin'), cifar100File([[0, 0, pixels(0)]]));
    expect(dataError(() => readCifar('cifar10', dir, 'test')).message).to.include('test_batch.bin').and.include(dir);
    expect(dataError(() => readCifar('cifar100', dir, 'test')).message).to.include('test.bin').and.include(dir);
  });

  it('hints at the extracted archive folder when pointed at its parent', () => {
    fs.mkdirSync(path.join(dir, 'cifar-10-batches-bin'));
    const err = dataError(() => readCifar('cifar10', dir, 'test'));
    expect(err.message).to.include(path.join(dir, 'cifar-10-batches-bin'));
  });

  it('rejects a file whose size is not a whole number of records', () => {
    const f = path.join(dir, 'test_batch.bin');
    const full = cifar10File([
      [1, pixels(1)],
      [2, pixels(2)],
    ]);
    fs.writeFileSync(f, full.subarray(0, 3073 + 100));
    const err = dataError(() => readCifar('cifar10', dir, 'test'));
    expect(err.message).to.include(f);
    expect(err.message).to.include('3173'); // file size
    expect(err.message).to.include('record size 3073');
    expect(err.message).to.include('offset 3073'); // where the partial record starts
  });

  it('uses the CIFAR-100 record size in the size check', () => {
    const f = path.join(dir, 'train.bin');
    fs.writeFileSync(f, new Uint8Array(3073)); // one CIFAR-10 record is not a CIFAR-100 record
    const err = dataError(() => readCifar('cifar100', dir, 'train'));
    expect(err.message).to.include(f).and.include('3073').and.include('record size 3074').and.include('offset 0');
  });

  it('rejects a CIFAR-10 label out of range, naming file, record, offset and value', () => {
    const f = path.join(dir, 'data_batch_2.bin');
    fs.writeFileSync(path.join(dir, 'data_batch_1.bin'), cifar10File([[0, pixels(0)]]));
    fs.writeFileSync(
      f,
      cifar10File([
        [4, pixels(1)],
        [10, pixels(2)],
      ]),
    );
    const err = dataError(() => readCifar('cifar10', dir, 'train'));
    expect(err.message).to.include(f);
    expect(err.message).to.include('record 1');
    expect(err.message).to.include('byte offset 3073');
    expect(err.message).to.include('label 10');
  });

  it('rejects CIFAR-100 fine and coarse labels out of range', () => {
    const f = path.join(dir, 'test.bin');
    fs.writeFileSync(
      f,
      cifar100File([
        [0, 0, pixels(0)],
        [1, 1, pixels(1)],
        [2, 100, pixels(2)],
      ]),
    );
    let err = dataError(() => readCifar('cifar100', dir, 'test'));
    expect(err.message).to.include(f).and.include('record 2').and.include(`byte offset ${2 * 3074 + 1}`);
    expect(err.message).to.include('fine label 100');

    fs.writeFileSync(f, cifar100File([[20, 5, pixels(0)]]));
    err = dataError(() => readCifar('cifar100', dir, 'test'));
    expect(err.message).to.include('record 0').and.include('byte offset 0').and.include('coarse label 20');
  });

  it('rejects an empty file', () => {
    const f = path.join(dir, 'test_batch.bin');
    fs.writeFileSync(f, new Uint8Array(0));
    const err = dataError(() => readCifar('cifar10', dir, 'test'));
    expect(err.message).to.include('empty file').and.include(f);
  });

  it('rejects an unknown dataset name', () => {
    expect(dataError(() => readCifar('mnist', dir, 'train')).message).to.include('mnist');
  });
});
