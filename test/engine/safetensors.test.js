import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';

import { writeSafetensors, readSafetensors, f32, tensorFrom } from '../../lib/engine/safetensors.js';
import { CheckpointError } from '../../lib/base/errors.js';
import { engineError } from '../helpers/throws.js';

function bytesOf(typed) {
  return new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength);
}

/** Builds a safetensors file by hand so the reader can be fed malformed headers. */
function craft(file, header, data = new Uint8Array(0), lengthField) {
  const json = Buffer.from(typeof header === 'string' ? header : JSON.stringify(header), 'utf8');
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(lengthField ?? json.byteLength));
  fs.writeFileSync(file, Buffer.concat([len, json, data]));
}

/** Runs fn, asserts it throws a CheckpointError, and returns the error for message checks. */
function checkpointError(fn) {
  return engineError(fn, CheckpointError, 'ERR_CHECKPOINT');
}

/**
 * writeSafetensors(file, one tensor) in a child process, as "nobody" when this process is root;
 * its stdout is { wrote: true } or the error's { name, code, message }.
 */
function writeUnprivileged(file) {
  const module = new URL('../../lib/engine/safetensors.js', import.meta.url).href;
  const script = `import(${JSON.stringify(module)}).then((m) => {
    try {
      m.writeSafetensors(process.argv[1], [m.tensorFrom('y', [1], new Float32Array([9]))]);
      console.log(JSON.stringify({ wrote: true }));
    } catch (e) {
      console.log(JSON.stringify({ name: e.name, code: e.code, message: e.message }));
    }
  });`;
  const nobody = process.getuid?.() === 0 ? { uid: 65534, gid: 65534 } : {};
  return spawnSync(process.execPath, ['--input-type=module', '-e', script, file], { encoding: 'utf8', timeout: 60_000, ...nobody });
}

function tempLeftovers(dir) {
  return fs.readdirSync(dir).filter((n) => n.includes('.tmp-'));
}

describe('safetensors', () => {
  let dir;
  let file;
  beforeEach(() => {
    dir = fs.mkdtempSync(os.tmpdir() + '/acc-');
    file = path.join(dir, 'ckpt.safetensors');
  });
  afterEach(() => {
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('round-trips F32, F64, I64, I32, U8, 0-d and empty tensors with metadata', () => {
    const w = new Float32Array([1.5, -2.25, 3e-8, Infinity, -0, 6]);
    const steps = new BigInt64Array([-(2n ** 62n), 9007199254740993n]);
    const tensors = [
      tensorFrom('layer.0.weight', [2, 3], w),
      tensorFrom('opt.step', [2], steps),
      tensorFrom('lr', [], new Float64Array([0.125])),
      tensorFrom('idx', [1, 1, 2], new Int32Array([-1, 2147483647])),
      tensorFrom('mask', [3], new Uint8Array([0, 255, 7])),
      { name: 'empty', dtype: 'F32', shape: [0, 4], data: new Uint8Array(0) },
      // An integer-like name must not disturb the layout order.
      tensorFrom('0', [], new Float32Array([42])),
    ];
    const metadata = { format: 'pt', epoch: '3', note: 'ünïcode ✓' };
    writeSafetensors(file, tensors, metadata);

    const { tensors: got, metadata: meta } = readSafetensors(file);
    expect(meta).to.deep.equal(metadata);
    expect([...got.keys()].sort()).to.deep.equal(tensors.map((t) => t.name).sort());
    for (const t of tensors) {
      const g = got.get(t.name);
      expect(g.dtype, t.name).to.equal(t.dtype);
      expect(g.shape, t.name).to.deep.equal(t.shape);
      expect(Buffer.compare(g.data, t.data), t.name).to.equal(0);
    }
    expect(Array.from(f32(got.get('layer.0.weight')))).to.deep.equal(Array.from(w));
    expect(Object.is(f32(got.get('layer.0.weight'))[4], -0)).to.equal(true);
    const s = got.get('opt.step').data;
    expect(Array.from(new BigInt64Array(s.slice().buffer))).to.deep.equal(Array.from(steps));
    expect(new Float64Array(got.get('lr').data.slice().buffer)[0]).to.equal(0.125);
    expect(f32(got.get('0'))[0]).to.equal(42);
    expect(tempLeftovers(dir)).to.deep.equal([]);
  });

  it('reads back an empty metadata object when none was written', () => {
    writeSafetensors(file, [tensorFrom('x', [1], new Float32Array([1]))]);
    expect(readSafetensors(file).metadata).to.deep.equal({});
  });

  it('writes the exact byte layout of a hand-computed example', () => {
    writeSafetensors(
      file,
      [
        { name: 'a', dtype: 'F32', shape: [2], data: bytesOf(new Float32Array([1, 2])) },
        { name: 'b', dtype: 'U8', shape: [], data: new Uint8Array([7]) },
      ],
      { k: 'v' },
    );
    const json =
      '{"__metadata__":{"k":"v"},' +
      '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' +
      '"b":{"dtype":"U8","shape":[],"data_offsets":[8,9]}}';
    expect(json.length).to.equal(130);
    const expected = Buffer.concat([
      Buffer.from([136, 0, 0, 0, 0, 0, 0, 0]), // 130 rounded up to a multiple of 8
      Buffer.from(json + ' '.repeat(6), 'utf8'),
      Buffer.from([0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40]), // 1.0f, 2.0f little-endian
      Buffer.from([7]),
    ]);
    const actual = fs.readFileSync(file);
    expect(actual.byteLength).to.equal(153);
    expect(actual.toString('hex')).to.equal(expected.toString('hex'));
  });

  it('pads the header so the data buffer starts 8-byte aligned', () => {
    for (const name of ['w', 'ww', 'www', 'wwww', 'wwwww', 'wwwwww', 'wwwwwww', 'wwwwwwww']) {
      writeSafetensors(file, [tensorFrom(name, [1], new Float32Array([1]))]);
      const buf = fs.readFileSync(file);
      const n = Number(buf.readBigUInt64LE(0));
      expect(n % 8, name).to.equal(0);
      expect(buf.byteLength - 8 - n, name).to.equal(4);
      expect(buf.subarray(8, 8 + n).toString('utf8').trimEnd()).to.match(/\}$/);
    }
  });

  it('f32 returns a view when aligned and a copy when not', () => {
    writeSafetensors(file, [
      tensorFrom('aligned', [2], new Float32Array([1, 2])),
      tensorFrom('pad', [1], new Uint8Array([9])),
      tensorFrom('odd', [2], new Float32Array([3, 4])),
    ]);
    const { tensors } = readSafetensors(file);
    const a = tensors.get('aligned');
    const av = f32(a);
    expect(av.buffer).to.equal(a.data.buffer);
    const o = tensors.get('odd');
    expect(o.data.byteOffset % 4).to.not.equal(0);
    expect(Array.from(f32(o))).to.deep.equal([3, 4]);
    expect(() => f32(tensors.get('pad'))).to.throw(CheckpointError, /U8/);
  });

  it('reports a truncated body with expected and found data sizes', () => {
    writeSafetensors(file, [tensorFrom('a', [4], new Float32Array(4)), tensorFrom('b', [2], new Float64Array(2))]);
    const full = fs.readFileSync(file);
    const headerEnd = 8 + Number(full.readBigUInt64LE(0));
    fs.writeFileSync(file, full.subarray(0, full.byteLength - 5));
    const err = checkpointError(() => readSafetensors(file));
    expect(err.message).to.include(file);
    expect(err.message).to.include('truncated');
    expect(err.message).to.include('expected 32 bytes of data');
    expect(err.message).to.include('found 27');
    expect(err.message).to.include("'b'");
    expect(err.message).to.include(`file offset ${headerEnd + 32}`);
  });

  it('rejects a file shorter than the length field', () => {
    fs.writeFileSync(file, Buffer.from([1, 2, 3]));
    const err = checkpointError(() => readSafetensors(file));
    expect(err.message).to.include(file).and.include('3 bytes').and.include('offset 0');
  });

  it('rejects a header length larger than the file', () => {
    craft(file, '{}', undefined, 1000);
    const err = checkpointError(() => readSafetensors(file));
    expect(err.message).to.include(file).and.include('header length 1000').and.include('2 bytes');
  });

  it('rejects a huge header length without allocating it', () => {
    const buf = Buffer.alloc(16);
    buf.writeBigUInt64LE(2n ** 63n);
    fs.writeFileSync(file, buf);
    expect(checkpointError(() => readSafetensors(file)).message).to.include(`header length ${2n ** 63n}`);
  });

  it('rejects invalid JSON and non-object headers', () => {
    craft(file, '{"a": {"dtype": "F32",');
    let err = checkpointError(() => readSafetensors(file));
    expect(err.message).to.include(file).and.include('invalid JSON').and.include('bytes 8..');

    craft(file, '[1,2]');
    err = checkpointError(() => readSafetensors(file));
    expect(err.message).to.include('must be a JSON object');

    // Invalid UTF-8 in the header is as bad as invalid JSON.
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(3n);
    fs.writeFileSync(file, Buffer.concat([len, Buffer.from([0x7b, 0xff, 0x7d])]));
    expect(checkpointError(() => readSafetensors(file)).message).to.include('invalid JSON');
  });

  it('rejects an unknown dtype, naming the tensor', () => {
    craft(file, { h: { dtype: 'F16', shape: [2], data_offsets: [0, 4] } }, new Uint8Array(4));
    const err = checkpointError(() => readSafetensors(file));
    expect(err.message).to.include(file).and.include("'h'").and.include('F16');
  });

  it('rejects a shape that does not match the offsets for the dtype', () => {
    craft(file, { w: { dtype: 'F32', shape: [3], data_offsets: [0, 8] } }, new Uint8Array(12));
    const err = checkpointError(() => readSafetensors(file));
    expect(err.message).to.include(file).and.include("'w'").and.include('12 bytes').and.include('[0, 8]');
  });

  it('rejects malformed shape and data_offsets', () => {
    craft(file, { w: { dtype: 'F32', shape: [-1], data_offsets: [0, 4] } }, new Uint8Array(4));
    expect(checkpointError(() => readSafetensors(file)).message).to.include("'w'").and.include('shape');
    craft(file, { w: { dtype: 'F32', shape: [1], data_offsets: [4, 0] } }, new Uint8Array(4));
    expect(checkpointError(() => readSafetensors(file)).message).to.include("'w'").and.include('data_offsets');
  });

  it('rejects overlapping tensors, naming both and the offset', () => {
    craft(
      file,
      {
        a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] },
        b: { dtype: 'F32', shape: [2], data_offsets: [4, 12] },
      },
      new Uint8Array(12),
    );
    const err = checkpointError(() => readSafetensors(file));
    expect(err.message).to.include(file).and.include("'a'").and.include("'b'").and.include('data offset 4');
  });

  it('rejects non-string metadata values', () => {
    craft(file, { __metadata__: { epoch: 3 } });
    expect(checkpointError(() => readSafetensors(file)).message).to.include('epoch');
  });

  it('rejects a missing file as CheckpointError', () => {
    expect(checkpointError(() => readSafetensors(path.join(dir, 'none.safetensors'))).message).to.include('none.safetensors');
  });

  describe('atomic write', () => {
    const good = () => [tensorFrom('x', [2], new Float32Array([1, 2]))];

    it('validates before touching the disk and leaves the old file intact', () => {
      writeSafetensors(file, good(), { v: 'old' });
      const before = fs.readFileSync(file);
      const bad = [
        [{ name: 'x', dtype: 'F32', shape: [3], data: new Uint8Array(8) }], // data shorter than shape
        [{ name: 'x', dtype: 'F16', shape: [1], data: new Uint8Array(2) }],
        [{ name: 'x', dtype: 'F32', shape: [1.5], data: new Uint8Array(4) }],
        [...good(), ...good()], // duplicate name
        [{ name: '__metadata__', dtype: 'U8', shape: [], data: new Uint8Array(1) }],
      ];
      for (const tensors of bad) {
        checkpointError(() => writeSafetensors(file, tensors));
      }
      const err = checkpointError(() => writeSafetensors(file, bad[0]));
      expect(err.message).to.include(file).and.include("'x'").and.include('12 bytes').and.include('8');
      checkpointError(() => writeSafetensors(file, good(), { n: 1 }));
      expect(fs.readFileSync(file).equals(before)).to.equal(true);
      expect(tempLeftovers(dir)).to.deep.equal([]);
    });

    it('removes the temp file when the final rename fails', () => {
      // Renaming a file over a directory fails after the temp file is fully written.
      fs.mkdirSync(file);
      fs.writeFileSync(path.join(file, 'keep'), 'k');
      const err = checkpointError(() => writeSafetensors(file, good()));
      expect(err.message).to.include(file);
      expect(fs.statSync(file).isDirectory()).to.equal(true);
      expect(fs.readFileSync(path.join(file, 'keep'), 'utf8')).to.equal('k');
      expect(tempLeftovers(dir)).to.deep.equal([]);
    });

    it('leaves the old file intact when the directory is not writable', function () {
      writeSafetensors(file, good(), { v: 'old' });
      const before = fs.readFileSync(file);
      // Root ignores permissions, so the write runs in a child process with the rights of
      // "nobody" (65534) when this one is root; the directory stays readable to it.
      fs.chmodSync(dir, 0o555);
      let r;
      try {
        r = writeUnprivileged(file);
      } finally {
        fs.chmodSync(dir, 0o755);
      }
      expect(r.error, 'the child process could not be started').to.equal(undefined);
      expect(r.status, r.stderr).to.equal(0);
      const outcome = JSON.parse(r.stdout);
      expect(outcome, 'the write succeeded in a read-only directory').to.not.have.property('wrote');
      expect(outcome).to.include({ name: 'CheckpointError', code: 'ERR_CHECKPOINT' });
      expect(outcome.message).to.include(dir);
      expect(fs.readFileSync(file).equals(before)).to.equal(true);
      expect(tempLeftovers(dir)).to.deep.equal([]);
    });

    it('replaces an existing file completely on success', () => {
      writeSafetensors(file, [tensorFrom('big', [1000], new Float64Array(1000).fill(1))]);
      writeSafetensors(file, good(), { v: 'new' });
      const { tensors, metadata } = readSafetensors(file);
      expect([...tensors.keys()]).to.deep.equal(['x']);
      expect(metadata).to.deep.equal({ v: 'new' });
      expect(tempLeftovers(dir)).to.deep.equal([]);
    });
  });
});
