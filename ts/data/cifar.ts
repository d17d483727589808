/**
 * Readers for the CIFAR-10 and CIFAR-100 "binary version" files
 * (https://www.cs.toronto.edu/~kriz/cifar.html).
 *
 * Each split is loaded into a single buffer that is then compacted in place,
 * so reading the 150 MB CIFAR-10 train split costs one allocation of the
 * file sizes and no second copy of the pixels.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';
import { DataError } from '../base/errors.js';
import { statOrNull } from '../base/files.js';

export const CIFAR_HEIGHT = 32;
export const CIFAR_WIDTH = 32;
export const CIFAR_CHANNELS = 3;
/** Pixel bytes per image: 1024 R, then 1024 G, then 1024 B, each plane row-major. */
export const CIFAR_IMAGE_BYTES = CIFAR_HEIGHT * CIFAR_WIDTH * CIFAR_CHANNELS;

export interface ImageSet {
  /** count × 3072 bytes, planar CHW per image, exactly as stored in the files. */
  images: Uint8Array;
  labels: Int32Array;
  count: number;
  classes: number;
  height: 32;
  width: 32;
  channels: 3;
}

export type DatasetName = 'cifar10' | 'cifar100';
export type Split = 'train' | 'test';

interface LabelField {
  /** Byte position inside the record. */
  offset: number;
  /** Number of valid values; labels must lie in 0..count-1. */
  count: number;
  what: string;
}

interface Format {
  title: string;
  /** Bytes of labels before the pixels of each record. */
  labelBytes: number;
  /** Every label byte is range-checked, even ones we do not return, because a bad one means a misaligned or foreign file. */
  fields: LabelField[];
  /** Index into `fields` of the label the ImageSet reports. */
  used: number;
  classes: number;
  files: Record<Split, string[]>;
  /** Subdirectory name the official archive extracts to, used only for a hint in error messages. */
  archiveDir: string;
  /** For CIFAR-10 train, any non-empty subset of the batches is acceptable; elsewhere every listed file is required. */
  anyOf: Record<Split, boolean>;
}

const FORMATS: Record<DatasetName, Format> = {
  cifar10: {
    title: 'CIFAR-10',
    labelBytes: 1,
    fields: [{ offset: 0, count: 10, what: 'label' }],
    used: 0,
    classes: 10,
    files: {
      train: [1, 2, 3, 4, 5].map((i) => `data_batch_${i}.bin`),
      test: ['test_batch.bin'],
    },
    archiveDir: 'cifar-10-batches-bin',
    anyOf: { train: true, test: false },
  },
  cifar100: {
    title: 'CIFAR-100',
    labelBytes: 2,
    fields: [
      { offset: 0, count: 20, what: 'coarse label' },
      { offset: 1, count: 100, what: 'fine label' },
    ],
    used: 1,
    classes: 100,
    files: { train: ['train.bin'], test: ['test.bin'] },
    archiveDir: 'cifar-100-binary',
    anyOf: { train: false, test: false },
  },
};

/** File names a split consists of, in reading order. */
export function cifarFileNames(dataset: DatasetName, split: Split): string[] {
  return [...formatOf(dataset).files[split]];
}

function formatOf(dataset: string): Format {
  if (!Object.prototype.hasOwnProperty.call(FORMATS, dataset)) {
    throw new DataError(`unknown dataset '${dataset}' (expected 'cifar10' or 'cifar100')`);
  }
  return FORMATS[dataset as DatasetName];
}

interface SourceFile {
  path: string;
  size: number;
}


function locateFiles(fmt: Format, dir: string, split: Split): SourceFile[] {
  const dirStat = statOrNull(dir, DataError);
  if (dirStat === null) throw new DataError(`data directory not found: ${dir}`);
  if (!dirStat.isDirectory()) throw new DataError(`data directory is not a directory: ${dir}`);

  const expected = fmt.files[split];
  const found: SourceFile[] = [];
  const missing: string[] = [];
  for (const name of expected) {
    const p = path.join(dir, name);
    const st = statOrNull(p, DataError);
    if (st === null) {
      missing.push(name);
      continue;
    }
    if (!st.isFile()) throw new DataError(`${fmt.title} ${split} file is not a regular file: ${p}`);
    found.push({ path: p, size: st.size });
  }

  const incomplete = fmt.anyOf[split] ? found.length === 0 : missing.length > 0;
  if (incomplete) {
    const want = fmt.anyOf[split]
      ? `at least one of ${expected.join(', ')}`
      : missing.join(', ');
    // Pointing at the parent of the extracted archive is the most common mistake.
    const nested = path.join(dir, fmt.archiveDir);
    const mnist = ['train-images-idx3-ubyte.gz', 'train-images-idx3-ubyte'].some((f) => statOrNull(path.join(dir, f), DataError) !== null);
    const hint = statOrNull(nested, DataError)?.isDirectory()
      ? ` (did you mean ${nested}?)`
      : mnist
        ? ' (it holds MNIST-format files: add --dataset fashion-mnist or --dataset mnist)'
        : '';
    throw new DataError(`${fmt.title} ${split} split: missing ${want} in ${dir}${hint}`);
  }
  return found;
}

function checkSize(fmt: Format, file: SourceFile): void {
  const record = fmt.labelBytes + CIFAR_IMAGE_BYTES;
  if (file.size === 0) throw new DataError(`empty file: ${file.path} (0 bytes)`);
  const tail = file.size % record;
  if (tail !== 0) {
    const whole = file.size - tail;
    throw new DataError(
      `${file.path}: size ${file.size} bytes is not a multiple of the ${fmt.title} record size ${record}; ` +
        `trailing partial record of ${tail} bytes at offset ${whole} (record ${whole / record}); ` +
        `the file is truncated or not ${fmt.title} binary data`,
    );
  }
}

function readInto(file: SourceFile, target: Uint8Array, at: number): void {
  let fd: number;
  try {
    fd = fs.openSync(file.path, 'r');
  } catch (err) {
    throw new DataError(`cannot open ${file.path}: ${(err as Error).message}`);
  }
  try {
    let done = 0;
    while (done < file.size) {
      const n = fs.readSync(fd, target, at + done, file.size - done, done);
      if (n === 0) {
        throw new DataError(`${file.path}: file shrank while reading (expected ${file.size} bytes, got ${done})`);
      }
      done += n;
    }
  } catch (err) {
    if (err instanceof DataError) throw err;
    throw new DataError(`cannot read ${file.path}: ${(err as Error).message}`);
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Reads one split of CIFAR-10 or CIFAR-100 from `dir` (the directory that
 * directly contains the .bin files). Throws DataError for anything that is
 * not a well-formed file of the expected format.
 */
export function readCifar(dataset: DatasetName, dir: string, split: Split): ImageSet {
  const fmt = formatOf(dataset);
  if (split !== 'train' && split !== 'test') {
    throw new DataError(`unknown split '${String(split)}' (expected 'train' or 'test')`);
  }
  const files = locateFiles(fmt, dir, split);
  for (const f of files) checkSize(fmt, f);

  const record = fmt.labelBytes + CIFAR_IMAGE_BYTES;
  const totalBytes = files.reduce((s, f) => s + f.size, 0);
  const count = totalBytes / record;

  // Every byte gets overwritten by the reads below, so skip zero-filling.
  const raw = new Uint8Array(Buffer.allocUnsafeSlow(totalBytes).buffer, 0, totalBytes);
  let at = 0;
  for (const f of files) {
    readInto(f, raw, at);
    at += f.size;
  }

  // Compact in place: record i's pixels move left to i*3072. The destination
  // never reaches a later record (i*3072 + 3072 <= (i+1)*record), and record
  // i's own label bytes are read before its move overwrites them.
  const labels = new Int32Array(count);
  let index = 0;
  for (const f of files) {
    const recordsInFile = f.size / record;
    for (let r = 0; r < recordsInFile; r++, index++) {
      const src = index * record;
      for (let k = 0; k < fmt.fields.length; k++) {
        const field = fmt.fields[k]!;
        const value = raw[src + field.offset]!;
        if (value >= field.count) {
          throw new DataError(
            `${f.path}: record ${r} has ${field.what} ${value} at byte offset ${r * record + field.offset}; ` +
              `${fmt.title} ${field.what}s must be 0..${field.count - 1}`,
          );
        }
        if (k === fmt.used) labels[index] = value;
      }
      raw.copyWithin(index * CIFAR_IMAGE_BYTES, src + fmt.labelBytes, src + record);
    }
  }

  return {
    images: raw.subarray(0, count * CIFAR_IMAGE_BYTES),
    labels,
    count,
    classes: fmt.classes,
    height: 32,
    width: 32,
    channels: 3,
  };
}
