/**
 * A native data loader: shuffles (DistributedSampler semantics when rank/worldSize are given),
 * augments (random crop with 4-pixel zero padding, horizontal flip) and normalises CIFAR images on a
 * background thread, a few batches ahead of training. The image and label arrays are read in place
 * and must not be modified while the batcher is alive. Give it the `device` of the model it feeds:
 * batches for a GPU are assembled in its layout in pinned memory, and copied while the previous
 * step runs.
 */
import { asNativeError, binding, call, type BatcherOptions, type NativeBatcher } from './native.js';
import { parseDevice } from './device.js';
import type { ImageSet } from './data/cifar.js';
import { UsageError } from './errors.js';

export type { BatcherOptions };

export class Batcher {
  /** @internal */
  readonly native: NativeBatcher;

  constructor(
    readonly images: ImageSet,
    options: Partial<BatcherOptions> & { batchSize: number },
  ) {
    if (!Number.isInteger(options.batchSize) || options.batchSize <= 0)
      throw new UsageError(`batchSize must be a positive integer, got ${options.batchSize}`);
    const device = parseDevice(options.device ?? 'cpu', 'batcher device');
    try {
      this.native = new binding.Batcher(images.images, images.labels, images.classes, {
        shuffle: true,
        augment: true,
        seed: 0,
        mean: [0, 0, 0],
        std: [1, 1, 1],
        ...options,
        device,
      });
    } catch (err) {
      throw asNativeError(err);
    }
  }

  /** Starts (or restarts) an epoch; its order depends only on the seed and the epoch number. */
  startEpoch(epoch: number): void {
    this.native.startEpoch(epoch);
  }

  /**
   * The next batch of the current epoch as float32 NCHW images (N, 3, 32, 32) and labels, or null at
   * the epoch's end. Do not mix with training on the same batcher: both consume its batches.
   */
  async next(): Promise<{ images: Float32Array; labels: Int32Array } | null> {
    return call(this.native.next());
  }

  get batchesPerEpoch(): number {
    return this.native.batchesPerEpoch;
  }

  get samplesPerEpoch(): number {
    return this.native.samplesPerEpoch;
  }
}
