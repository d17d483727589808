/**
 * What one worker's step costs apart from its collectives, measured on this machine for
 * `accordion plan`: a model of the run's configuration trains a few steps on random data alone
 * (compute), runs forward alone, and prices every level's compression kernels on the steps'
 * gradient sums (Model.levelCosts, as automatic levels do).
 */
import { Model } from '../engine/model.js';
import type { ImageBatch, TokenWindow } from '../engine/inputs.js';
import type { TrainConfig } from '../config/options.js';
import type { StepWork } from './predict.js';

/** Classes of an image dataset (the LSTM takes its vocabulary instead). */
function imageClasses(config: TrainConfig): number {
  return config.dataset === 'cifar100' ? 100 : 10;
}

function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  return s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/** The model of `config` (the LSTM's output over `vocabulary` words), compressing at `level` when given. */
function createModel(config: TrainConfig, vocabulary: number, level?: number): Promise<Model> {
  const lstm = config.model === 'lstm';
  return Model.create({
    architecture: config.model,
    classes: lstm ? vocabulary : imageClasses(config),
    ...(lstm ? { hidden: config.hidden, layers: config.layers } : { width: config.width }),
    seed: config.seed,
    ...(config.threads !== undefined ? { threads: config.threads } : {}),
    ...(level !== undefined ? { compressor: config.compressor, accumulateNorms: true, level } : {}),
  });
}

/** What the exchange carries: the parameter shapes, and the batch-norm statistics rank 0 broadcasts. */
async function layoutOf(model: Model): Promise<{ shapes: number[][]; broadcastFloats: number }> {
  const shapes = model.parameters().map((p) => [...p.shape]);
  const state = await model.stateDict();
  const broadcastFloats = state.filter((t) => /running_(mean|var)$/.test(t.name)).reduce((a, t) => a + t.shape.reduce((x, y) => x * y, 1), 0);
  return { shapes, broadcastFloats };
}

/** The layout of `config`'s model without timing anything. */
export async function modelLayout(config: TrainConfig, vocabulary: number): Promise<{ shapes: number[][]; broadcastFloats: number }> {
  const model = await createModel(config, vocabulary);
  try {
    return await layoutOf(model);
  } finally {
    await model.dispose();
  }
}

/**
 * Per level (0: dense), the work of one step of `config` with a batch of config.batchSize (a
 * window of config.bptt × batchSize tokens of a `vocabulary` for the LSTM): the median of `steps`
 * timed steps after one untimed, and the parameter shapes and batch-norm statistics the exchange
 * carries.
 */
export async function measureStepWork(
  config: TrainConfig,
  levels: number[],
  options: { vocabulary: number; steps?: number },
): Promise<{ shapes: number[][]; work: Map<number, StepWork> }> {
  const steps = options.steps ?? 3;
  const lstm = config.model === 'lstm';
  const classes = lstm ? options.vocabulary : imageClasses(config);
  const compressed = config.compressor !== 'none' && levels.some((l) => l > 0);
  const model = await createModel(config, options.vocabulary, compressed ? levels.find((l) => l > 0) : undefined);
  try {
    const b = config.batchSize;
    let seed = 1;
    const random = () => ((seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 2 ** 32);
    const batch: ImageBatch | TokenWindow = lstm
      ? {
          tokens: Int32Array.from({ length: config.bptt * b }, () => Math.floor(random() * classes)),
          targets: Int32Array.from({ length: config.bptt * b }, () => Math.floor(random() * classes)),
          steps: config.bptt,
          batch: b,
        }
      : { images: Float32Array.from({ length: b * 3 * 32 * 32 }, () => random() * 2 - 1), labels: Int32Array.from({ length: b }, () => Math.floor(random() * classes)) };
    const time = async (work: () => Promise<unknown>) => {
      const times: number[] = [];
      for (let i = 0; i <= steps; i++) {
        const start = performance.now();
        await work();
        if (i > 0) times.push((performance.now() - start) / 1000);
      }
      return median(times);
    };
    const computeSeconds = await time(() => model.trainStep(batch));
    const forwardSeconds = await time(() =>
      lstm ? model.forward((batch as TokenWindow).tokens as Int32Array, { train: true, steps: config.bptt, batch: b }) : model.forward((batch as ImageBatch).images, { train: true }),
    );
    // Kernel seconds per level, summed over the matrices, on the timed steps' gradient sums: the
    // median of `steps` pricings (they leave the sums as they are).
    const priced: number[][] = [];
    for (let i = 0; compressed && i < Math.max(steps, 1); i++) priced.push((await model.levelCosts(levels)).reduce((sums, list) => sums.map((x, k) => x + (list[k]?.seconds ?? 0)), levels.map(() => 0)));
    const { shapes, broadcastFloats } = await layoutOf(model);
    const work = new Map<number, StepWork>();
    levels.forEach((level, k) => {
      const compressionSeconds = priced.length ? median(priced.map((p) => p[k]!)) : 0;
      work.set(level, { computeSeconds, forwardSeconds, compressionSeconds, broadcastFloats });
    });
    return { shapes, work };
  } finally {
    await model.dispose();
  }
}
