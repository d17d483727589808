// The devices of the device-parametrised suites: the CPU always; cuda:0 when it can train, else its
// half of a suite is pending, unless ACCORDION_REQUIRE_GPU=1 (the GPU check, scripts/gpu-check/) makes a missing
// GPU a failure.
import { binding } from '../../lib/native/binding.js';

export const DEVICES = ['cpu', 'cuda'];

/** Why cuda:0 cannot train here, or null when it can. */
export function gpuUnavailable() {
  try {
    binding.checkDevice('cuda');
    return null;
  } catch (err) {
    return err;
  }
}

/** In a before() hook: skips the suite when `device` is a GPU this machine cannot use. */
export function requireDevice(context, device) {
  if (device === 'cpu') return;
  const cause = gpuUnavailable();
  if (cause && process.env.ACCORDION_REQUIRE_GPU === '1') throw new Error(`ACCORDION_REQUIRE_GPU=1 but cuda:0 cannot train: ${cause.message}`);
  if (cause) context.skip();
}
