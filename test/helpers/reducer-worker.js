// One worker of a real multi-process gradient exchange: connects through the environment (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ACCORDION_JOB_TOKEN), feeds its own gradients to a
// ReducerProbe bound to the process group for `steps` steps, and prints one JSON line with what
// came out of every step. argv[2] is the spec: { shapes, compressor, level, seed,
// minCompressionRate, steps, timeoutMs }.
//
// Arrays travel as base64 of their float32 bytes so that the test sees the exact values.
import { ReducerProbe } from '../../lib/testing.js';
import { printFromGroup, runAsWorker } from './worker.js';

/**
 * Rank `rank`'s gradient of parameter `param` at step `step`. Smooth in the index but different for
 * every (rank, step, param), with distinct magnitudes so that TopK's choice has no near-ties.
 */
export function gradientFor(rank, step, param, numel) {
  return Float32Array.from({ length: numel }, (_, i) =>
    Math.fround((1 + 0.3 * rank) * Math.sin(0.37 * i + 1.3 * rank + 0.71 * step + 2.1 * param) + 0.01 * ((i * 7 + rank) % 13)),
  );
}

export function numel(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

export function encode(array) {
  if (array === null) return null;
  return Buffer.from(array.buffer, array.byteOffset, array.byteLength).toString('base64');
}

export function decode(text) {
  if (text === null) return null;
  const bytes = Buffer.from(text, 'base64');
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

async function main(spec) {
  await printFromGroup(spec.timeoutMs ?? 30000, async (group, env) => {
    // step() is synchronous and blocks this event loop, which on rank 0 serves the job's store:
    // ranks still connecting to each other through the store would wait on it while rank 0 waits
    // on them in the first collective. Past an (asynchronous) barrier every rank is connected.
    await group.barrier();
    const probe = new ReducerProbe(spec.shapes, {
      compressor: spec.compressor,
      level: spec.level,
      seed: spec.seed,
      minCompressionRate: spec.minCompressionRate,
      group,
    });
    const steps = [];
    for (let s = 0; s < spec.steps; s++) {
      const grads = spec.shapes.map((shape, p) => gradientFor(env.rank, s, p, numel(shape)));
      const { outputs, floatsSent } = probe.step([grads]);
      steps.push({
        floatsSent,
        outputs: outputs[0].map(encode),
        memories: spec.shapes.map((_, p) => encode(probe.memory(0, p))),
        qs: spec.shapes.map((_, p) => encode(probe.q(0, p))),
      });
    }
    return { steps };
  });
}

runAsWorker(import.meta.url, main);
