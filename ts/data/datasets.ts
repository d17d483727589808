/**
 * Image datasets for training: the real CIFAR-10/100 files, MNIST and Fashion-MNIST in CIFAR's layout,
 * or a synthetic CIFAR-10-format set that is generated once into a cache directory (so the real
 * reader is what runs either way).
 */
import * as os from 'node:os';
import * as path from 'node:path';
import { readCifar, type ImageSet } from './cifar.js';
import { readMnist } from './mnist.js';
import { ensureSyntheticCifar10 } from './synthetic.js';
import { UsageError } from '../base/errors.js';

export type ImageDatasetName = 'cifar10' | 'cifar100' | 'fashion-mnist' | 'mnist' | 'synthetic';

export interface ImageDataset {
  name: ImageDatasetName;
  dir: string;
  classes: number;
  train: ImageSet;
  test: ImageSet;
  /** Per-channel normalisation on the [0, 1] scale. */
  mean: [number, number, number];
  std: [number, number, number];
}

const CIFAR10_MEAN: [number, number, number] = [125.3 / 255, 123.0 / 255, 113.9 / 255];
const CIFAR10_STD: [number, number, number] = [63.0 / 255, 62.1 / 255, 66.7 / 255];
const CIFAR100_MEAN: [number, number, number] = [0.50708, 0.48655, 0.44092];
const CIFAR100_STD: [number, number, number] = [0.26733, 0.25644, 0.27615];
/** Grey images repeated in three channels: the 28×28 training images' mean and deviation in each. */
const grey = (v: number): [number, number, number] => [v, v, v];
const MNIST_STATS = { 'fashion-mnist': { mean: grey(0.286), std: grey(0.353) }, mnist: { mean: grey(0.1307), std: grey(0.3081) } };

export interface SyntheticSize {
  train: number;
  test: number;
  seed: number;
}

export function defaultCacheDir(): string {
  return path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'accordion-engine');
}

export function loadImageDataset(name: ImageDatasetName, dir: string | undefined, synthetic: SyntheticSize): ImageDataset {
  if (name === 'synthetic') {
    const target = dir ?? path.join(defaultCacheDir(), `synthetic-${synthetic.train}-${synthetic.test}-${synthetic.seed}`);
    ensureSyntheticCifar10(target, synthetic);
    return { ...loadImageDataset('cifar10', target, synthetic), name: 'synthetic' };
  }
  if (dir === undefined) throw new UsageError(`dataset ${name} needs a data directory`);
  if (name === 'fashion-mnist' || name === 'mnist')
    return { name, dir, classes: 10, train: readMnist(name, dir, 'train'), test: readMnist(name, dir, 'test'), ...MNIST_STATS[name] };
  const cifar100 = name === 'cifar100';
  return {
    name,
    dir,
    classes: cifar100 ? 100 : 10,
    train: readCifar(name, dir, 'train'),
    test: readCifar(name, dir, 'test'),
    mean: cifar100 ? CIFAR100_MEAN : CIFAR10_MEAN,
    std: cifar100 ? CIFAR100_STD : CIFAR10_STD,
  };
}

/**
 * A dataset cut to the first `counts.train` training images and the first `counts.test` test images
 * (a split whose count is undefined, or not below its size, stays whole).
 */
export function firstImages(dataset: ImageDataset, counts: { train?: number; test?: number }): ImageDataset {
  const first = (split: ImageDataset['train'], count: number | undefined): ImageDataset['train'] => {
    if (count === undefined || count >= split.count) return split;
    const bytes = split.images.length / split.count;
    return { ...split, count, images: split.images.subarray(0, count * bytes), labels: split.labels.subarray(0, count) };
  };
  return { ...dataset, train: first(dataset.train, counts.train), test: first(dataset.test, counts.test) };
}
