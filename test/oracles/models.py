#!/usr/bin/python3
"""PyTorch twins of the engine's CIFAR models.

The state_dict names here are a contract: safetensors checkpoints are
exchanged between PyTorch and the engine, so renaming a submodule or
changing the order of nn.Sequential entries breaks interop.

Run directly to self-check the parameter counts:
    OMP_NUM_THREADS=2 /usr/bin/python3 test/oracles/models.py
"""

import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        # An empty Sequential (rather than None/Identity) keeps the attribute
        # present in every block while contributing no state_dict entries,
        # so projection blocks get `shortcut.0.*` / `shortcut.1.*`.
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def scaled(channels, width):
    """A layer's channels at the given width, as the engine's --width: rounded, at least 1."""
    return max(1, int(math.floor(channels * width + 0.5)))


class ResNet18(nn.Module):
    def __init__(self, num_classes=10, width=1.0):
        super().__init__()
        # CIFAR variant: 3x3 stem, no max-pool, so 32x32 input reaches
        # layer4 at 4x4.
        stem = scaled(64, width)
        self.conv1 = nn.Conv2d(3, stem, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        in_planes = stem
        layers = []
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            planes = scaled(planes, width)
            blocks = []
            for s in (stride, 1):
                blocks.append(BasicBlock(in_planes, planes, s))
                in_planes = planes
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.linear = nn.Linear(in_planes, num_classes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


VGG19_CFG = [64, 64, 'M', 128, 128, 'M', 256, 256, 256, 256, 'M',
             512, 512, 512, 512, 'M', 512, 512, 512, 512, 'M']


class VGG19BN(nn.Module):
    def __init__(self, num_classes=10, width=1.0):
        super().__init__()
        layers = []
        in_ch = 3
        for v in VGG19_CFG:
            if v == 'M':
                layers.append(nn.MaxPool2d(2, 2))
            else:
                v = scaled(v, width)
                layers += [nn.Conv2d(in_ch, v, 3, padding=1, bias=True),
                           nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                in_ch = v
        # Indexing must match torchvision's vgg19_bn (conv at i, BN at i+1).
        self.features = nn.Sequential(*layers)
        if num_classes == 100:
            # The CIFAR-100 recipe uses the wide 4096 head; the third
            # Dropout shifts the final Linear to index 7.
            self.classifier = nn.Sequential(
                nn.Dropout(0.5), nn.Linear(in_ch, 4096), nn.ReLU(inplace=True),
                nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
                nn.Dropout(0.5), nn.Linear(4096, num_classes),
            )
        else:
            self.classifier = nn.Sequential(
                nn.Dropout(0.5), nn.Linear(in_ch, 512), nn.ReLU(inplace=True),
                nn.Dropout(0.5), nn.Linear(512, 512), nn.ReLU(inplace=True),
                nn.Linear(512, num_classes),
            )
        for m in self.features:
            if isinstance(m, nn.Conv2d):
                # He init over fan-out, the scheme the engine also uses.
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / n))
                m.bias.data.zero_()

    def forward(self, x):
        out = self.features(x)
        return self.classifier(out.flatten(1))


def resnet18(num_classes=10, width=1.0):
    return ResNet18(num_classes, width)


def vgg19bn(num_classes=10, width=1.0):
    return VGG19BN(num_classes, width)


MODELS = {'resnet18': resnet18, 'vgg19bn': vgg19bn}

EXPECTED_PARAMS = {
    ('resnet18', 10): 11_173_962,
    ('resnet18', 100): 11_220_132,
    ('vgg19bn', 10): 20_565_834,
    ('vgg19bn', 100): 39_327_652,
}


def build(name, num_classes, width=1.0):
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    return MODELS[name](num_classes, width)


def without_dropout(model):
    """The model with every dropout at p = 0, as the engine's in comparisons (VGG's classifier)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def count_params(model):
    return sum(p.numel() for p in model.parameters())


def main():
    failed = False
    for (name, classes), expected in EXPECTED_PARAMS.items():
        got = count_params(build(name, classes))
        status = 'ok' if got == expected else f'MISMATCH (expected {expected:,})'
        failed |= got != expected
        print(f"{name:9s} classes={classes:<3d} params={got:,} {status}")
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
