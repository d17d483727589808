/**
 * accordion-engine/testing: the addon's tools for the engine's own tests and benchmarks, kept out of
 * the library's entry point. Every argument is checked natively before any arithmetic, and every
 * failure is an AccordionError with a code.
 *
 *   import { LayerProbe, ReducerProbe, crossEntropy, orthogonalize, roundTo } from 'accordion-engine/testing';
 *
 * - LayerProbe(kind, options): one layer (conv2d, batchnorm2d, relu, maxpool2d, globalavgpool,
 *   flatten, linear, dropout, basicblock) driven synchronously on small NCHW inputs: forward,
 *   backward, state(), setValue().
 * - ReducerProbe(shapes, options): W simulated workers (threads of this process) compressing and
 *   exchanging given gradients, or this process's single worker of a real job (`group`).
 * - crossEntropy(logits, n, k, labels) and orthogonalize(matrix, rows, cols, eps?): the engine's
 *   loss and PowerSGD's Gram-Schmidt on their own; roundTo(values, commDtype): the rounding of what
 *   the exchange sends in bf16 or fp16.
 */
import { testingBinding, type NativeLayerProbe, type NativeReducerProbe, type NativeReducerProbeOptions } from './native/binding.js';
import { ProcessGroup } from './comm/group.js';
import { UsageError } from './base/errors.js';

export type { LayerStateEntry, NativeLayerProbe, NativeReducerProbe } from './native/binding.js';

export type LayerKind = 'conv2d' | 'batchnorm2d' | 'relu' | 'maxpool2d' | 'globalavgpool' | 'flatten' | 'linear' | 'dropout' | 'basicblock';

export const LayerProbe: new (kind: LayerKind, options?: Record<string, number | boolean>) => NativeLayerProbe = testingBinding.LayerProbe;

/** The native probe's options, with a connected ProcessGroup (this process's worker of a real job). */
export interface ReducerProbeOptions extends Omit<NativeReducerProbeOptions, 'group'> {
  group?: ProcessGroup;
}

export class ReducerProbe extends testingBinding.ReducerProbe implements NativeReducerProbe {
  constructor(shapes: number[][], options: ReducerProbeOptions = {}) {
    super(shapes, nativeOptions(options));
  }
}

function nativeOptions(options: ReducerProbeOptions) {
  if (typeof options !== 'object' || options === null) throw new UsageError('ReducerProbe options must be an object');
  const { group, ...rest } = options;
  if (group !== undefined && !(group instanceof ProcessGroup)) throw new UsageError('ReducerProbe option group must be a ProcessGroup');
  return { ...rest, group: group?.native };
}

export const crossEntropy = testingBinding.crossEntropy;
export const orthogonalize = testingBinding.orthogonalize;
export const roundTo = testingBinding.roundTo;
