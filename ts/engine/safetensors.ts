/**
 * Reader and writer for the safetensors format
 * (https://github.com/huggingface/safetensors): an 8-byte little-endian
 * header length N, N bytes of UTF-8 JSON, then the tensor data buffer.
 *
 * Checkpoints must never be half-written, and a damaged one must be reported
 * precisely rather than loaded as garbage weights, so the writer is atomic and
 * the reader validates every header field against the file it came from.
 */

import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { CheckpointError } from '../base/errors.js';
import { writeFileAtomic, writeFileAtomicAsync } from '../base/files.js';

export type Dtype = 'F32' | 'F64' | 'I64' | 'I32' | 'U8';

export interface NamedTensor {
  name: string;
  dtype: Dtype;
  shape: number[];
  /** Raw little-endian element bytes. */
  data: Uint8Array;
}

export const DTYPE_SIZE: Readonly<Record<Dtype, number>> = Object.freeze({
  F32: 4,
  F64: 8,
  I64: 8,
  I32: 4,
  U8: 1,
});

const METADATA_KEY = '__metadata__';
/** Same cap as the reference implementation; stops a corrupt length from triggering a huge decode. */
const MAX_HEADER_BYTES = 100_000_000;
const LITTLE_ENDIAN_HOST = os.endianness() === 'LE';

function isDtype(x: unknown): x is Dtype {
  return typeof x === 'string' && Object.prototype.hasOwnProperty.call(DTYPE_SIZE, x);
}

function isDim(x: unknown): x is number {
  return typeof x === 'number' && Number.isSafeInteger(x) && x >= 0;
}

/** Element count; a 0-d tensor (shape []) is a scalar with one element. Returns NaN when not a safe integer. */
function numel(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return Number.isSafeInteger(n) ? n : NaN;
}

function shapeText(shape: readonly number[]): string {
  return `[${shape.join(', ')}]`;
}

// ---------------------------------------------------------------------------
// Writing

function validateForWrite(file: string, tensors: NamedTensor[], metadata: Record<string, string> | undefined): void {
  const seen = new Set<string>();
  for (const t of tensors) {
    const what = `cannot write ${file}: tensor '${t.name}'`;
    if (typeof t.name !== 'string' || t.name.length === 0) {
      throw new CheckpointError(`cannot write ${file}: tensor names must be non-empty strings`);
    }
    if (t.name === METADATA_KEY) throw new CheckpointError(`${what}: name is reserved for metadata`);
    if (seen.has(t.name)) throw new CheckpointError(`${what}: duplicate tensor name`);
    seen.add(t.name);
    if (!isDtype(t.dtype)) {
      throw new CheckpointError(`${what}: unsupported dtype '${String(t.dtype)}' (supported: ${Object.keys(DTYPE_SIZE).join(', ')})`);
    }
    if (!Array.isArray(t.shape) || !t.shape.every(isDim)) {
      throw new CheckpointError(`${what}: shape must be an array of non-negative integers, got ${JSON.stringify(t.shape)}`);
    }
    if (!(t.data instanceof Uint8Array)) throw new CheckpointError(`${what}: data must be a Uint8Array of raw bytes`);
    const need = numel(t.shape) * DTYPE_SIZE[t.dtype];
    if (t.data.byteLength !== need) {
      throw new CheckpointError(
        `${what}: shape ${shapeText(t.shape)} of ${t.dtype} needs ${need} bytes but data has ${t.data.byteLength}`,
      );
    }
  }
  if (metadata !== undefined) {
    if (typeof metadata !== 'object' || metadata === null) {
      throw new CheckpointError(`cannot write ${file}: metadata must be an object of strings`);
    }
    for (const [k, v] of Object.entries(metadata)) {
      if (typeof v !== 'string') {
        throw new CheckpointError(`cannot write ${file}: metadata '${k}' must be a string, got ${typeof v}`);
      }
    }
  }
}

/** Header JSON bytes, space-padded so that the data buffer starts 8-byte aligned in the file. */
function encodeHeader(tensors: NamedTensor[], metadata: Record<string, string> | undefined): Uint8Array {
  // Built by hand rather than from one object: JS objects put integer-like
  // keys (a tensor named "0") first, and this keeps metadata first and the
  // tensors in the order their bytes are laid out, which eases inspection.
  const parts: string[] = [];
  if (metadata !== undefined && Object.keys(metadata).length > 0) {
    parts.push(`${JSON.stringify(METADATA_KEY)}:${JSON.stringify(metadata)}`);
  }
  let offset = 0;
  for (const t of tensors) {
    const end = offset + t.data.byteLength;
    parts.push(`${JSON.stringify(t.name)}:${JSON.stringify({ dtype: t.dtype, shape: t.shape, data_offsets: [offset, end] })}`);
    offset = end;
  }
  const json = Buffer.from(`{${parts.join(',')}}`, 'utf8');
  const padded = Math.ceil(json.byteLength / 8) * 8;
  const header = Buffer.alloc(8 + padded, 0x20);
  header.writeBigUInt64LE(BigInt(padded), 0);
  json.copy(header, 8);
  return header;
}



/**
 * Writes `tensors` (laid out in the given order, without gaps) to `file`
 * atomically: either the complete new file is in place afterwards, or the
 * previous contents of `file` are untouched and no temp file remains.
 */
export function writeSafetensors(file: string, tensors: NamedTensor[], metadata?: Record<string, string>): void {
  validateForWrite(file, tensors, metadata);
  const header = encodeHeader(tensors, metadata);

  writeFileAtomic(file, [header, ...tensors.map((t) => t.data)], CheckpointError);
}

/**
 * writeSafetensors off the event loop (for checkpoints written while a service runs): the same
 * file and the same guarantees, the tensors' bytes written one tensor at a time on the thread
 * pool. The tensors must not change until the promise settles.
 */
export async function writeSafetensorsAsync(file: string, tensors: NamedTensor[], metadata?: Record<string, string>): Promise<void> {
  validateForWrite(file, tensors, metadata);
  const header = encodeHeader(tensors, metadata);
  await writeFileAtomicAsync(file, [header, ...tensors.map((t) => t.data)], CheckpointError);
}

// ---------------------------------------------------------------------------
// Reading

interface Entry {
  name: string;
  dtype: Dtype;
  shape: number[];
  begin: number;
  end: number;
}

function parseEntry(file: string, name: string, value: unknown): Entry {
  const where = `${file}: tensor '${name}'`;
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new CheckpointError(`${where}: header entry must be an object`);
  }
  const { dtype, shape, data_offsets: offsets } = value as Record<string, unknown>;
  if (!isDtype(dtype)) {
    throw new CheckpointError(
      `${where}: unknown dtype ${JSON.stringify(dtype)} (supported: ${Object.keys(DTYPE_SIZE).join(', ')})`,
    );
  }
  if (!Array.isArray(shape) || !shape.every(isDim)) {
    throw new CheckpointError(`${where}: shape must be an array of non-negative integers, got ${JSON.stringify(shape)}`);
  }
  if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every(isDim) || offsets[0] > offsets[1]) {
    throw new CheckpointError(`${where}: data_offsets must be [begin, end] with 0 <= begin <= end, got ${JSON.stringify(offsets)}`);
  }
  const [begin, end] = offsets as [number, number];
  const need = numel(shape) * DTYPE_SIZE[dtype];
  if (end - begin !== need) {
    throw new CheckpointError(
      `${where}: shape ${shapeText(shape)} of ${dtype} needs ${need} bytes but data_offsets [${begin}, ${end}] span ${end - begin}`,
    );
  }
  return { name, dtype, shape: shape as number[], begin, end };
}

function parseMetadata(file: string, value: unknown): Record<string, string> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new CheckpointError(`${file}: ${METADATA_KEY} must be an object of strings`);
  }
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== 'string') {
      throw new CheckpointError(`${file}: ${METADATA_KEY} entry '${k}' must be a string, got ${JSON.stringify(v)}`);
    }
    out[k] = v;
  }
  return out;
}

/**
 * Reads and validates a safetensors file. The returned tensors' `data` are
 * views into one buffer holding the whole file.
 */
export function readSafetensors(file: string): { tensors: Map<string, NamedTensor>; metadata: Record<string, string> } {
  let buf: Buffer;
  try {
    buf = fs.readFileSync(file);
  } catch (err) {
    throw new CheckpointError(`cannot read checkpoint ${file}: ${(err as Error).message}`);
  }
  const size = buf.byteLength;
  if (size < 8) {
    throw new CheckpointError(`${file}: file is ${size} bytes, shorter than the 8-byte header length field at offset 0`);
  }
  const headerLen = buf.readBigUInt64LE(0);
  if (headerLen > BigInt(size - 8)) {
    throw new CheckpointError(
      `${file}: header length ${headerLen} (at offset 0) exceeds the ${size - 8} bytes that follow it; the file is truncated or not safetensors`,
    );
  }
  const n = Number(headerLen);
  if (n > MAX_HEADER_BYTES) {
    throw new CheckpointError(`${file}: header length ${n} exceeds the ${MAX_HEADER_BYTES}-byte limit`);
  }

  let header: unknown;
  try {
    const text = new TextDecoder('utf-8', { fatal: true }).decode(buf.subarray(8, 8 + n));
    header = JSON.parse(text);
  } catch (err) {
    throw new CheckpointError(`${file}: invalid JSON header (file bytes 8..${8 + n}): ${(err as Error).message}`);
  }
  if (typeof header !== 'object' || header === null || Array.isArray(header)) {
    throw new CheckpointError(`${file}: header at offset 8 must be a JSON object`);
  }

  let metadata: Record<string, string> = {};
  const entries: Entry[] = [];
  for (const [name, value] of Object.entries(header)) {
    if (name === METADATA_KEY) metadata = parseMetadata(file, value);
    else entries.push(parseEntry(file, name, value));
  }

  const dataStart = 8 + n;
  const dataLen = size - dataStart;
  let furthest: Entry | undefined;
  for (const e of entries) if (furthest === undefined || e.end > furthest.end) furthest = e;
  if (furthest !== undefined && furthest.end > dataLen) {
    throw new CheckpointError(
      `${file}: file is truncated: expected ${furthest.end} bytes of data after the header (tensor '${furthest.name}' ends at data offset ${furthest.end}, ` +
        `file offset ${dataStart + furthest.end}), found ${dataLen}`,
    );
  }

  // Empty tensors occupy no bytes and cannot overlap anything.
  const placed = entries.filter((e) => e.end > e.begin).sort((a, b) => a.begin - b.begin);
  for (let i = 1; i < placed.length; i++) {
    const prev = placed[i - 1]!;
    const cur = placed[i]!;
    if (cur.begin < prev.end) {
      throw new CheckpointError(
        `${file}: tensors '${prev.name}' [${prev.begin}, ${prev.end}) and '${cur.name}' [${cur.begin}, ${cur.end}) overlap ` +
          `at data offset ${cur.begin} (file offset ${dataStart + cur.begin})`,
      );
    }
  }

  const tensors = new Map<string, NamedTensor>();
  for (const e of entries) {
    tensors.set(e.name, {
      name: e.name,
      dtype: e.dtype,
      shape: e.shape,
      data: new Uint8Array(buf.buffer, buf.byteOffset + dataStart + e.begin, e.end - e.begin),
    });
  }
  return { tensors, metadata };
}

/**
 * The tensor's elements as a Float32Array: a view when the bytes are 4-byte
 * aligned (the common case for files we write), otherwise a copy.
 */
export function f32(t: NamedTensor): Float32Array {
  if (t.dtype !== 'F32') throw new CheckpointError(`tensor '${t.name}' has dtype ${t.dtype}, expected F32`);
  const count = t.data.byteLength / 4;
  if (!LITTLE_ENDIAN_HOST) {
    const view = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    const out = new Float32Array(count);
    for (let i = 0; i < count; i++) out[i] = view.getFloat32(i * 4, true);
    return out;
  }
  if (t.data.byteOffset % 4 === 0) return new Float32Array(t.data.buffer, t.data.byteOffset, count);
  return new Float32Array(t.data.slice().buffer);
}

/** Wraps a typed array's bytes as a NamedTensor without copying. */
export function tensorFrom(
  name: string,
  shape: number[],
  values: Float32Array | Float64Array | BigInt64Array | Int32Array | Uint8Array,
): NamedTensor {
  const dtype: Dtype =
    values instanceof Float32Array
      ? 'F32'
      : values instanceof Float64Array
        ? 'F64'
        : values instanceof BigInt64Array
          ? 'I64'
          : values instanceof Int32Array
            ? 'I32'
            : 'U8';
  if (!LITTLE_ENDIAN_HOST && dtype !== 'U8') {
    throw new CheckpointError(`tensor '${name}': big-endian hosts are not supported`);
  }
  return { name, dtype, shape, data: new Uint8Array(values.buffer, values.byteOffset, values.byteLength) };
}
