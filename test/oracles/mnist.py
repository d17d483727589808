"""MNIST and Fashion-MNIST as the engine reads them (ts/data/mnist.ts): the IDX files (gzip or plain),
each 28×28 grey image centred in a black 32×32 frame and repeated in three channels, normalised with
the 28×28 training pixels' mean and standard deviation."""

import gzip
import os

import numpy as np
import torch

STATS = {'fashion-mnist': (0.286, 0.353), 'mnist': (0.1307, 0.3081)}
PREFIX = {'train': 'train', 'test': 't10k'}


def _idx(path, rank):
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rb') as f:
        raw = f.read()
    magic = int.from_bytes(raw[:4], 'big')
    if magic != (0x08 << 8) | rank:
        raise ValueError(f'{path}: magic number {magic:#010x}')
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], 'big') for i in range(rank)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def _file(directory, split, what):
    base = os.path.join(directory, f'{PREFIX[split]}-{what}-ubyte')
    return base + '.gz' if os.path.exists(base + '.gz') else base


def read(directory, split, limit=None):
    """One split's images on the [0, 1] scale (N, 3, 32, 32) and labels (int64); the first `limit` only when given."""
    grey = _idx(_file(directory, split, 'images-idx3'), 3)
    labels = _idx(_file(directory, split, 'labels-idx1'), 1)
    if limit is not None:
        grey, labels = grey[:limit], labels[:limit]
    framed = np.zeros((len(grey), 32, 32), dtype=np.float32)
    framed[:, 2:30, 2:30] = grey / 255
    images = np.repeat(framed[:, None], 3, axis=1)
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


def normaliser(name):
    mean, std = STATS[name]
    return lambda images: (images - mean) / std
