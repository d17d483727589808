/**
 * MNIST and Fashion-MNIST as the CNNs take them: the four IDX files as distributed
 * (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz,
 * t10k-labels-idx1-ubyte.gz; or the same names without .gz), each 28×28 grey image centred in a
 * 32×32 frame of black (2 pixels each side) and repeated in the three channels. The models, the
 * batcher's augmentation (a random 32×32 crop of the image padded by 4, a horizontal flip) and the
 * checkpoints are then those of CIFAR.
 */
import * as path from 'node:path';
import { DataError } from '../base/errors.js';
import { statOrNull } from '../base/files.js';
import { CIFAR_CHANNELS, CIFAR_HEIGHT, CIFAR_IMAGE_BYTES, CIFAR_WIDTH, type ImageSet, type Split } from './cifar.js';
import { readIdx } from './idx.js';

export type MnistName = 'fashion-mnist' | 'mnist';

export const MNIST_SIDE = 28;
export const MNIST_CLASSES = 10;
/** Black pixels on each side of a 28×28 image in its 32×32 frame. */
const BORDER = (CIFAR_HEIGHT - MNIST_SIDE) / 2;

const TITLES: Record<MnistName, string> = { 'fashion-mnist': 'Fashion-MNIST', mnist: 'MNIST' };
const PREFIX: Record<Split, string> = { train: 'train', test: 't10k' };

/** The file of one split's images or labels in `dir`: the .gz as distributed, else the plain file. */
function locate(name: MnistName, dir: string, split: Split, what: 'images-idx3' | 'labels-idx1'): string {
  const base = path.join(dir, `${PREFIX[split]}-${what}-ubyte`);
  for (const file of [`${base}.gz`, base]) {
    const st = statOrNull(file, DataError);
    if (st === null) continue;
    if (!st.isFile()) throw new DataError(`${TITLES[name]} ${split} file is not a regular file: ${file}`);
    return file;
  }
  throw new DataError(`${TITLES[name]} ${split} split: missing ${path.basename(base)}.gz in ${dir}`);
}

/** One split of MNIST or Fashion-MNIST from `dir`, in CIFAR's layout (count × 3 × 32 × 32 bytes). */
export function readMnist(name: MnistName, dir: string, split: Split): ImageSet {
  const dirStat = statOrNull(dir, DataError);
  if (dirStat === null) throw new DataError(`data directory not found: ${dir}`);
  if (!dirStat.isDirectory()) throw new DataError(`data directory is not a directory: ${dir}`);
  const imageFile = locate(name, dir, split, 'images-idx3');
  const labelFile = locate(name, dir, split, 'labels-idx1');
  const images = readIdx(imageFile, 3, [MNIST_SIDE, MNIST_SIDE]);
  const labels = readIdx(labelFile, 1, []);
  const count = images.dims[0]!;
  if (labels.dims[0] !== count) throw new DataError(`${labelFile}: ${labels.dims[0]} labels for the ${count} images of ${imageFile}`);
  const out: ImageSet = {
    images: new Uint8Array(count * CIFAR_IMAGE_BYTES),
    labels: new Int32Array(count),
    count,
    classes: MNIST_CLASSES,
    height: 32,
    width: 32,
    channels: 3,
  };
  const pixels = MNIST_SIDE * MNIST_SIDE;
  const plane = CIFAR_HEIGHT * CIFAR_WIDTH;
  for (let i = 0; i < count; i++) {
    const label = labels.data[i]!;
    if (label >= MNIST_CLASSES)
      throw new DataError(`${labelFile}: label ${label} of item ${i} at byte offset ${8 + i}; ${TITLES[name]} labels must be 0..${MNIST_CLASSES - 1}`);
    out.labels[i] = label;
    const src = images.data.subarray(i * pixels, (i + 1) * pixels);
    const first = out.images.subarray(i * CIFAR_IMAGE_BYTES, i * CIFAR_IMAGE_BYTES + plane);
    for (let y = 0; y < MNIST_SIDE; y++) first.set(src.subarray(y * MNIST_SIDE, (y + 1) * MNIST_SIDE), (y + BORDER) * CIFAR_WIDTH + BORDER);
    for (let c = 1; c < CIFAR_CHANNELS; c++) out.images.copyWithin(i * CIFAR_IMAGE_BYTES + c * plane, i * CIFAR_IMAGE_BYTES, i * CIFAR_IMAGE_BYTES + plane);
  }
  return out;
}
