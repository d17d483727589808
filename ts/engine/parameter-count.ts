/**
 * How many parameters a model has, from its architecture and sizes alone (nothing allocated): the
 * memory checks read it before a model is built, and test/engine/model.test.js holds it to the count of
 * every model the engine builds.
 */
import type { Architecture } from '../config/options.js';

export interface ModelSize {
  architecture: Architecture;
  /** Classes; the vocabulary for the LSTM (0 leaves out its embedding and decoder). */
  classes: number;
  width?: number;
  hidden?: number;
  layers?: number;
}

/** A layer's channels at `width`: rounded, at least 1 (cpp/models/models.cpp). */
const scaled = (channels: number, width: number) => Math.max(1, Math.round(channels * width));

/** A 3×3 convolution from `inC` to `out` channels (with `bias`), and its batch norm. */
const convBn = (inC: number, out: number, bias: boolean) => 9 * inC * out + (bias ? out : 0) + 2 * out;

export function parameterCount(m: ModelSize): number {
  const width = m.width ?? 1;
  if (m.architecture === 'lstm') {
    const h = m.hidden ?? 650;
    // The embedding, tied to the decoder's weight, the decoder's bias, and each layer's four gates.
    return m.classes * h + m.classes + (m.layers ?? 2) * (8 * h * h + 8 * h);
  }
  if (m.architecture === 'resnet18') {
    let inC = scaled(64, width);
    let total = convBn(3, inC, false);
    for (const [planes, stride] of [[64, 1], [128, 2], [256, 2], [512, 2]] as const) {
      const p = scaled(planes, width);
      total += convBn(inC, p, false) + convBn(p, p, false);
      if (stride !== 1 || inC !== p) total += inC * p + 2 * p;  // the 1×1 projection shortcut
      total += 2 * convBn(p, p, false);
      inC = p;
    }
    return total + inC * m.classes + m.classes;
  }
  let inC = 3, total = 0;
  for (const channels of [64, 64, 128, 128, 256, 256, 256, 256, 512, 512, 512, 512, 512, 512, 512, 512]) {
    const out = scaled(channels, width);
    total += convBn(inC, out, true);
    inC = out;
  }
  const hidden = m.classes > 10 ? 4096 : 512;
  return total + (inC + 1) * hidden + (hidden + 1) * hidden + (hidden + 1) * m.classes;
}
