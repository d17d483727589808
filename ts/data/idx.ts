/**
 * The IDX format of MNIST and Fashion-MNIST: a 4-byte magic number (two zero bytes, the element
 * type, the number of dimensions), each dimension as a big-endian uint32, then the elements in
 * row-major order. Files are read gzip-compressed (as distributed) or plain; every way a file can be
 * wrong is a DataError naming the file and what is wrong.
 */
import * as fs from 'node:fs';
import * as zlib from 'node:zlib';
import { DataError } from '../base/errors.js';

/** The element type code of unsigned bytes, the only type MNIST-format files use. */
export const IDX_UBYTE = 0x08;

/** No MNIST-format file comes near this; a larger stream is not one (or is a decompression bomb). */
const MAX_BYTES = 2 ** 30;

export interface IdxArray {
  /** The dimensions from the header, the first one the number of items. */
  dims: number[];
  /** The elements, exactly product(dims) bytes. */
  data: Uint8Array;
}

/** The file's bytes, gunzipped when they start with gzip's magic number. */
function readBytes(file: string): Uint8Array {
  let raw: Buffer;
  try {
    raw = fs.readFileSync(file);
  } catch (err) {
    throw new DataError(`cannot read ${file}: ${(err as Error).message}`);
  }
  if (raw.length === 0) throw new DataError(`empty file: ${file} (0 bytes)`);
  if (raw.length < 2 || raw[0] !== 0x1f || raw[1] !== 0x8b) {
    if (file.endsWith('.gz')) throw new DataError(`${file}: not a gzip file (it does not start with gzip's magic number 1f 8b)`);
    return raw;
  }
  try {
    return zlib.gunzipSync(raw, { maxOutputLength: MAX_BYTES });
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const cause = e.code === 'ERR_BUFFER_TOO_LARGE' ? `decompresses to more than ${MAX_BYTES} bytes` : e.message;
    throw new DataError(`${file}: the gzip stream is damaged or truncated (${cause})`);
  }
}

/**
 * Reads an IDX file of unsigned bytes with `rank` dimensions; `shape` fixes the dimensions after
 * the first (e.g. [28, 28] for images, [] for labels).
 */
export function readIdx(file: string, rank: number, shape: readonly number[]): IdxArray {
  const bytes = readBytes(file);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length < 4) throw new DataError(`${file}: ${bytes.length} bytes, too short for an IDX header (4 bytes of magic number)`);
  const magic = view.getUint32(0);
  const expected = (IDX_UBYTE << 8) | rank;
  if (magic !== expected)
    throw new DataError(
      `${file}: magic number 0x${magic.toString(16).padStart(8, '0')} at offset 0, expected 0x${expected.toString(16).padStart(8, '0')} ` +
        `(unsigned bytes in ${rank} dimension${rank === 1 ? '' : 's'})`,
    );
  const headerBytes = 4 + 4 * rank;
  if (bytes.length < headerBytes) throw new DataError(`${file}: ${bytes.length} bytes, too short for the header of ${rank} dimensions (${headerBytes} bytes)`);
  const dims = Array.from({ length: rank }, (_, i) => view.getUint32(4 + 4 * i));
  for (let i = 0; i < shape.length; i++)
    if (dims[i + 1] !== shape[i])
      throw new DataError(`${file}: dimension ${i + 1} is ${dims[i + 1]} (at offset ${8 + 4 * i}), expected ${shape[i]}: dimensions ${dims.join('×')}`);
  if (dims[0] === 0) throw new DataError(`${file}: the header counts 0 items`);
  const elements = dims.reduce((a, b) => a * b, 1);
  const have = bytes.length - headerBytes;
  if (have < elements)
    throw new DataError(
      `${file}: truncated: the header announces ${dims.join('×')} = ${elements} bytes of data, the file holds ${have} ` +
        `(item ${Math.floor(have / (elements / dims[0]!))} of ${dims[0]} is incomplete)`,
    );
  if (have > elements) throw new DataError(`${file}: ${have - elements} bytes after the ${dims.join('×')} announced by the header (from offset ${headerBytes + elements})`);
  return { dims, data: bytes.subarray(headerBytes, headerBytes + elements) };
}
