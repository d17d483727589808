// What the Accordion-in-training suites (test/train/) share: a tiny synthetic CIFAR-10 with the options of
// a run on it, and comparisons of saved states and of metrics.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { expect } from 'chai';
import { ensureSyntheticCifar10 } from '../../lib/index.js';
import { float32Of as floatsOf } from './outside.js';

/**
 * In a suite's body: a temporary root, removed after the suite, with a tiny synthetic CIFAR-10 made in
 * it before the suite. Returns runDir(name), a directory under the root, and base(), the options of a
 * small ResNet-18 run on that data (a quarter of the width: what these suites check does not depend
 * on it).
 */
export function trainingRuns() {
  let root;
  let dataDir;
  const tiny = { train: 64, test: 32, seed: 42 };

  before(function () {
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-training-'));
    // Generated once here, so that two ranks never race to write the cache.
    dataDir = ensureSyntheticCifar10(path.join(root, 'data'), tiny);
  });

  after(function () {
    if (root) fs.rmSync(root, { recursive: true, force: true });
  });

  const runDir = (name) => path.join(root, name);
  const base = () => ({
    model: 'resnet18',
    width: 0.25,
    dataset: 'synthetic',
    dataDir,
    syntheticTrain: tiny.train,
    syntheticTest: tiny.test,
    seed: tiny.seed,
    batchSize: 16,
    evalBatchSize: 32,
    warmupEpochs: 0,
    progress: false,
  });

  return { runDir, base };
}

export function withoutTime(events) {
  return events.map(({ time, ...rest }) => rest);
}

export function byName(tensors) {
  return new Map([...tensors].map((t) => [t.name, t]));
}

/** The first entry in which two state lists differ (name, dtype, shape or bytes), or undefined. */
export function firstDifference(a, b) {
  const names = (s) => s.map((t) => t.name).join(',');
  if (names(a) !== names(b)) return `entry lists differ: ${names(a)} vs ${names(b)}`;
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    const y = b[i];
    if (x.dtype !== y.dtype || x.shape.join('x') !== y.shape.join('x')) return `${x.name}: ${x.dtype} ${x.shape} vs ${y.dtype} ${y.shape}`;
    if (Buffer.compare(Buffer.from(x.data.buffer, x.data.byteOffset, x.data.byteLength), Buffer.from(y.data.buffer, y.data.byteOffset, y.data.byteLength)) !== 0)
      return `${x.name}: bytes differ`;
  }
  return undefined;
}

export function sameBytes(x, y) {
  return Buffer.compare(Buffer.from(x.data.buffer, x.data.byteOffset, x.data.byteLength), Buffer.from(y.data.buffer, y.data.byteOffset, y.data.byteLength)) === 0;
}

/** Largest |got − want| over float tensors, relative to max(|want|∞, 1e-3); worst entry named. */
export function worstRelativeDifference(got, want) {
  let worst = { rel: 0, name: undefined };
  for (const [name, w] of want) {
    if (w.dtype !== 'F32') continue;
    const g = got.get(name);
    expect(g, `missing ${name}`).to.not.equal(undefined);
    const a = floatsOf(g);
    const b = floatsOf(w);
    let scale = 1e-3;
    for (const v of b) scale = Math.max(scale, Math.abs(v));
    let diff = 0;
    for (let i = 0; i < b.length; i++) diff = Math.max(diff, Math.abs(a[i] - b[i]));
    if (!(diff / scale <= worst.rel)) worst = { rel: diff / scale, name };
  }
  return worst;
}
