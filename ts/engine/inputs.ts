/**
 * The caller's data as Model takes it (image batches, token windows, hidden states, named tensors)
 * and its checks: every argument is validated, naming the method and the value, before native work.
 */
import { CheckpointError, UsageError } from '../base/errors.js';
import type { Architecture } from '../config/options.js';
import type { StateEntry } from '../native/binding.js';
import type { NamedTensor } from './safetensors.js';

/** A batch of the caller's images for Model.trainStep. */
export interface ImageBatch {
  /** N images as float32 NCHW (N, 3, height, width), already normalised. */
  images: Float32Array;
  /** N class indices in [0, classes). */
  labels: Int32Array | readonly number[];
  /** Image size (default 32 × 32; VGG takes 32 × 32 only). */
  height?: number;
  width?: number;
}

/** A window of token ids for the language model's Model.trainStep: (steps, batch) time-major. */
export interface TokenWindow {
  /** steps × batch input token ids, time-major: tokens[t·batch + b]. */
  tokens: Int32Array | readonly number[];
  /** The token to predict at each position (usually the next one), same layout. */
  targets: Int32Array | readonly number[];
  steps: number;
  batch: number;
}

/** Options of Model.forward. */
export interface ForwardOptions {
  /** Training mode (batch statistics, which batch norm folds into its running ones; dropout) or evaluation (default). */
  train?: boolean;
  /** Images: size of each image (default 32 × 32). */
  height?: number;
  width?: number;
  /** Language model: the window's layout (tokens.length = steps × batch). */
  steps?: number;
  batch?: number;
}

/** The language model's carried state: per layer, h and c, each (batch, hidden) row-major. */
export interface HiddenState {
  batch: number;
  h: Float32Array[];
  c: Float32Array[];
}

/** Height and width of caller images: positive integers (default 32), 32 × 32 for VGG. */
export function imageSize(architecture: Architecture, height: unknown = 32, width: unknown = 32, where: string): { height: number; width: number } {
  for (const [name, v] of [['height', height], ['width', width]] as const)
    if (!Number.isInteger(v) || (v as number) < 1) throw new UsageError(`${where}: ${name} must be a positive integer, got ${describe(v)}`);
  if (architecture === 'vgg19bn' && (height !== 32 || width !== 32))
    throw new UsageError(`${where}: model 'vgg19bn' takes 32×32 images, got height ${String(height)} and width ${String(width)}`);
  return { height: height as number, width: width as number };
}

/** Checks that `images` is a Float32Array of n × 3 × height × width floats. */
export function checkImages(images: unknown, n: number, height: number, width: number, where: string): Float32Array {
  if (!(images instanceof Float32Array)) throw new UsageError(`${where}: images must be a Float32Array (N, 3, H, W), got ${describe(images)}`);
  if (images.length !== n * 3 * height * width)
    throw new UsageError(`${where}: images hold ${images.length} floats, not ${n} images (one per label) of 3×${height}×${width} = ${n * 3 * height * width}`);
  return images;
}

/** Integer ids (labels or tokens) in [0, limit) as an Int32Array, from an Int32Array or a number array. */
export function ids(values: unknown, name: string, where: string, limit: number, what: string): Int32Array {
  let out: Int32Array;
  if (values instanceof Int32Array) out = values;
  else if (Array.isArray(values)) {
    for (let i = 0; i < values.length; i++)
      if (!Number.isInteger(values[i])) throw new UsageError(`${where}: ${name}[${i}] is ${describe(values[i])}, not an integer`);
    out = Int32Array.from(values as number[]);
  } else throw new UsageError(`${where}: ${name} must be an Int32Array or an array of integers, got ${describe(values)}`);
  if (out.length === 0) throw new UsageError(`${where}: ${name} is empty`);
  for (let i = 0; i < out.length; i++)
    if (out[i]! < 0 || out[i]! >= limit)
      throw new UsageError(`${where}: ${name}[${i}] is ${out[i]}, outside the ${what} [0, ${limit})`);
  return out;
}

/** A language-model window: token ids (and targets) of steps × batch entries in the vocabulary. */
export function tokenWindow(vocabulary: number, tokens: unknown, targets: unknown, steps: unknown, batch: unknown, where: string) {
  for (const [name, v] of [['steps', steps], ['batch', batch]] as const)
    if (!Number.isInteger(v) || (v as number) < 1) throw new UsageError(`${where}: ${name} must be a positive integer, got ${describe(v)}`);
  const n = (steps as number) * (batch as number);
  const inputs = ids(tokens, 'tokens', where, vocabulary, 'vocabulary');
  if (inputs.length !== n) throw new UsageError(`${where}: tokens hold ${inputs.length} ids, not steps × batch = ${n}`);
  let out: Int32Array | undefined;
  if (targets !== undefined) {
    out = ids(targets, 'targets', where, vocabulary, 'vocabulary');
    if (out.length !== n) throw new UsageError(`${where}: targets hold ${out.length} ids, not steps × batch = ${n}`);
  }
  return { tokens: inputs, targets: out, steps: steps as number, batch: batch as number };
}

/** A named tensor as loadStateDict reads it: name, dtype, shape and bytes. */
function checkTensor(t: unknown): asserts t is NamedTensor {
  const e = t as Partial<NamedTensor> | null;
  if (typeof e !== 'object' || e === null) throw new UsageError(`loadStateDict: each tensor must be { name, dtype, shape, data }, got ${describe(t)}`);
  if (typeof e.name !== 'string') throw new UsageError(`loadStateDict: a tensor's name must be a string, got ${describe(e.name)}`);
  if (typeof e.dtype !== 'string') throw new UsageError(`loadStateDict: tensor '${e.name}' has no dtype`);
  if (!Array.isArray(e.shape) || e.shape.some((d) => !Number.isSafeInteger(d) || d < 0))
    throw new UsageError(`loadStateDict: tensor '${e.name}' must have a shape of non-negative integers, got ${describe(e.shape)}`);
  if (!(e.data instanceof Uint8Array)) throw new UsageError(`loadStateDict: tensor '${e.name}' must hold its bytes in a Uint8Array, got ${describe(e.data)}`);
}

/** Entries of the engine's state that are float64 themselves (not cast). */
const F64_ENTRIES = new Set(['compressor.levels']);

/**
 * Named tensors as the engine's state takes them, checked: a dtype of the state (F32, F64, I64), only
 * finite values, float64 copies of float32 entries cast to float32 (their names in `cast`).
 */
export function stateEntries(tensors: Iterable<NamedTensor>): { entries: StateEntry[]; cast: string[] } {
  if (typeof (tensors as Iterable<NamedTensor> | null)?.[Symbol.iterator] !== 'function')
    throw new UsageError(`loadStateDict takes an iterable of named tensors, got ${describe(tensors)}`);
  const entries: StateEntry[] = [];
  const cast: string[] = [];
  for (const t of tensors) {
    checkTensor(t);
    if (t.dtype !== 'F32' && t.dtype !== 'I64' && t.dtype !== 'F64')
      throw new CheckpointError(`tensor '${t.name}' has dtype ${t.dtype}; the engine's state uses F32, F64 and I64`);
    // Checked against the dtype the caller declares, before a float64 tensor is cast.
    const need = t.shape.reduce((a, b) => a * b, 1) * (t.dtype === 'F32' ? 4 : 8);
    if (t.data.byteLength !== need)
      throw new CheckpointError(`tensor '${t.name}' is declared ${t.dtype} of shape (${t.shape.join(', ')}${t.shape.length === 1 ? ',' : ''}), which takes ${need} bytes, but holds ${t.data.byteLength}`);
    const bad = firstNonFinite(t);
    if (bad)
      throw new CheckpointError(
        `tensor '${t.name}' holds non-finite values (${bad.value} at element ${bad.index}${bad.count > 1 ? `, ${bad.count} such elements in all` : ''}); ` +
          'such a state cannot be loaded (training had diverged before it was saved, or the file was altered)',
      );
    if (t.dtype === 'F64' && !F64_ENTRIES.has(t.name)) {
      entries.push({ name: t.name, dtype: 'F32', shape: t.shape, data: toFloat32(t.data) });
      cast.push(t.name);
    } else entries.push({ name: t.name, dtype: t.dtype, shape: t.shape, data: t.data });
  }
  return { entries, cast };
}

/** Float64 little-endian bytes as float32 bytes (rounded to nearest). */
function toFloat32(data: Uint8Array): Uint8Array {
  const bytes = data.byteOffset % 8 === 0 ? data : data.slice();
  const values = new Float64Array(bytes.buffer, bytes.byteOffset, Math.floor(bytes.byteLength / 8));
  return new Uint8Array(Float32Array.from(values).buffer);
}

/** A short description of a value for error messages. */
export function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return `an array of ${v.length}`;
  if (ArrayBuffer.isView(v)) return `a ${v.constructor.name} of ${(v as unknown as { length?: number }).length ?? v.byteLength}`;
  if (typeof v === 'object') return `a ${(v as object).constructor?.name ?? 'object'}`;
  if (typeof v === 'string') return `'${v}'`;
  return String(v);
}

/** The first NaN or infinity of a floating-point tensor (and how many there are), or undefined. */
export function firstNonFinite(t: NamedTensor): { index: number; value: number; count: number } | undefined {
  if (t.dtype !== 'F32' && t.dtype !== 'F64') return undefined;
  const size = t.dtype === 'F32' ? 4 : 8;
  const n = Math.floor(t.data.byteLength / size);
  // Safetensors data need not be aligned for a typed-array view: copy when it is not.
  const bytes = t.data.byteOffset % size === 0 ? t.data : t.data.slice();
  const values = t.dtype === 'F32' ? new Float32Array(bytes.buffer, bytes.byteOffset, n) : new Float64Array(bytes.buffer, bytes.byteOffset, n);
  let first = -1;
  let count = 0;
  for (let i = 0; i < n; i++) {
    const v = values[i]!;
    if (v - v !== 0) {
      if (first < 0) first = i;
      count++;
    }
  }
  return first < 0 ? undefined : { index: first, value: values[first]!, count };
}
