// Bad inputs through the public API (accordion-engine and accordion-engine/testing), each with the
// code its error must carry. Run as a script, it tries every case in turn, writing "start NAME" before
// each and one JSON line after it, so that a case which kills the process (a signal) is named by the
// last "start" line. test/cli/errors.test.js runs it in a child process.
import { pathToFileURL } from 'node:url';
import { AccordionError, Batcher, Model, setThreads } from 'accordion-engine';
import { LayerProbe, ReducerProbe, crossEntropy, orthogonalize } from 'accordion-engine/testing';
import { binding } from '../../lib/native/binding.js';

const images = (count, labels = Array.from({ length: count }, (_, i) => i % 10)) => ({
  images: new Uint8Array(count * 3072),
  labels: Int32Array.from(labels),
  count,
  classes: 10,
});
// A probe that got built is also run, forward and backward, as a caller would.
function forwardBackward(probe, shape) {
  const n = shape.reduce((a, b) => a * b, 1);
  const { data } = probe.forward(Float32Array.from({ length: n }, (_, i) => Math.sin(i)), shape);
  probe.backward(new Float32Array(data.length).fill(1));
}
const conv = () => new LayerProbe('conv2d', { inChannels: 1, outChannels: 1, kernel: 3, stride: 2 });

export const CASES = [
  // LayerProbe, every kind
  { name: 'batchnorm2d with 0 channels', code: 'ERR_OUT_OF_RANGE', run: () => forwardBackward(new LayerProbe('batchnorm2d', { channels: 0 }), [1, 1, 2, 2]) },
  { name: 'batchnorm2d with -3 channels', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('batchnorm2d', { channels: -3 }) },
  { name: 'batchnorm2d on an input with 0 rows', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('batchnorm2d', { channels: 2 }).forward(new Float32Array(0), [0, 2, 3, 3]) },
  { name: 'conv2d with kernel 0', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('conv2d', { kernel: 0 }) },
  { name: 'conv2d with stride 0', code: 'ERR_OUT_OF_RANGE', run: () => forwardBackward(new LayerProbe('conv2d', { stride: 0 }), [1, 1, 4, 4]) },
  { name: 'conv2d with padding -1', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('conv2d', { padding: -1 }) },
  { name: 'conv2d with 1e12 input channels', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('conv2d', { inChannels: 1e12 }) },
  { name: 'conv2d with a fractional kernel', code: 'ERR_INVALID_ARG_TYPE', run: () => new LayerProbe('conv2d', { kernel: 2.5 }) },
  { name: 'conv2d with a weight of 2^32 elements', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('conv2d', { inChannels: 65536, outChannels: 65536 }) },
  { name: 'conv2d on an input smaller than its kernel (stride 2)', code: 'ERR_INVALID_ARGUMENT', run: () => conv().forward(new Float32Array(4), [1, 1, 2, 2]) },
  { name: 'conv2d on a 3-D input', code: 'ERR_INVALID_ARGUMENT', run: () => conv().forward(new Float32Array(16), [1, 4, 4]) },
  { name: 'conv2d on a shape whose product overflows int64', code: 'ERR_OUT_OF_RANGE', run: () => conv().forward(new Float32Array(4), [2 ** 40, 1, 2 ** 40, 2 ** 40]) },
  { name: 'conv2d with an output beyond the probe bound', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('conv2d', { outChannels: 65536, kernel: 1 }).forward(new Float32Array(4096), [1, 1, 64, 64]) },
  { name: 'maxpool2d with kernel 0', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('maxpool2d', { kernel: 0 }) },
  { name: 'maxpool2d with stride 0', code: 'ERR_OUT_OF_RANGE', run: () => forwardBackward(new LayerProbe('maxpool2d', { stride: 0 }), [1, 1, 4, 4]) },
  { name: 'maxpool2d with padding above half its kernel', code: 'ERR_INVALID_ARGUMENT', run: () => new LayerProbe('maxpool2d', { kernel: 2, padding: 2 }) },
  { name: 'maxpool2d on an input smaller than its window', code: 'ERR_INVALID_ARGUMENT', run: () => new LayerProbe('maxpool2d', { kernel: 3, stride: 3 }).forward(new Float32Array(4), [1, 1, 2, 2]) },
  { name: 'relu on a shape with a negative dimension', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('relu').forward(new Float32Array(4), [2, -2]) },
  { name: 'globalavgpool on a 0×3 image', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('globalavgpool').forward(new Float32Array(0), [1, 2, 0, 3]) },
  { name: 'globalavgpool on a 2-D input', code: 'ERR_INVALID_ARGUMENT', run: () => new LayerProbe('globalavgpool').forward(new Float32Array(6), [2, 3]) },
  { name: 'flatten on a shape with no dimensions', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('flatten').forward(new Float32Array(1), []) },
  { name: 'linear with 0 input features', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('linear', { inFeatures: 0 }) },
  { name: 'linear with NaN output features', code: 'ERR_INVALID_ARG_TYPE', run: () => new LayerProbe('linear', { outFeatures: NaN }) },
  { name: 'linear with a 50000×50000 weight', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('linear', { inFeatures: 50000, outFeatures: 50000 }) },
  { name: 'linear on the wrong feature count', code: 'ERR_INVALID_ARGUMENT', run: () => new LayerProbe('linear', { inFeatures: 3 }).forward(new Float32Array(8), [2, 4]) },
  { name: 'dropout with p = 1', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('dropout', { p: 1 }) },
  { name: 'dropout with p = -0.5', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('dropout', { p: -0.5 }) },
  { name: 'basicblock with 0 planes', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('basicblock', { planes: 0 }) },
  { name: 'basicblock with stride 0', code: 'ERR_OUT_OF_RANGE', run: () => new LayerProbe('basicblock', { stride: 0 }) },
  { name: 'basicblock on an input with the wrong channels', code: 'ERR_INVALID_ARGUMENT', run: () => new LayerProbe('basicblock', { inPlanes: 2, planes: 2 }).forward(new Float32Array(48), [1, 3, 4, 4]) },
  { name: 'an unknown layer kind', code: 'ERR_INVALID_ARGUMENT', run: () => new LayerProbe('lstm') },
  { name: 'a layer kind that is not a string', code: 'ERR_INVALID_ARG_TYPE', run: () => new LayerProbe(42) },
  { name: 'layer options that are not an object', code: 'ERR_INVALID_ARG_TYPE', run: () => new LayerProbe('relu', 'fast') },
  { name: 'backward before forward', code: 'ERR_INVALID_STATE', run: () => new LayerProbe('relu').backward(new Float32Array(4)) },
  { name: 'backward with the wrong length', code: 'ERR_INVALID_ARG_TYPE', run: () => { const p = new LayerProbe('relu'); p.forward(new Float32Array(4), [4]); p.backward(new Float32Array(3)); } },
  { name: 'setValue of an unknown tensor', code: 'ERR_INVALID_ARGUMENT', run: () => new LayerProbe('linear').setValue('gamma', new Float32Array(1)) },
  { name: 'setValue with a name that is not a string', code: 'ERR_INVALID_ARG_TYPE', run: () => new LayerProbe('linear').setValue({}, new Float32Array(1)) },
  // ReducerProbe
  { name: 'ReducerProbe with a 0×4 parameter', code: 'ERR_OUT_OF_RANGE', run: () => new ReducerProbe([[0, 4]], {}) },
  { name: 'ReducerProbe with a 2^30×2^30 parameter', code: 'ERR_OUT_OF_RANGE', run: () => new ReducerProbe([[2 ** 30, 2 ** 30]], {}) },
  { name: 'ReducerProbe with 0 workers', code: 'ERR_OUT_OF_RANGE', run: () => new ReducerProbe([[4, 4]], { workers: 0 }) },
  { name: 'ReducerProbe with 1e9 workers', code: 'ERR_OUT_OF_RANGE', run: () => new ReducerProbe([[4, 4]], { workers: 1e9 }) },
  { name: 'ReducerProbe with an unknown compressor', code: 'ERR_INVALID_ARGUMENT', run: () => new ReducerProbe([[4, 4]], { compressor: 'zip' }) },
  { name: 'ReducerProbe with a group that is not a ProcessGroup', code: 'ERR_USAGE', run: () => new ReducerProbe([[4, 4]], { group: {} }) },
  { name: 'ReducerProbe step with gradients of the wrong type', code: 'ERR_INVALID_ARG_TYPE', run: () => new ReducerProbe([[2, 2]], {}).step([[[1, 2, 3, 4]]]) },
  { name: 'ReducerProbe step with too few gradients', code: 'ERR_INVALID_ARG_TYPE', run: () => new ReducerProbe([[2, 2], [3]], {}).step([[new Float32Array(4)]]) },
  { name: 'ReducerProbe memory of a worker it does not have', code: 'ERR_OUT_OF_RANGE', run: () => new ReducerProbe([[2, 2]], {}).memory(5, 0) },
  { name: 'ReducerProbe q of parameter -1', code: 'ERR_OUT_OF_RANGE', run: () => new ReducerProbe([[2, 2]], { compressor: 'powersgd' }).q(0, -1) },
  { name: 'ReducerProbe randomize with seed NaN', code: 'ERR_INVALID_ARG_TYPE', run: () => new ReducerProbe([[2, 2]], {}).randomize(NaN) },
  // crossEntropy and orthogonalize
  { name: 'crossEntropy with n = 0', code: 'ERR_OUT_OF_RANGE', run: () => crossEntropy(new Float32Array(0), 0, 3, new Int32Array(0)) },
  { name: 'crossEntropy with n·k beyond int64', code: 'ERR_OUT_OF_RANGE', run: () => crossEntropy(new Float32Array(4), 2 ** 40, 2 ** 40, new Int32Array(4)) },
  { name: 'orthogonalize with -1 rows', code: 'ERR_OUT_OF_RANGE', run: () => orthogonalize(new Float32Array(4), -1, 4) },
  // Model
  { name: 'Model.create with hidden 0', code: 'ERR_USAGE', run: () => Model.create({ architecture: 'lstm', classes: 10, hidden: 0 }) },
  { name: 'Model.create with 1e12 classes', code: 'ERR_USAGE', run: () => Model.create({ architecture: 'resnet18', classes: 1e12 }) },
  { name: 'Model.create of an LSTM larger than memory', code: 'ERR_USAGE', run: () => Model.create({ architecture: 'lstm', classes: 2 ** 31 - 1, hidden: 2 ** 20 }) },
  { name: 'Model.create with seed -1', code: 'ERR_USAGE', run: () => Model.create({ architecture: 'resnet18', seed: -1 }) },
  { name: 'Model.create with no options', code: 'ERR_USAGE', run: () => Model.create(null) },
  { name: 'Model.predict with sizes whose product overflows', code: 'ERR_USAGE', model: 'resnet18', run: (m) => m.predict(new Float32Array(12), 2 ** 40, 2 ** 40, 2 ** 40) },
  { name: 'Model.trainStep with labels outside the classes', code: 'ERR_USAGE', model: 'resnet18', run: (m) => m.trainStep({ images: new Float32Array(3072), labels: [10] }) },
  { name: 'Model.loadStateDict with a malformed entry', code: 'ERR_USAGE', model: 'resnet18', run: (m) => m.loadStateDict([{ name: 'linear.bias', dtype: 'F32' }]) },
  // Batcher
  { name: 'Batcher with a label outside the classes', code: 'ERR_USAGE', run: () => new Batcher(images(4, [0, 1, 12, 3]), { batchSize: 2 }) },
  { name: 'Batcher with a negative label', code: 'ERR_USAGE', run: () => new Batcher(images(4, [0, -1, 2, 3]), { batchSize: 2 }) },
  { name: 'Batcher with batch size 0', code: 'ERR_USAGE', run: () => new Batcher(images(4), { batchSize: 0 }) },
  { name: 'Batcher with no image set', code: 'ERR_USAGE', run: () => new Batcher(null, { batchSize: 2 }) },
  { name: 'Batcher with a standard deviation of 0', code: 'ERR_USAGE', run: () => new Batcher(images(4), { batchSize: 2, std: [0, 1, 1] }) },
  { name: 'Batcher.startEpoch(-1)', code: 'ERR_USAGE', run: () => new Batcher(images(4), { batchSize: 2 }).startEpoch(-1) },
  { name: 'setThreads(0)', code: 'ERR_USAGE', run: () => setThreads(0) },
  // The addon's own checks, behind the TypeScript ones
  { name: 'native Engine with 1e300 classes', code: 'ERR_OUT_OF_RANGE', run: () => new binding.Engine({ model: 'resnet18', classes: 1e300 }) },
  { name: 'native Engine with hidden 2^40', code: 'ERR_OUT_OF_RANGE', run: () => new binding.Engine({ model: 'lstm', classes: 10, hidden: 2 ** 40 }) },
  { name: 'native Engine with options that are not an object', code: 'ERR_INVALID_ARG_TYPE', run: () => new binding.Engine(7) },
  { name: 'native Batcher with batch size 1e30', code: 'ERR_OUT_OF_RANGE', run: () => new binding.Batcher(new Uint8Array(3072), new Int32Array(1), 10, { batchSize: 1e30 }) },
  { name: 'native Batcher with rank 3 of 2', code: 'ERR_OUT_OF_RANGE', run: () => new binding.Batcher(new Uint8Array(3072), new Int32Array(1), 10, { batchSize: 1, rank: 3, worldSize: 2 }) },
  { name: 'native Batcher with a mean of strings', code: 'ERR_INVALID_ARG_TYPE', run: () => new binding.Batcher(new Uint8Array(3072), new Int32Array(1), 10, { batchSize: 1, mean: ['a', 'b', 'c'] }) },
  { name: 'native setThreads with a string', code: 'ERR_INVALID_ARG_TYPE', run: () => binding.setThreads('many') },
];

/** Runs one case; resolves to { name, accordion, code, message } of its error (code null when none was thrown). */
export async function runCase(c) {
  let model;
  try {
    if (c.model) model = await Model.create({ architecture: c.model });
    await c.run(model);
    return { name: c.name, accordion: false, code: null, message: 'no error' };
  } catch (err) {
    return { name: c.name, accordion: err instanceof AccordionError, code: err?.code ?? null, message: String(err?.message ?? err) };
  } finally {
    await model?.dispose();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  for (const c of CASES) {
    process.stdout.write(`start ${c.name}\n`);
    process.stdout.write(JSON.stringify(await runCase(c)) + '\n');
  }
}
