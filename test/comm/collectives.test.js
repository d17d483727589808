// Collectives between real worker processes on 127.0.0.1, 2 and 4 of them: every operation, length
// and dtype against sums worked out here.
import { expect } from 'chai';
import { dataFor } from '../helpers/collective-worker.js';
import { decode, killLive, runJob } from '../helpers/collective-jobs.js';
import { roundTo } from '../../lib/testing.js';

function lengthOf(c, rank) {
  return c.lengths ? c.lengths[rank] : c.length;
}

/**
 * Float32 sum in rank order, and the sum of magnitudes that bounds its rounding error: Gloo may add
 * in another order, so an element whose terms cancel can differ by a few ulps of the terms.
 */
function expectedSum(worldSize, length, salt) {
  const sum = new Float32Array(length);
  const scale = new Float64Array(length);
  for (let r = 0; r < worldSize; r++) {
    const d = dataFor(r, length, salt);
    for (let i = 0; i < length; i++) {
      sum[i] = Math.fround(sum[i] + d[i]);
      scale[i] += Math.abs(d[i]);
    }
  }
  return { sum, scale };
}

function expectClose(got, want, scale, label) {
  expect(got.length, `${label}: length`).to.equal(want.length);
  let worst = -1;
  let worstRatio = 0;
  for (let i = 0; i < want.length; i++) {
    const ratio = Math.abs(got[i] - want[i]) / Math.max(scale[i], 1e-30);
    if (!(ratio <= worstRatio)) {
      worst = i;
      worstRatio = ratio;
    }
  }
  expect(worstRatio, `${label}: element ${worst} is ${got[worst]}, expected ${want[worst]}`).to.be.at.most(1e-6);
}

function expectExact(got, want, label) {
  expect(got.length, `${label}: length`).to.equal(want.length);
  for (let i = 0; i < want.length; i++)
    if (!Object.is(got[i], want[i])) expect.fail(`${label}: element ${i} is ${got[i]}, expected ${want[i]}`);
}

function concat(arrays) {
  const out = new Float32Array(arrays.reduce((n, a) => n + a.length, 0));
  let at = 0;
  for (const a of arrays) {
    out.set(a, at);
    at += a.length;
  }
  return out;
}

function casesFor(worldSize) {
  const last = worldSize - 1;
  // Unequal all-gathers: one rank (or all but one) contributes nothing.
  const unequal =
    worldSize === 2
      ? [[0, 5], [1001, 0], [3, 7]]
      : [[5, 0, 7, 1], [0, 0, 0, 3], [1001, 1, 0, 2]];
  const cases = [
    // 2,500,003 floats travel in three segments between two ranks (4 MiB each, the last one short).
    ...[0, 1, 7, 1001, 1_000_003, 2_500_003].map((length) => ({ op: 'allReduce', length })),
    ...[0, 1, 7, 1001].map((length) => ({ op: 'allReduce', length, average: true })),
    // Sent in 16 bits, summed in fp32: an all-to-all of shares, then an all-gather of their sums
    // (5 MB in bf16: two segments between two ranks).
    ...[1, 7, 1001, 2_500_003].map((length) => ({ op: 'allReduce', length, commDtype: 'bf16' })),
    ...[1, 1001].map((length) => ({ op: 'allReduce', length, commDtype: 'fp16' })),
    ...[0, 1, 7, 1001, 2_500_003].map((length) => ({ op: 'allGather', length })),
    ...unequal.map((lengths) => ({ op: 'allGather', lengths })),
    { op: 'allGather', lengths: new Array(worldSize).fill(0) },
    ...[0, 1, 7, 1001].map((length) => ({ op: 'broadcast', length, root: 0 })),
    ...[0, 7, 1001].map((length) => ({ op: 'broadcast', length, root: last })),
    ...(worldSize > 2 ? [{ op: 'broadcast', length: 7, root: 1 }] : []),
    // Ranks arrive in reverse order, the last one 400 ms after the first.
    { op: 'barrier', sleepByRank: Array.from({ length: worldSize }, (_, r) => (last - r) * (400 / last)) },
  ];
  return cases.map((c, i) => ({ ...c, salt: 0.37 * i }));
}

/**
 * The all-reduce of values sent in `dtype`, by its documented steps: every rank's value divided by
 * W and rounded, the shares summed in fp32 in rank order, the sum rounded and multiplied by W.
 */
function expectedSumIn(dtype, worldSize, length, salt) {
  const parts = Array.from({ length: worldSize }, (_, r) => roundTo(dataFor(r, length, salt).map((v) => v * Math.fround(1 / worldSize)), dtype));
  const share = new Float32Array(length);
  for (const part of parts) for (let i = 0; i < length; i++) share[i] = Math.fround(share[i] + part[i]);
  return roundTo(share, dtype).map((v) => v * worldSize);
}

function describeCase(c) {
  if (c.op === 'barrier') return 'barrier (ranks arriving 400 ms apart)';
  const size = c.lengths ? `lengths [${c.lengths}]` : `length ${c.length}`;
  const extra = c.average ? ', average' : c.root !== undefined ? `, root ${c.root}` : c.commDtype ? `, sent in ${c.commDtype}` : '';
  return `${c.op} (${size}${extra})`;
}

afterEach(killLive);

for (const worldSize of [2, 4]) {
  describe(`collectives between ${worldSize} worker processes`, function () {
    const cases = casesFor(worldSize);
    let outputs;

    before(async function () {
      outputs = await runJob(worldSize, { cases, encoding: 'base64' });
      expect(outputs.map((o) => o.rank)).to.deep.equal(Array.from({ length: worldSize }, (_, r) => r));
    });

    after(killLive);

    const exactly = (c, got, rank, values) => expectExact(got, values, `rank ${rank}`);
    /** One test per case of `op`: what every rank must hold, worked out once, then each rank's output against it (exactly unless `check` says otherwise). */
    const each = (op, want, check = exactly) => {
      cases.forEach((c, index) => {
        if (c.op !== op) return;
        it(describeCase(c), () => {
          const expected = want(c);
          for (const out of outputs) check(c, decode(out.results[index]), out.rank, expected);
        });
      });
    };

    each(
      'allReduce',
      (c) => {
        if (c.commDtype) return { values: expectedSumIn(c.commDtype, worldSize, c.length, c.salt) };
        const { sum, scale } = expectedSum(worldSize, c.length, c.salt);
        return c.average ? { values: sum.map((v) => Math.fround(v / worldSize)), bound: scale.map((v) => v / worldSize) } : { values: sum, bound: scale };
      },
      // Every rank holds exactly the same sums in 16 bits: each share is summed on one rank, in rank
      // order. In fp32 two ranks add once, and a + b is b + a: every rank holds exactly the float32 sum.
      (c, got, rank, { values, bound }) => (c.commDtype || worldSize === 2 ? exactly(c, got, rank, values) : expectClose(got, values, bound, `rank ${rank}`)),
    );

    each(
      'allGather',
      (c) => concat(Array.from({ length: worldSize }, (_, r) => dataFor(r, lengthOf(c, r), c.salt))),
    );

    each(
      'broadcast',
      (c) => dataFor(c.root, c.length, c.salt),
    );

    cases.forEach((c, index) => {
      if (c.op !== 'barrier') return;
      it(describeCase(c), () => {
        const times = outputs.map((o) => o.times[index]);
        const lastArrival = Math.max(...times.map(([entered]) => entered));
        const firstDeparture = Math.min(...times.map(([, left]) => left));
        expect(firstDeparture, 'a rank left the barrier before the last one reached it').to.be.at.least(lastArrival);
      });
    });
  });
}
