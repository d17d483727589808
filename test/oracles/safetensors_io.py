#!/usr/bin/python3
"""Minimal safetensors reader/writer (torch + stdlib only) and interop CLI.

The `safetensors` pip package is not available where the peers run, so
this implements the format directly:

    u64 little-endian N | N bytes of JSON header (space padded) | data

header = {name: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
          "__metadata__": {str: str}}   (metadata optional)
Offsets are relative to the first byte after the header.

CLI (used by the engine's interop tests):
    safetensors_io.py export MODEL CLASSES SEED OUT.safetensors
    safetensors_io.py check  MODEL CLASSES IN.safetensors
Always run with OMP_NUM_THREADS set, e.g.
    OMP_NUM_THREADS=2 /usr/bin/python3 test/oracles/safetensors_io.py ...
"""

import argparse
import ctypes
import json
import math
import os
import sys

import torch

_DTYPES = {
    'F64': torch.float64,
    'F32': torch.float32,
    'F16': torch.float16,
    'BF16': torch.bfloat16,
    'I64': torch.int64,
    'I32': torch.int32,
    'I16': torch.int16,
    'I8': torch.int8,
    'U8': torch.uint8,
    'BOOL': torch.bool,
}
_CODES = {v: k for k, v in _DTYPES.items()}

# Refuse absurd header lengths before allocating: a corrupt or non-safetensors
# file otherwise turns into a huge read or a confusing JSON error.
_MAX_HEADER = 100 * 1024 * 1024


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _require_little_endian():
    # Tensor bytes are dumped/read in host order; the format mandates LE.
    if sys.byteorder != 'little':
        raise RuntimeError('safetensors_io only supports little-endian hosts')


def save_state_dict(state_dict, path, metadata=None):
    """Write a {name: tensor} mapping to `path` in safetensors format."""
    _require_little_endian()
    entries = []
    for name, t in state_dict.items():
        if not isinstance(name, str):
            raise TypeError(f'tensor name must be str, got {type(name).__name__}')
        if name == '__metadata__':
            raise ValueError('"__metadata__" is reserved and cannot be a tensor name')
        if not isinstance(t, torch.Tensor):
            raise TypeError(f'{name}: expected torch.Tensor, got {type(t).__name__}')
        if t.layout != torch.strided:
            raise TypeError(f'{name}: only dense tensors are supported ({t.layout})')
        if t.dtype not in _CODES:
            raise TypeError(f'{name}: unsupported dtype {t.dtype}')
        entries.append((name, t.detach().to('cpu').contiguous()))

    # Larger element types first (stable, so state_dict order survives within
    # a dtype size): with the header padded to 8 every tensor then starts at
    # an offset aligned to its element size, which lets readers map typed
    # arrays (e.g. JS Float32Array / BigInt64Array) straight onto the file.
    entries.sort(key=lambda e: -e[1].element_size())

    header = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError('metadata must map str to str')
        header['__metadata__'] = dict(metadata)
    offset = 0
    for name, t in entries:
        nbytes = t.numel() * t.element_size()
        header[name] = {
            'dtype': _CODES[t.dtype],
            'shape': list(t.shape),
            'data_offsets': [offset, offset + nbytes],
        }
        offset += nbytes

    hjson = json.dumps(header, separators=(',', ':')).encode('utf-8')
    hjson += b' ' * (-len(hjson) % 8)

    # Write to a sibling temp file and rename, so a crash never leaves a
    # truncated checkpoint that a concurrent reader could pick up.
    tmp = f'{path}.tmp{os.getpid()}'
    try:
        with open(tmp, 'wb') as f:
            f.write(len(hjson).to_bytes(8, 'little'))
            f.write(hjson)
            for _, t in entries:
                if t.numel():
                    f.write(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f'duplicate key {k!r} in safetensors header')
        out[k] = v
    return out


def read_header(path):
    """Return (header_dict, data_start, file_bytes) after validating framing."""
    with open(path, 'rb') as f:
        buf = bytearray(f.read())
    if len(buf) < 8:
        raise ValueError(f'{path}: too short to be a safetensors file')
    n = int.from_bytes(buf[:8], 'little')
    if n > _MAX_HEADER or 8 + n > len(buf):
        raise ValueError(f'{path}: header length {n} is invalid for a {len(buf)}-byte file')
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode('utf-8'),
                            object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f'{path}: header is not valid JSON: {e}') from None
    if not isinstance(header, dict):
        raise ValueError(f'{path}: header must be a JSON object')
    return header, 8 + n, buf


def load_state_dict(path, with_metadata=False):
    """Read a safetensors file into {name: torch.Tensor} (CPU).

    With with_metadata=True returns (tensors, metadata_dict_or_None).
    """
    _require_little_endian()
    header, start, buf = read_header(path)
    data_len = len(buf) - start
    metadata = header.pop('__metadata__', None)
    if metadata is not None and not (
            isinstance(metadata, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise ValueError(f'{path}: __metadata__ must map str to str')

    spans = []
    tensors = {}
    for name, info in header.items():
        if not isinstance(info, dict):
            raise ValueError(f'{path}: entry {name!r} is not an object')
        code, shape, offs = info.get('dtype'), info.get('shape'), info.get('data_offsets')
        if code not in _DTYPES:
            raise ValueError(f'{path}: {name}: unsupported dtype {code!r}')
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise ValueError(f'{path}: {name}: bad shape {shape!r}')
        if not (isinstance(offs, list) and len(offs) == 2
                and all(isinstance(o, int) for o in offs) and 0 <= offs[0] <= offs[1] <= data_len):
            raise ValueError(f'{path}: {name}: bad data_offsets {offs!r} (data is {data_len} bytes)')
        dtype = _DTYPES[code]
        numel = math.prod(shape)
        size = _itemsize(dtype)
        if offs[1] - offs[0] != numel * size:
            raise ValueError(f'{path}: {name}: {offs[1] - offs[0]} bytes for shape {shape} {code} '
                             f'(expected {numel * size})')
        spans.append((offs[0], offs[1], name))
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        at = start + offs[0]
        if at % size == 0:
            t = torch.frombuffer(buf, dtype=dtype, count=numel, offset=at)
        else:
            # Files from other writers need not be aligned; copy such tensors
            # so the returned storage is always naturally aligned.
            t = torch.frombuffer(bytearray(buf[at:at + numel * size]), dtype=dtype)
        tensors[name] = t.reshape(shape)

    # The format requires the data section to be covered exactly, with no
    # overlaps or holes; anything else indicates a corrupt/foreign file.
    pos = 0
    for b, e, name in sorted(spans):
        if b != pos:
            raise ValueError(f'{path}: data of {name} starts at {b}, expected {pos} '
                             '(overlap or hole in data section)')
        pos = e
    if pos != data_len:
        raise ValueError(f'{path}: {data_len - pos} trailing bytes after last tensor')

    return (tensors, metadata) if with_metadata else tensors


# ---------------------------------------------------------------------------
# Interop CLI
# ---------------------------------------------------------------------------

# Deterministic test input, reproducible bit-for-bit in JS without torch's
# RNG. Shape [4, 3, 32, 32], row-major NCHW, element (n, c, h, w) is
#
#     x = float32( sin( ((0.37*n + 1.3*c) + 0.11*h) - 0.07*w ) )
#
# with the argument and sin evaluated in float64 in exactly that order and
# the result rounded to nearest float32. JS equivalent:
#
#     x[((n*3 + c)*32 + h)*32 + w] =
#         Math.fround(Math.sin(0.37*n + 1.3*c + 0.11*h - 0.07*w));
#
# (JS evaluates + and - left to right, matching the Python expression.)
# Python's math.sin (libm) and V8's Math.sin may in principle differ by one
# float64 ulp, which survives rounding to float32 only in astronomically
# rare cases.
INPUT_SHAPE = (4, 3, 32, 32)
INPUT_FORMULA = ('x[n,c,h,w] = float32(sin(((0.37*n + 1.3*c) + 0.11*h) - 0.07*w)), '
                 'float64 arithmetic, NCHW row-major, shape [4,3,32,32]')


def formula_input():
    N, C, H, W = INPUT_SHAPE
    vals = [math.sin(0.37 * n + 1.3 * c + 0.11 * h - 0.07 * w)
            for n in range(N) for c in range(C) for h in range(H) for w in range(W)]
    return torch.tensor(vals, dtype=torch.float64).to(torch.float32).reshape(INPUT_SHAPE)


def _models():
    # Imported lazily so the library half of this file works standalone.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models
    return models


def _eval_logits(model):
    model.eval()
    with torch.no_grad():
        logits = model(formula_input())
    if not torch.isfinite(logits).all():
        raise ValueError('model produced non-finite logits')
    return logits.tolist()


def cmd_export(args):
    models = _models()
    torch.manual_seed(args.seed)
    model = models.build(args.model, args.classes, args.width)
    # One train-mode forward on a seeded random batch moves the BN running
    # stats away from 0/1 and num_batches_tracked to 1, so the checkpoint
    # exercises every buffer. Own generator: the batch does not depend on how
    # much of the global RNG model init consumed.
    gen = torch.Generator().manual_seed(args.seed)
    batch = torch.randn(INPUT_SHAPE, generator=gen)
    model.train()
    with torch.no_grad():
        model(batch)
    logits = _eval_logits(model)
    save_state_dict(model.state_dict(), args.out, metadata={
        'format': 'pt', 'model': args.model, 'classes': str(args.classes), 'width': str(args.width),
        'seed': str(args.seed), 'torch': torch.__version__,
    })
    with open(args.out + '.json', 'w') as f:
        json.dump({
            'model': args.model,
            'classes': args.classes,
            'seed': args.seed,
            # Seeds the train-mode batch (torch.randn, own Generator) that set
            # the BN statistics; the logits input is formula-based, not seeded.
            'input_seed': args.seed,
            'input_formula': INPUT_FORMULA,
            'input_shape': list(INPUT_SHAPE),
            'logits': logits,
        }, f)
        f.write('\n')
    print(json.dumps({'ok': True, 'out': args.out, 'tensors': len(model.state_dict()),
                      'params': models.count_params(model)}))
    return 0


def _compare_state(expected, got):
    """List every name/shape/dtype mismatch (load_state_dict would silently
    cast dtypes and accept a [1]-shaped num_batches_tracked)."""
    errors = []
    for name in expected.keys() - got.keys():
        errors.append(f'missing: {name}')
    for name in got.keys() - expected.keys():
        errors.append(f'unexpected: {name}')
    for name in expected.keys() & got.keys():
        e, g = expected[name], got[name]
        if tuple(e.shape) != tuple(g.shape):
            errors.append(f'shape mismatch: {name}: file {list(g.shape)}, model {list(e.shape)}')
        if e.dtype != g.dtype:
            errors.append(f'dtype mismatch: {name}: file {_CODES.get(g.dtype, g.dtype)}, '
                          f'model {_CODES.get(e.dtype, e.dtype)}')
    return sorted(errors)


def cmd_check(args):
    models = _models()
    torch.manual_seed(0)
    model = models.build(args.model, args.classes, args.width)
    state = load_state_dict(args.path)
    errors = _compare_state(model.state_dict(), state)
    if errors:
        raise ValueError(f'{args.path} does not match {args.model}({args.classes}): '
                         f'{len(errors)} problem(s):\n  ' + '\n  '.join(errors))
    model.load_state_dict(state, strict=True)
    print(json.dumps({'ok': True, 'logits': _eval_logits(model)}))
    return 0


def main(argv=None):
    if 'OMP_NUM_THREADS' not in os.environ:
        print('warning: OMP_NUM_THREADS is not set', file=sys.stderr)
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = p.add_subparsers(dest='cmd', required=True)
    e = sub.add_parser('export', help='export a seeded model + reference logits')
    e.add_argument('model')
    e.add_argument('classes', type=int)
    e.add_argument('seed', type=int)
    e.add_argument('out')
    e.add_argument('--width', type=float, default=1.0, help="every convolution's channels x this factor (the engine's --width)")
    c = sub.add_parser('check', help='strictly load a state_dict and print logits')
    c.add_argument('model')
    c.add_argument('classes', type=int)
    c.add_argument('path')
    c.add_argument('--width', type=float, default=1.0, help="every convolution's channels x this factor (the engine's --width)")
    args = p.parse_args(argv)
    try:
        return cmd_export(args) if args.cmd == 'export' else cmd_check(args)
    except Exception as exc:  # noqa: BLE001 - CLI boundary: report, don't trace
        msg = f'{type(exc).__name__}: {exc}'
        print(f'error: {msg}', file=sys.stderr)
        print(json.dumps({'ok': False, 'error': msg}))
        return 1


if __name__ == '__main__':
    sys.exit(main())
