/**
 * Refuses, before any work, a run that cannot fit in this machine's memory, by a simple lower bound
 * on what its weights, optimiser state and activations take.
 */
import { UsageError } from '../base/errors.js';
import type { TrainConfig } from '../config/options.js';
import { parameterCount } from '../engine/parameter-count.js';

/**
 * Floats a model keeps per sample between the forward and the backward pass, counted low: for the
 * vision models the outputs of every convolution and of its batch norm on 32×32 inputs; for the
 * LSTM (per column of a batch) the four gates, cell and hidden state of every layer and step.
 */
function activationFloatsPerSample(c: TrainConfig): number {
  if (c.model === 'lstm') return c.bptt * c.layers * c.hidden * 6;
  return (c.model === 'vgg19bn' ? 2 * 303_104 : 2 * 614_400) * c.width;
}

/**
 * Parameters, counted low: the vision models' at 10 classes; the LSTM's recurrent layers only (the
 * vocabulary is not known yet).
 */
function parameterFloats(c: TrainConfig): number {
  return parameterCount({ architecture: c.model, classes: c.model === 'lstm' ? 0 : 10, width: c.width, hidden: c.hidden, layers: c.layers });
}

const GiB = 2 ** 30;
const gib = (bytes: number) => `${(bytes / GiB).toFixed(bytes < 10 * GiB ? 2 : 0)} GiB`;

/**
 * Refuses, before any work, a request that cannot fit in this machine's memory (os.totalmem()) by
 * a simple lower bound. Training needs 4 bytes × (3 × parameters [weights, gradients, momentum] +
 * batch size × activation floats per sample); evaluation 4 bytes × (parameters + evaluation batch
 * size × activation floats per sample). A synthetic dataset is held twice while it is generated
 * and read back: 2 × (train + test images) × 3,073 bytes.
 */
export function checkMemory(c: TrainConfig, memory: number): void {
  const params = parameterFloats(c);
  const perSample = activationFloatsPerSample(c);
  const have = `this machine has ${gib(memory)} of memory`;
  if (4 * 3 * params > memory)
    throw new UsageError(
      `option --hidden: ${c.hidden} with ${c.layers} layers has at least ${params.toExponential(2)} parameters; their weights, gradients and momentum ` +
        `alone take ${gib(4 * 3 * params)} (4 bytes × 3 × parameters), and ${have}`,
    );
  const train = 4 * (3 * params + c.batchSize * perSample);
  if (train > memory)
    throw new UsageError(
      `option --batch-size: a batch of ${c.batchSize} needs at least ${gib(train)} to train ${c.model} ` +
        `(4 bytes × (3 × ${params.toLocaleString('en-US')} parameters + ${c.batchSize} × ${perSample.toLocaleString('en-US')} activations per sample)), and ${have}`,
    );
  const evaluation = 4 * (params + c.evalBatchSize * perSample);
  if (evaluation > memory)
    throw new UsageError(
      `option --eval-batch-size: a batch of ${c.evalBatchSize} needs at least ${gib(evaluation)} to evaluate ${c.model} ` +
        `(4 bytes × (${params.toLocaleString('en-US')} parameters + ${c.evalBatchSize} × ${perSample.toLocaleString('en-US')} activations per sample)), and ${have}`,
    );
  if (c.dataset === 'synthetic') {
    const bytes = 2 * (c.syntheticTrain + c.syntheticTest) * 3073;
    if (bytes > memory) {
      const option = c.syntheticTrain >= c.syntheticTest ? '--synthetic-train' : '--synthetic-test';
      throw new UsageError(
        `option ${option}: ${c.syntheticTrain.toLocaleString('en-US')} train + ${c.syntheticTest.toLocaleString('en-US')} test synthetic images need ` +
          `${gib(bytes)} while they are generated and read (2 × images × 3,073 bytes), and ${have}`,
      );
    }
  }
}
