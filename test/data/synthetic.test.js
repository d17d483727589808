// The synthetic CIFAR-10-format set: written once into its directory, read back by the CIFAR reader,
// the same for the same seed, and never written over real data or other files.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { readCifar } from '../../lib/data/cifar.js';
import { writeSyntheticCifar10, ensureSyntheticCifar10 } from '../../lib/data/synthetic.js';
import { UsageError } from '../../lib/base/errors.js';

const IMG = 3072;

describe('synthetic CIFAR-10', function () {
  this.timeout(20000);
  const dirs = [];
  const mk = () => {
    const d = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-'));
    dirs.push(d);
    return d;
  };
  after(() => {
    for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
  });

  const FILES = ['data_batch_1.bin', 'data_batch_2.bin', 'data_batch_3.bin', 'data_batch_4.bin', 'data_batch_5.bin', 'test_batch.bin', 'batches.meta.txt'];

  it('is byte-identical for the same options and different for another seed', () => {
    const opts = { train: 53, test: 21, seed: 7 };
    const [a, b, c] = [mk(), mk(), mk()];
    writeSyntheticCifar10(a, opts);
    writeSyntheticCifar10(b, { ...opts });
    writeSyntheticCifar10(c, { ...opts, seed: 8 });
    for (const f of FILES) {
      expect(Buffer.compare(fs.readFileSync(path.join(a, f)), fs.readFileSync(path.join(b, f))), f).to.equal(0);
    }
    for (const f of FILES.slice(0, 6)) {
      expect(Buffer.compare(fs.readFileSync(path.join(a, f)), fs.readFileSync(path.join(c, f))), f).to.not.equal(0);
    }
    // Seeds beyond 32 bits must matter too.
    const d = mk();
    writeSyntheticCifar10(d, { ...opts, seed: 7 + 2 ** 32 });
    expect(Buffer.compare(fs.readFileSync(path.join(a, 'test_batch.bin')), fs.readFileSync(path.join(d, 'test_batch.bin')))).to.not.equal(0);
  });

  it('splits train evenly over five files, leaves no temp files, and writes class names', () => {
    const d = mk();
    writeSyntheticCifar10(d, { train: 23, test: 4, seed: 1 });
    const sizes = [1, 2, 3, 4, 5].map((i) => fs.statSync(path.join(d, `data_batch_${i}.bin`)).size / 3073);
    expect(sizes).to.deep.equal([5, 5, 5, 4, 4]);
    expect(fs.statSync(path.join(d, 'test_batch.bin')).size).to.equal(4 * 3073);
    expect(fs.readdirSync(d).sort()).to.deep.equal([...FILES, '.accordion-synthetic'].sort());
    const names = fs.readFileSync(path.join(d, 'batches.meta.txt'), 'utf8').split('\n').filter(Boolean);
    expect(names).to.have.length(10);
    expect(new Set(names).size).to.equal(10);
  });

  it('has balanced, shuffled labels and is readable by readCifar', () => {
    const d = mk();
    writeSyntheticCifar10(d, { train: 200, test: 50, seed: 3 });
    const train = readCifar('cifar10', d, 'train');
    const test = readCifar('cifar10', d, 'test');
    expect(train.count).to.equal(200);
    expect(test.count).to.equal(50);
    const counts = new Array(10).fill(0);
    for (const l of train.labels) counts[l]++;
    expect(counts).to.deep.equal(new Array(10).fill(20));
    const testCounts = new Array(10).fill(0);
    for (const l of test.labels) testCounts[l]++;
    expect(testCounts).to.deep.equal(new Array(10).fill(5));
    // Not in label order (a sorted or cyclic order would starve SGD batches of classes).
    const cyclic = Array.from(train.labels).every((l, i) => l === i % 10);
    const sorted = Array.from(train.labels).every((l, i, a) => i === 0 || a[i - 1] <= l);
    expect(cyclic || sorted).to.equal(false);
  });

  it('honours a smaller class count', () => {
    const d = mk();
    writeSyntheticCifar10(d, { train: 30, test: 9, seed: 3, classes: 3 });
    const train = readCifar('cifar10', d, 'train');
    expect(new Set(train.labels)).to.deep.equal(new Set([0, 1, 2]));
    expect(fs.readFileSync(path.join(d, 'batches.meta.txt'), 'utf8').split('\n').filter(Boolean)).to.have.length(3);
  });

  it('rejects invalid options with UsageError', () => {
    const d = mk();
    for (const bad of [
      { train: 4, test: 1, seed: 1 },
      { train: 10, test: 0, seed: 1 },
      { train: 10.5, test: 1, seed: 1 },
      { train: 10, test: 1, seed: 0.5 },
      { train: 10, test: 1, seed: 1, classes: 11 },
      { train: 10, test: 1, seed: 1, classes: 1 },
    ]) {
      expect(() => writeSyntheticCifar10(d, bad), JSON.stringify(bad)).to.throw(UsageError);
    }
  });

  it('generates 10,000 images: 2,000 per training file, every one read back, 1,000 per class', () => {
    const d = mk();
    writeSyntheticCifar10(d, { train: 10000, test: 10, seed: 5 });
    for (let i = 1; i <= 5; i++) expect(fs.statSync(path.join(d, `data_batch_${i}.bin`)).size, `data_batch_${i}.bin`).to.equal(2000 * 3073);
    const train = readCifar('cifar10', d, 'train');
    expect(train.count).to.equal(10000);
    const counts = new Array(10).fill(0);
    for (const l of train.labels) counts[l]++;
    expect(counts).to.deep.equal(new Array(10).fill(1000));
  });

  it('creates a missing directory and marks it with the generation parameters', () => {
    const d = path.join(mk(), 'a', 'b');
    writeSyntheticCifar10(d, { train: 10, test: 2, seed: 4 });
    expect(JSON.parse(fs.readFileSync(path.join(d, '.accordion-synthetic'), 'utf8'))).to.include({ train: 10, test: 2, seed: 4, classes: 10 });
    // A marked directory is the engine's: writing again (other options) is allowed.
    writeSyntheticCifar10(d, { train: 10, test: 2, seed: 5 });
    expect(JSON.parse(fs.readFileSync(path.join(d, '.accordion-synthetic'), 'utf8')).seed).to.equal(5);
  });

  it('never overwrites a directory of real CIFAR files or other files: UsageError naming it, nothing touched', () => {
    const real = mk();
    const names = FILES.slice(0, 6);
    names.forEach((n, i) => fs.writeFileSync(path.join(real, n), Buffer.alloc(3073, i + 1)));
    const other = mk();
    fs.writeFileSync(path.join(other, 'notes.txt'), 'mine\n');
    for (const [dir, fn] of [
      [real, () => writeSyntheticCifar10(real, { train: 10, test: 2, seed: 1 })],
      [real, () => ensureSyntheticCifar10(real, { train: 10, test: 2, seed: 1 })],
      [other, () => ensureSyntheticCifar10(other, { train: 10, test: 2, seed: 1 })],
    ]) {
      expect(fn).to.throw(UsageError, dir);
    }
    expect(fs.readdirSync(real).sort()).to.deep.equal([...names].sort());
    names.forEach((n, i) => expect(fs.readFileSync(path.join(real, n)).equals(Buffer.alloc(3073, i + 1)), n).to.equal(true));
    expect(fs.readdirSync(other)).to.deep.equal(['notes.txt']);
    expect(() => writeSyntheticCifar10(real, { train: 10, test: 2, seed: 1 })).to.throw(/--dataset cifar10/);
  });

  it('reuses a cache written before directories were marked (its stamp names the generator)', () => {
    const d = mk();
    const opts = { train: 10, test: 2, seed: 6 };
    ensureSyntheticCifar10(d, opts);
    fs.rmSync(path.join(d, '.accordion-synthetic'));
    const before = fs.statSync(path.join(d, 'data_batch_1.bin')).mtimeMs;
    expect(ensureSyntheticCifar10(d, opts)).to.equal(d);
    expect(fs.statSync(path.join(d, 'data_batch_1.bin')).mtimeMs).to.equal(before);
    expect(fs.existsSync(path.join(d, '.accordion-synthetic'))).to.equal(true);
  });

  it('ensureSyntheticCifar10 creates, reuses, and regenerates on changed options or missing files', () => {
    const root = mk();
    const d = path.join(root, 'nested', 'synthetic');
    const opts = { train: 20, test: 10, seed: 11 };
    expect(ensureSyntheticCifar10(d, opts)).to.equal(d);
    const stamp = JSON.parse(fs.readFileSync(path.join(d, 'synthetic.json'), 'utf8'));
    expect(stamp).to.include({ train: 20, test: 10, seed: 11, classes: 10 });

    // Reuse: a marker byte we plant in a data file must survive (sizes unchanged).
    const f = path.join(d, 'data_batch_1.bin');
    const planted = fs.readFileSync(f);
    planted[5] ^= 0xff;
    fs.writeFileSync(f, planted);
    ensureSyntheticCifar10(d, { ...opts });
    expect(fs.readFileSync(f)[5]).to.equal(planted[5]);

    // Changed options: rewritten and re-stamped.
    ensureSyntheticCifar10(d, { ...opts, seed: 12 });
    expect(JSON.parse(fs.readFileSync(path.join(d, 'synthetic.json'), 'utf8')).seed).to.equal(12);
    const fresh = mk();
    writeSyntheticCifar10(fresh, { ...opts, seed: 12 });
    expect(Buffer.compare(fs.readFileSync(f), fs.readFileSync(path.join(fresh, 'data_batch_1.bin')))).to.equal(0);

    // A deleted file invalidates the cache even though the stamp matches.
    fs.rmSync(path.join(d, 'test_batch.bin'));
    ensureSyntheticCifar10(d, { ...opts, seed: 12 });
    expect(readCifar('cifar10', d, 'test').count).to.equal(10);
    expect(fs.readdirSync(d).filter((n) => n.includes('.tmp-'))).to.deep.equal([]);
  });

  describe('learnability', () => {
    // Cheap, engine-independent evidence that the classes are separable by
    // spatial structure but not by colour: nearest-class-centroid on
    // (a) the magnitude of a low-frequency 2-D DFT of the grey image (phase
    // invariant, so random phase/shift do not matter) versus (b) the mean RGB.
    const K = 6;
    const NK = 2 * K + 1;
    const cosT = new Float64Array(32 * 32);
    const sinT = new Float64Array(32 * 32);
    for (let k = 0; k < 32; k++) {
      for (let x = 0; x < 32; x++) {
        cosT[k * 32 + x] = Math.cos((2 * Math.PI * k * x) / 32);
        sinT[k * 32 + x] = -Math.sin((2 * Math.PI * k * x) / 32);
      }
    }
    const tw = (k) => (k + 32) % 32;

    function spectrum(images, i) {
      const g = new Float64Array(1024);
      let mean = 0;
      for (let p = 0; p < 1024; p++) {
        g[p] = images[i * IMG + p] + images[i * IMG + 1024 + p] + images[i * IMG + 2048 + p];
        mean += g[p];
      }
      mean /= 1024;
      const re = new Float64Array(32 * NK);
      const im = new Float64Array(32 * NK);
      for (let y = 0; y < 32; y++) {
        for (let a = 0; a < NK; a++) {
          const k = tw(a - K) * 32;
          let sr = 0;
          let si = 0;
          for (let x = 0; x < 32; x++) {
            const v = g[y * 32 + x] - mean;
            sr += v * cosT[k + x];
            si += v * sinT[k + x];
          }
          re[y * NK + a] = sr;
          im[y * NK + a] = si;
        }
      }
      const f = [];
      let norm = 0;
      for (let ky = 0; ky <= K; ky++) {
        for (let a = 0; a < NK; a++) {
          let sr = 0;
          let si = 0;
          for (let y = 0; y < 32; y++) {
            const c = cosT[ky * 32 + y];
            const s = sinT[ky * 32 + y];
            sr += re[y * NK + a] * c - im[y * NK + a] * s;
            si += re[y * NK + a] * s + im[y * NK + a] * c;
          }
          const m = Math.hypot(sr, si);
          f.push(m);
          norm += m * m;
        }
      }
      norm = Math.sqrt(norm) || 1;
      return f.map((v) => v / norm);
    }

    function meanColour(images, i) {
      const f = [0, 0, 0];
      for (let c = 0; c < 3; c++) {
        for (let p = 0; p < 1024; p++) f[c] += images[i * IMG + c * 1024 + p];
        f[c] /= 1024;
      }
      return f;
    }

    function centroidAccuracy(feature, train, test) {
      const sums = [];
      const counts = new Array(train.classes).fill(0);
      for (let i = 0; i < train.count; i++) {
        const f = feature(train.images, i);
        const l = train.labels[i];
        sums[l] ??= new Array(f.length).fill(0);
        f.forEach((v, j) => (sums[l][j] += v));
        counts[l]++;
      }
      const centroids = sums.map((s, l) => s.map((v) => v / counts[l]));
      let correct = 0;
      for (let i = 0; i < test.count; i++) {
        const f = feature(test.images, i);
        let best = -1;
        let bestDist = Infinity;
        centroids.forEach((c, l) => {
          let d = 0;
          for (let j = 0; j < f.length; j++) d += (c[j] - f[j]) ** 2;
          if (d < bestDist) {
            bestDist = d;
            best = l;
          }
        });
        if (best === test.labels[i]) correct++;
      }
      return correct / test.count;
    }

    it('is separable by spatial structure but not by mean colour', () => {
      const d = mk();
      writeSyntheticCifar10(d, { train: 1000, test: 500, seed: 2024 });
      const train = readCifar('cifar10', d, 'train');
      const test = readCifar('cifar10', d, 'test');
      const structure = centroidAccuracy(spectrum, train, test);
      const colour = centroidAccuracy(meanColour, train, test);
      expect(structure, 'spectrum centroid accuracy').to.be.above(0.8);
      expect(colour, 'mean-colour centroid accuracy').to.be.below(0.6);
      expect(structure - colour).to.be.above(0.3);
    });
  });
});
