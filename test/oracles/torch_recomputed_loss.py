#!/usr/bin/python3
"""A checkpoint's test loss with its saved batch-norm statistics and with statistics
recomputed from the training set: how far a run's running statistics are from its
final weights' (test/comm/ddp.test.js), and the scores of a run whose accuracy fell.

Each --checkpoint's model.safetensors (ResNet-18 or VGG-19bn, PyTorch's names) is
loaded in --dtype (float64 by default). Its test loss is measured on test_batch.bin
of --data with the saved running statistics; then every batch norm's statistics are
recomputed from the training images (data_batch_*.bin, or their first
--train-images; normalised, no augmentation) as PyTorch's cumulative average
(momentum None) of the means and unbiased variances of batches of --batch, and the
test loss is measured again.
Prints one JSON line per checkpoint, in order: {"saved": loss, "recomputed": loss,
"scores": {"saved" | "recomputed": {"train" | "test": {"loss", "accuracy"}}}}: the
loss and accuracy in evaluation mode on the training images (those the statistics
are recomputed from) and on the test set, each way.

    OMP_NUM_THREADS=2 /usr/bin/python3 test/oracles/torch_recomputed_loss.py --model resnet18 \
        --checkpoint RUN/checkpoints/epoch-0001/model.safetensors --data DIR
"""

import argparse
import json
import os
import sys

if not os.environ.get('OMP_NUM_THREADS'):
    sys.exit('torch_recomputed_loss.py: OMP_NUM_THREADS must be set (e.g. OMP_NUM_THREADS=2)')

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cifar  # noqa: E402
import models  # noqa: E402
import safetensors_io  # noqa: E402


def read(directory, names, dtype):
    """Normalised images in `dtype` and their labels."""
    images, labels = cifar.read(directory, names, dtype)
    return cifar.normalise(images), labels


def score(model, x, y, batch):
    """Mean loss and accuracy in evaluation mode."""
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            logits = model(x[i:i + batch])
            loss += F.cross_entropy(logits, y[i:i + batch], reduction='sum').item()
            correct += (logits.argmax(1) == y[i:i + batch]).sum().item()
    return {'loss': loss / len(y), 'accuracy': correct / len(y)}


def main(argv=None):
    p = argparse.ArgumentParser(description='Test loss with saved and with recomputed batch-norm statistics, in float64.')
    p.add_argument('--model', choices=sorted(models.MODELS), required=True)
    p.add_argument('--classes', type=int, default=10)
    p.add_argument('--width', type=float, default=1.0)
    p.add_argument('--checkpoint', required=True, action='append', help='model.safetensors (repeat for several)')
    p.add_argument('--data', required=True, help='directory of data_batch_*.bin and test_batch.bin')
    p.add_argument('--batch', type=int, default=256)
    p.add_argument('--train-images', type=int, default=0, help='recompute from the first N training images (0: all)')
    p.add_argument('--dtype', choices=['float64', 'float32'], default='float64')
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
    dtype = np.float64 if args.dtype == 'float64' else np.float32
    train_x, train_y = read(args.data, sorted(f for f in os.listdir(args.data) if f.startswith('data_batch_')), dtype)
    if args.train_images:
        train_x, train_y = train_x[:args.train_images], train_y[:args.train_images]
    test_x, test_y = read(args.data, ['test_batch.bin'], dtype)
    for checkpoint in args.checkpoint:
        model = models.build(args.model, args.classes, args.width).to(getattr(torch, args.dtype))
        model.load_state_dict(safetensors_io.load_state_dict(checkpoint))
        saved = {'train': score(model, train_x, train_y, args.batch), 'test': score(model, test_x, test_y, args.batch)}
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None
        model.train()
        with torch.no_grad():
            for i in range(0, len(train_x), args.batch):
                model(train_x[i:i + args.batch])
        recomputed = {'train': score(model, train_x, train_y, args.batch), 'test': score(model, test_x, test_y, args.batch)}
        print(json.dumps({'saved': saved['test']['loss'], 'recomputed': recomputed['test']['loss'],
                          'scores': {'saved': saved, 'recomputed': recomputed}}), flush=True)


if __name__ == '__main__':
    main()
