import { expect } from 'chai';
import { Batcher } from '../../lib/index.js';

const MEAN = [0.4, 0.5, 0.6];
const STD = [0.2, 0.25, 0.3];

function imageSet(count, classes = 10) {
  const images = new Uint8Array(count * 3072);
  let state = 12345;
  for (let i = 0; i < images.length; i++) {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    images[i] = state >>> 24;
  }
  return { images, labels: Int32Array.from({ length: count }, (_, i) => i % classes), count, classes, height: 32, width: 32, channels: 3 };
}

/** The normalised NCHW float image of sample `s`, cropped by (dy, dx) with zero padding and optionally flipped. */
function reference(set, s, dy, dx, flip) {
  const out = new Float32Array(3072);
  for (let c = 0; c < 3; c++)
    for (let y = 0; y < 32; y++)
      for (let x = 0; x < 32; x++) {
        const sy = y + dy, sx = (flip ? 31 - x : x) + dx;
        const raw = sy >= 0 && sy < 32 && sx >= 0 && sx < 32 ? set.images[s * 3072 + c * 1024 + sy * 32 + sx] : 0;
        out[c * 1024 + y * 32 + x] = (raw / 255 - MEAN[c]) / STD[c];
      }
  return out;
}

function close(a, b) {
  for (let i = 0; i < a.length; i++) if (Math.abs(a[i] - b[i]) > 1e-5) return false;
  return true;
}

async function epochOf(batcher, epoch) {
  batcher.startEpoch(epoch);
  const batches = [];
  for (let b; (b = await batcher.next()); ) batches.push(b);
  return batches;
}

describe('native batcher', function () {
  it('without shuffling or augmentation yields the normalised images in order, last batch partial', async function () {
    const set = imageSet(10);
    const batcher = new Batcher(set, { batchSize: 4, shuffle: false, augment: false, mean: MEAN, std: STD });
    expect(batcher.batchesPerEpoch).to.equal(3);
    const batches = await epochOf(batcher, 0);
    expect(batches.map((b) => b.labels.length)).to.deep.equal([4, 4, 2]);
    batches.forEach((b, i) =>
      b.labels.forEach((label, j) => {
        const s = i * 4 + j;
        expect(label).to.equal(set.labels[s]);
        expect(close(b.images.subarray(j * 3072, (j + 1) * 3072), reference(set, s, 0, 0, false)), `sample ${s}`).to.equal(true);
      }),
    );
  });

  it('shuffles deterministically per (seed, epoch) and covers every sample once', async function () {
    const set = imageSet(50);
    // Identifies each delivered image by comparing it with every source image.
    const ids = async (seed, epoch) => {
      const b = new Batcher(set, { batchSize: 8, shuffle: true, augment: false, seed, mean: MEAN, std: STD });
      const out = [];
      for (const batch of await epochOf(b, epoch))
        for (let j = 0; j < batch.labels.length; j++) {
          const img = batch.images.subarray(j * 3072, (j + 1) * 3072);
          out.push([...Array(50).keys()].find((s) => close(img, reference(set, s, 0, 0, false))));
        }
      return out;
    };
    const a = await ids(1, 0);
    expect([...a].sort((x, y) => x - y)).to.deep.equal([...Array(50).keys()]);
    expect(await ids(1, 0)).to.deep.equal(a);
    expect(await ids(1, 1)).to.not.deep.equal(a);
    expect(await ids(2, 0)).to.not.deep.equal(a);
  });

  it('shards like DistributedSampler: ranks partition the padded permutation', async function () {
    const set = imageSet(10);
    const seen = [];
    for (let rank = 0; rank < 3; rank++) {
      const b = new Batcher(set, { batchSize: 2, shuffle: false, augment: false, rank, worldSize: 3, mean: MEAN, std: STD });
      expect(b.samplesPerEpoch).to.equal(4); // ceil(10 / 3)
      for (const batch of await epochOf(b, 0))
        for (let j = 0; j < batch.labels.length; j++) {
          const img = batch.images.subarray(j * 3072, (j + 1) * 3072);
          seen.push([rank, [...Array(10).keys()].find((s) => close(img, reference(set, s, 0, 0, false)))]);
        }
    }
    // Without shuffling, rank r takes indices r, r+3, … of [0..9, 0, 1] (padded by wrapping around).
    expect(seen.filter(([r]) => r === 0).map(([, s]) => s)).to.deep.equal([0, 3, 6, 9]);
    expect(seen.filter(([r]) => r === 1).map(([, s]) => s)).to.deep.equal([1, 4, 7, 0]);
    expect(seen.filter(([r]) => r === 2).map(([, s]) => s)).to.deep.equal([2, 5, 8, 1]);
  });

  it('augments each image by a crop within 4 pixels and an optional flip, reproducibly', async function () {
    const set = imageSet(16);
    const make = () => new Batcher(set, { batchSize: 16, shuffle: false, augment: true, seed: 3, mean: MEAN, std: STD });
    const [batch] = await epochOf(make(), 0);
    const [again] = await epochOf(make(), 0);
    expect(Buffer.from(batch.images.buffer).equals(Buffer.from(again.images.buffer))).to.equal(true);
    let flips = 0, shifted = 0;
    for (let s = 0; s < 16; s++) {
      const img = batch.images.subarray(s * 3072, (s + 1) * 3072);
      let match = null;
      for (let dy = -4; dy <= 4 && !match; dy++)
        for (let dx = -4; dx <= 4 && !match; dx++)
          for (const flip of [false, true]) if (!match && close(img, reference(set, s, dy, dx, flip))) match = { dy, dx, flip };
      expect(match, `sample ${s} is no crop/flip of its source`).to.not.equal(null);
      flips += match.flip;
      shifted += match.dy !== 0 || match.dx !== 0;
    }
    expect(flips).to.be.within(2, 14);
    expect(shifted).to.be.above(8);
  });

  it('rejects labels outside the class range and inconsistent sizes', function () {
    const set = imageSet(4);
    set.labels[2] = 10;
    expect(() => new Batcher(set, { batchSize: 2 })).to.throw(/label 10 of sample 2 is outside 0..9/);
    const short = imageSet(4);
    short.labels = new Int32Array(5);
    expect(() => new Batcher(short, { batchSize: 2 })).to.throw(/expected 15360 for 5 labels/);
  });
});
