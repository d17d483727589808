// What a call throws, for the tests that go on to check the error's class, code and message.
import { expect } from 'chai';
import { AccordionError } from '../../lib/base/errors.js';

/** The value `fn()` throws, or undefined when it returns. */
export function thrownBy(fn) {
  try {
    fn();
  } catch (err) {
    return err;
  }
  return undefined;
}

/**
 * Runs fn, asserts it throws the engine's error of class `type` (an AccordionError named after its
 * class) with `code`, and returns the error for message checks.
 */
export function engineError(fn, type, code) {
  const caught = thrownBy(fn);
  expect(caught, `expected a ${type.name} to be thrown`).to.be.instanceOf(type);
  expect(caught).to.be.instanceOf(AccordionError);
  expect(caught.code).to.equal(code);
  expect(caught.name).to.equal(type.name);
  return caught;
}
