#!/usr/bin/python3
"""Scores a saved model with PyTorch, the outside reference for a run whose accuracy fell: its loss
and accuracy on the training and test sets of a CIFAR-format directory, in evaluation mode with the
batch-norm statistics saved in the file, and again with statistics recomputed from the training set
(every running mean and variance reset and re-estimated as a cumulative average over one pass in
training mode, no augmentation). A model whose saved statistics are sound scores alike both ways;
one whose statistics were broken by its last steps recovers with recomputed ones. Prints one JSON
object.

    OMP_NUM_THREADS=2 /usr/bin/python3 bench/peers/torch_score.py --model resnet18 \\
        --state runs/x/checkpoints/epoch-0006/model.safetensors --data ~/.cache/accordion-engine/synthetic-2560-1000-2
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

timing.require_omp('torch_score.py', 2)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cifar  # noqa: E402
import models  # noqa: E402
import safetensors_io  # noqa: E402


def score(model, images, labels, batch=250):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(labels), batch):
            logits = model(cifar.normalise(images[i:i + batch]))
            loss += F.cross_entropy(logits, labels[i:i + batch], reduction='sum').item()
            correct += (logits.argmax(1) == labels[i:i + batch]).sum().item()
    return {'loss': loss / len(labels), 'accuracy': correct / len(labels)}


def recompute_statistics(model, images, batch=250):
    """Every batch norm's running mean and variance from one pass over `images` (cumulative average)."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for i in range(0, len(images), batch):
            model(cifar.normalise(images[i:i + batch]))


def main(argv=None):
    p = argparse.ArgumentParser(description='Score a saved model with saved and recomputed batch-norm statistics.')
    p.add_argument('--model', choices=sorted(models.MODELS), default='resnet18')
    p.add_argument('--width', type=float, default=1.0)
    p.add_argument('--state', required=True, help='safetensors state_dict (a checkpoint\'s model.safetensors)')
    p.add_argument('--data', required=True, help='directory of CIFAR-10 binary files')
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
    train_x, train_y = cifar.read(args.data, sorted(f for f in os.listdir(args.data) if f.startswith('data_batch_')))
    test_x, test_y = cifar.read(args.data, ['test_batch.bin'])
    model = models.build(args.model, 10, args.width)
    model.load_state_dict(safetensors_io.load_state_dict(args.state))
    saved = {'train': score(model, train_x, train_y), 'test': score(model, test_x, test_y)}
    recompute_statistics(model, train_x)
    recomputed = {'train': score(model, train_x, train_y), 'test': score(model, test_x, test_y)}
    print(json.dumps({'saved': saved, 'recomputed': recomputed}))


if __name__ == '__main__':
    main()
