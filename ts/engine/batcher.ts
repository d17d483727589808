/**
 * A native data loader: shuffles (DistributedSampler semantics when rank/worldSize are given),
 * augments (random crop with 4-pixel zero padding, horizontal flip) and normalises CIFAR images on a
 * background thread, a few batches ahead of training. The image and label arrays are read in place
 * and must not be modified while the batcher is alive. Give it the `device` of the model it feeds:
 * batches for a GPU are assembled in its layout in pinned memory, and copied while the previous
 * step runs.
 */
import { binding, call, type BatcherOptions, type NativeBatcher } from '../native/binding.js';
import { parseDevice } from '../native/device.js';
import type { ImageSet } from '../data/cifar.js';
import { UsageError } from '../base/errors.js';

const IMAGE_BYTES = 3 * 32 * 32;

export type { BatcherOptions };

export class Batcher {
  /** @internal */
  readonly native: NativeBatcher;

  constructor(
    readonly images: ImageSet,
    options: Partial<BatcherOptions> & { batchSize: number },
  ) {
    checkImageSet(images);
    checkOptions(options);
    const device = parseDevice(options.device ?? 'cpu', 'batcher device');
    this.native = new binding.Batcher(images.images, images.labels, images.classes, {
      shuffle: true,
      augment: true,
      seed: 0,
      mean: [0, 0, 0],
      std: [1, 1, 1],
      ...options,
      device,
    });
  }

  /** Starts (or restarts) an epoch; its order depends only on the seed and the epoch number. */
  startEpoch(epoch: number): void {
    if (!Number.isSafeInteger(epoch) || epoch < 0) throw new UsageError(`startEpoch: epoch must be an integer ≥ 0, got ${String(epoch)}`);
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

/** An ImageSet of `count` 32×32 RGB images with a label in [0, classes) each. */
function checkImageSet(set: unknown): asserts set is ImageSet {
  if (typeof set !== 'object' || set === null) throw new UsageError(`Batcher: images must be an ImageSet ({ images, labels, classes }), got ${String(set)}`);
  const { images, labels, classes } = set as Partial<ImageSet>;
  if (!(images instanceof Uint8Array)) throw new UsageError('Batcher: images.images must be a Uint8Array of 3×32×32 bytes per image');
  if (!(labels instanceof Int32Array)) throw new UsageError('Batcher: images.labels must be an Int32Array');
  if (!Number.isInteger(classes) || classes! < 1 || classes! > 2 ** 31 - 1)
    throw new UsageError(`Batcher: images.classes must be a positive integer, got ${String(classes)}`);
  if (labels.length === 0) throw new UsageError('Batcher: the image set is empty (no labels)');
  if (images.length !== labels.length * IMAGE_BYTES)
    throw new UsageError(
      `Batcher: images hold ${images.length} bytes, expected ${labels.length * IMAGE_BYTES} for ${labels.length} labels (${IMAGE_BYTES} bytes per image)`,
    );
  for (let i = 0; i < labels.length; i++)
    if (labels[i]! < 0 || labels[i]! >= classes!)
      throw new UsageError(`Batcher: label ${labels[i]} of sample ${i} is outside 0..${classes! - 1} (the image set has ${classes} classes)`);
}

function checkOptions(options: unknown): asserts options is Partial<BatcherOptions> & { batchSize: number } {
  if (typeof options !== 'object' || options === null) throw new UsageError(`Batcher: options must be an object, got ${String(options)}`);
  const o = options as Partial<BatcherOptions>;
  if (!Number.isSafeInteger(o.batchSize) || o.batchSize! <= 0 || o.batchSize! > 2 ** 31 - 1)
    throw new UsageError(`batchSize must be a positive integer, got ${String(o.batchSize)}`);
  for (const key of ['shuffle', 'augment', 'dropLast', 'padShards'] as const)
    if (o[key] !== undefined && typeof o[key] !== 'boolean') throw new UsageError(`Batcher: ${key} must be a boolean, got ${String(o[key])}`);
  if (o.seed !== undefined && !(Number.isSafeInteger(o.seed) && o.seed >= 0))
    throw new UsageError(`Batcher: seed must be an integer ≥ 0, got ${String(o.seed)}`);
  const worldSize = o.worldSize ?? 1;
  if (!Number.isInteger(worldSize) || worldSize < 1) throw new UsageError(`Batcher: worldSize must be a positive integer, got ${String(worldSize)}`);
  const rank = o.rank ?? 0;
  if (!Number.isInteger(rank) || rank < 0 || rank >= worldSize) throw new UsageError(`Batcher: rank ${String(rank)} is outside a world of size ${worldSize}`);
  for (const key of ['mean', 'std'] as const) {
    const v = o[key];
    if (v === undefined) continue;
    if (!Array.isArray(v) || v.length !== 3 || v.some((x) => typeof x !== 'number' || !Number.isFinite(x) || (key === 'std' && !(x > 0))))
      throw new UsageError(`Batcher: ${key} must be 3 finite numbers${key === 'std' ? ', each positive' : ''}, got ${JSON.stringify(v)}`);
  }
}
