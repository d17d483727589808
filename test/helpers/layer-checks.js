// What the layer suites (test/native/conv-batchnorm.test.js, test/native/layers.test.js) share: the
// suite's settings and its report of worst errors, and the comparisons their cases make.
import { expect, assert } from 'chai';
import os from 'node:os';
import { binding } from '../../lib/native/binding.js';

export const numel = (shape) => shape.reduce((a, b) => a * b, 1);
export const stateOf = (probe, name) => probe.state().find((e) => e.name === name);

// Worst relative error per layer, printed at the end of each suite when GRADCHECK_REPORT is set;
// useful when tuning tolerances or comparing oneDNN versions.
const report = new Map();
export function record(layer, results) {
  for (const r of results) {
    const key = `${layer} ${r.name}`;
    const prev = report.get(key);
    if (!prev || r.worstRel > prev.worstRel)
      report.set(key, { worstRel: r.worstRel, worstRatio: r.worst.ratio, checked: r.checked, retried: r.retried ?? 0 });
  }
  return results;
}

/** A forward's worst relative error against its float64 reference, for the report. */
export function recordForward(key, worstRel, checked) {
  report.set(key, { worstRel, worstRatio: NaN, checked });
}

/**
 * A suite of layer checks: finite differences run hundreds of forwards per tensor, on one OpenMP
 * thread (thousands of forwards on tiny tensors: with more threads each parallel region costs more
 * than the work, and on a loaded machine spinning threads made these checks 10× slower).
 */
export function layerSuite(title, body) {
  describe(title, function () {
    this.timeout(20000);
    before(() => binding.setThreads(1));
    after(() => binding.setThreads(Number(process.env.OMP_NUM_THREADS) || os.availableParallelism()));
    after(() => {
      if (!process.env.GRADCHECK_REPORT) return;
      const rows = [...report].map(([k, v]) => ({
        check: k,
        'worst rel err': v.worstRel.toExponential(2),
        'worst/tol': v.worstRatio.toFixed(3),
        entries: v.checked,
        retried: v.retried ?? '',
      }));
      console.table(rows);
      report.clear();
    });
    body();
  });
}

/** Runs fn and returns what it threw, failing the test when nothing was thrown. */
export function thrown(fn) {
  try {
    fn();
  } catch (err) {
    return err;
  }
  return assert.fail('expected an error to be thrown');
}

/**
 * Asserts |got[i] − want[i]| ≤ rtol·scale(i) everywhere, naming the worst entry on failure, and
 * returns the worst |got − want| / scale: the relative error on the scale that bounds it.
 */
export function expectClose(got, want, scale, rtol, what) {
  expect(got.length, `${what}: length`).to.equal(want.length);
  let worst = { k: -1, rel: 0 };
  for (let k = 0; k < want.length; k++) {
    const d = Math.abs(got[k] - want[k]);
    const rel = d === 0 ? 0 : d / scale(k);
    if (!(rel <= worst.rel)) worst = { k, rel };
  }
  const k = worst.k;
  if (!(worst.rel <= rtol))
    assert.fail(`${what}: entry ${k} is ${got[k]}, reference ${want[k]}: |Δ| exceeds ${rtol} × ${scale(k).toExponential(3)}`);
  return worst.rel;
}
