"""The CIFAR binary format as the engine reads it: rows of one label byte and 3×32×32 image bytes
(channel-major), normalised with CIFAR-10's per-channel mean and standard deviation."""

import os

import numpy as np
import torch

MEAN = (125.3 / 255, 123.0 / 255, 113.9 / 255)
STD = (63.0 / 255, 62.1 / 255, 66.7 / 255)


def read(directory, names, dtype=np.float32):
    """The images of the named files on the [0, 1] scale (N, 3, 32, 32) and their labels (int64)."""
    raw = np.concatenate([np.fromfile(os.path.join(directory, n), dtype=np.uint8).reshape(-1, 3073) for n in names])
    images = torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32).astype(dtype) / 255)
    return images, torch.from_numpy(raw[:, 0].astype(np.int64))


def normalise(images):
    mean = torch.tensor(MEAN, dtype=images.dtype).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=images.dtype).view(1, 3, 1, 1)
    return (images - mean) / std
