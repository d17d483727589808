// What the gradient-compression suites (test/compress/) share: ReducerProbe on the device of the suite
// that runs, seeded random gradients, and float32 results compared with float64 references.
import { expect } from 'chai';
import { ReducerProbe } from '../../lib/testing.js';
import { requireDevice } from './devices.js';
import { thrownBy } from './throws.js';

/** `n` standard normal floats from a seeded stream (makeRng), so that failures reproduce. */
export function randn(rng, n) {
  return Float32Array.from({ length: n }, () => rng.normal());
}

export function numelOf(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

export function f32(values) {
  return Float32Array.from(values.flat(Infinity));
}

function maxAbsDiff(a, b) {
  expect(a.length, 'length').to.equal(b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]));
  return worst;
}

export function maxAbs(a) {
  let m = 0;
  for (const v of a) m = Math.max(m, Math.abs(v));
  return m;
}

export function expectClose(actual, expected, tol, what) {
  const flat = Array.isArray(expected) ? expected.flat(Infinity) : expected;
  const d = maxAbsDiff(actual, flat);
  expect(d, `${what}: max |diff| ${d} > ${tol}\n got      ${Array.from(actual)}\n expected ${Array.from(flat)}`).to.be.at.most(tol);
}

export function expectEqualArrays(actual, expected, what) {
  expect(Array.from(actual), what).to.deep.equal(Array.from(expected));
}

export function frobenius(a) {
  let s = 0;
  for (const v of a) s += v * v;
  return Math.sqrt(s);
}

// The device the running suite's probes are built on: every oracle holds on the CPU and on a GPU alike.
let device = 'cpu';

/**
 * In a suite's body: its probes are built on `target` (the suite pending where that device cannot be
 * used), and on the CPU again after it.
 */
export function probesOn(target) {
  before(function () {
    requireDevice(this, target);
    device = target;
  });
  after(() => {
    device = 'cpu';
  });
}

/** The device the running suite's probes are built on. */
export function probeDevice() {
  return device;
}

export function probe(shapes, options) {
  return new ReducerProbe(shapes, { device, ...options });
}

// One worker, one parameter.
export function step1(p, g) {
  return p.step([[g]]).outputs[0][0];
}

export function expectThrowsCode(fn, code, messagePart) {
  const caught = thrownBy(fn);
  expect(caught, 'expected a throw').to.be.instanceOf(Error);
  expect(caught.code, caught.message).to.equal(code);
  if (messagePart) expect(caught.message).to.include(messagePart);
  return caught;
}
