#!/usr/bin/python3
"""One worker of PyTorch DDP training a CIFAR-format dataset or Fashion-MNIST with the engine's
recipe: the peer of `accordion train` for its presets (bench/preset.js) and for the dense setting
of bench/reproduce.js.

The data are the CIFAR-10 binary files of --data (data_batch_*.bin, test_batch.bin;
the engine's synthetic set has the same format), or with --dataset fashion-mnist the IDX files
framed to 3×32×32 as the engine frames them (test/oracles/mnist.py), the first --train-images
of them; shuffled by epoch as
DistributedSampler does (seeded, padded to equal shards), augmented by a random
crop with 4 black pixels of padding and a horizontal flip, then normalised with
the dataset's mean and standard deviation. ResNet-18 or VGG-19bn (test/oracles/models.py, at
--width) trains under
DistributedDataParallel over Gloo (broadcast_buffers on), optionally through
PyTorch's PowerSGD communication hook or its fp16 hook, with SGD (momentum 0.9, Nesterov, weight
decay 1e-4) at the engine's schedule: --lr for epoch 0, then a linear warm-up
to --lr × workers over --warmup-epochs, × --lr-decay after each of --milestones (the
rate computed at the end of an epoch is used in the next). After every epoch rank 0 evaluates the test set with its
running statistics and prints one JSON line:
{"epoch": N (1-based), "lr", "trainLoss", "testLoss", "testAccuracy", "steps",
 "seconds" (the epoch's training), "wallSeconds" (since the group was joined and the
 data read, the evaluation included)}; with --evals-per-epoch N above 1 it evaluates N - 1 times
within the epoch too, at the steps the engine picks (evenly spaced, rounded), the workers waiting and
the epoch's clock stopped meanwhile, and the line adds "evaluations": [{"step", "steps", "seconds"
(the epoch's training before it), "testLoss", "testAccuracy"}].

    OMP_NUM_THREADS=1 /usr/bin/python3 test/oracles/torch_train.py --rank 0 --world 2 \
        --master 127.0.0.1:29513 --data ~/.cache/accordion-engine/synthetic-2560-1000-42 \
        --epochs 2 --batch 64 --lr 0.05 --warmup-epochs 5 [--powersgd-rank 2 [--start-powersgd-iter 2] | --fp16] [--state init.safetensors]
"""

import argparse
import json
import os
import sys
import time

if not os.environ.get('OMP_NUM_THREADS'):
    sys.exit('torch_train.py: OMP_NUM_THREADS must be set (e.g. OMP_NUM_THREADS=1)')

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import safetensors_io  # noqa: E402
import cifar  # noqa: E402  (images on [0, 1], normalised after augmentation)
import mnist  # noqa: E402


def augment(images, generator):
    """Random crop of 32×32 from the image padded by 4 black pixels, and a horizontal flip, per image."""
    padded = F.pad(images, (4, 4, 4, 4))
    out = torch.empty_like(images)
    offsets = torch.randint(0, 9, (len(images), 2), generator=generator)
    flips = torch.rand(len(images), generator=generator) < 0.5
    for i in range(len(images)):
        y, x = offsets[i].tolist()
        crop = padded[i, :, y:y + 32, x:x + 32]
        out[i] = crop.flip(-1) if flips[i] else crop
    return out


def rate(epoch, args):
    """The engine's schedule: epoch 0 at the base rate, then the warm-up computed at the end of each epoch."""
    if epoch == 0:
        return args.lr
    done = epoch - 1
    warm = min(done / args.warmup_epochs, 1) if args.warmup_epochs > 0 else 1
    decays = sum(1 for m in args.milestones if done > m)
    return args.lr * (1 + (args.world - 1) * warm) * args.lr_decay ** decays


def main(argv=None):
    p = argparse.ArgumentParser(description='PyTorch DDP training on CIFAR-format data with the engine\'s recipe.')
    p.add_argument('--rank', type=int, required=True)
    p.add_argument('--world', type=int, required=True)
    p.add_argument('--master', required=True)
    p.add_argument('--data', required=True)
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--batch', type=int, default=64, help='per worker')
    p.add_argument('--lr', type=float, default=0.05)
    p.add_argument('--warmup-epochs', type=float, default=5)
    p.add_argument('--seed', type=int, default=42)
    p.add_argument('--model', choices=sorted(models.MODELS), default='resnet18')
    p.add_argument('--width', type=float, default=1.0)
    p.add_argument('--dataset', choices=['cifar10', 'fashion-mnist'], default='cifar10')
    p.add_argument('--train-images', type=int, help='the first N training images only')
    p.add_argument('--milestones', type=lambda v: [int(x) for x in v.split(',') if x], default=[])
    p.add_argument('--lr-decay', type=float, default=0.1)
    p.add_argument('--state', help='safetensors state_dict to start from (default: PyTorch\'s initialisation)')
    p.add_argument('--powersgd-rank', type=int, default=0, help='0: dense all-reduce')
    p.add_argument('--start-powersgd-iter', type=int, default=2,
                   help="the PowerSGD hook's start_powerSGD_iter: steps all-reduced dense first (at least 2, as the hook requires with error feedback)")
    p.add_argument('--evals-per-epoch', type=int, default=1, help='test-set evaluations an epoch, the last at its end')
    p.add_argument('--fp16', action='store_true', help="PyTorch's fp16_compress_hook: each bucket cast to fp16, divided by the world size, all-reduced")
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
    dist.init_process_group('gloo', init_method=f'tcp://{args.master}', rank=args.rank, world_size=args.world)
    if args.dataset == 'fashion-mnist':
        train_x, train_y = mnist.read(args.data, 'train', args.train_images)
        test_x, test_y = mnist.read(args.data, 'test')
        normalise = mnist.normaliser(args.dataset)
    else:
        train_x, train_y = cifar.read(args.data, sorted(f for f in os.listdir(args.data) if f.startswith('data_batch_')))
        train_x, train_y = train_x[:args.train_images], train_y[:args.train_images]
        test_x, test_y = cifar.read(args.data, ['test_batch.bin'])
        normalise = cifar.normalise
    joined = time.time()
    torch.manual_seed(args.seed)
    model = models.build(args.model, 10, args.width)
    if args.state:
        model.load_state_dict(safetensors_io.load_state_dict(args.state))
    ddp = DistributedDataParallel(model, broadcast_buffers=True)
    if args.powersgd_rank:
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=args.start_powersgd_iter, min_compression_rate=1,
                                            use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif args.fp16:
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(args.seed * 1000 + args.rank)
    per_rank = -(-len(train_y) // args.world)

    def evaluate():
        """Rank 0's test loss and accuracy with its running statistics (the others wait)."""
        result = {}
        if args.rank == 0:
            model.eval()
            with torch.no_grad():
                logits = torch.cat([model(normalise(test_x[i:i + 250])) for i in range(0, len(test_y), 250)])
            result = {'testLoss': F.cross_entropy(logits, test_y).item(), 'testAccuracy': (logits.argmax(1) == test_y).float().mean().item()}
            model.train()
        dist.barrier()
        return result

    for epoch in range(args.epochs):
        began = time.time()
        paused = 0.0
        for group in opt.param_groups:
            group['lr'] = rate(epoch, args)
        order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(args.seed + epoch))
        order = torch.cat([order, order[:per_rank * args.world - len(order)]])[args.rank::args.world]
        steps = len(range(0, len(order) - args.batch + 1, args.batch))
        # Rounded half up, as the engine rounds.
        within = {int(k * steps / args.evals_per_epoch + 0.5) for k in range(1, args.evals_per_epoch)} - {0, steps}
        model.train()
        losses, evaluations = [], []
        for start in range(0, len(order) - args.batch + 1, args.batch):
            idx = order[start:start + args.batch]
            loss = F.cross_entropy(ddp(normalise(augment(train_x[idx], generator))), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) in within:
                pause = time.time()
                evaluations.append({'step': len(losses), 'steps': steps, 'seconds': pause - began - paused, **evaluate()})
                paused += time.time() - pause
        trained = time.time()
        result = evaluate()
        if args.rank == 0:
            record = {
                'epoch': epoch + 1,
                'lr': rate(epoch, args),
                'trainLoss': float(np.mean(losses)),
                **result,
                'steps': len(losses),
                'seconds': trained - began - paused,
                'wallSeconds': time.time() - joined,
                **({'evaluations': evaluations} if evaluations else {}),
            }
            print(json.dumps(record), flush=True)
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
