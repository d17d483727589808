/**
 * A run's compression as one typed value: the compressor, its static (or reference) level, Accordion's
 * low- and high-compression levels and automatic levels' candidates, and how a level reads and which
 * collective carries it. What a level sends is the engine's answer (binding.exchangeTraffic).
 * A level is a PowerSGD rank or a TopK ratio; level 0 is dense; DENSE_BF16 is dense with the values
 * sent in bf16 and the rounding kept in the matrix's error memory.
 */
import { UsageError } from '../base/errors.js';
import type { CompressorName, TrainConfig } from './options.js';

/**
 * The level of a matrix sent dense in bf16 (summed in fp32) through its error memory, in an exchange
 * that otherwise sends fp32: half the bytes of dense for a rounding that error feedback keeps. A
 * candidate of automatic levels priced in seconds on the CPU (in floats it costs what dense costs).
 */
export const DENSE_BF16 = -1;

/** Whether a level sends the tensor dense (0, or DENSE_BF16). */
export function isDense(level: number): boolean {
  return level <= 0;
}

export interface CompressionSpec {
  kind: CompressorName;
  /** The static level, and with automatic levels the reference of the error budget. */
  reference: number;
  /** Accordion's levels: in critical regimes (low compression) and otherwise (high compression). */
  low: number;
  high: number;
  /**
   * Automatic levels' candidates, ascending: the given ranks or ratios, the reference, dense (0) and,
   * priced in seconds on the CPU where the exchange sends fp32, DENSE_BF16.
   */
  candidates: number[];
  /** PowerSGD keeps a matrix dense unless (n + m)·r·rate < n·m. */
  minCompressionRate: number;
}

/** What differs between the compressors. */
interface Kind {
  /** The compressor as people write it. */
  title: 'PowerSGD' | 'TopK';
  /** How a level is named: "rank 2", "ratio 0.1". */
  unit: 'rank' | 'ratio';
  /** The collective that carries a compressed matrix: its bytes on a worker's link are share × floats × 4. */
  collective: 'all-reduce' | 'all-gather';
}

const KINDS: Record<Exclude<CompressorName, 'none'>, Kind> = {
  powersgd: {
    title: 'PowerSGD',
    unit: 'rank',
    collective: 'all-reduce',
  },
  topk: {
    title: 'TopK',
    unit: 'ratio',
    collective: 'all-gather',
  },
};

/** The compression a configuration describes. */
export function compressionSpec(c: Pick<
  TrainConfig,
  | 'compressor' | 'rank' | 'topkRatio' | 'lowRank' | 'highRank' | 'lowRatio' | 'highRatio' | 'autoRanks' | 'autoRatios' | 'minCompressionRate'
  | 'autoCost' | 'commDtype' | 'device'
>): CompressionSpec {
  const topk = c.compressor === 'topk';
  const reference = topk ? c.topkRatio : c.rank;
  const denseBf16 = c.autoCost === 'seconds' && c.commDtype === 'fp32' && c.device === 'cpu';
  const spec: CompressionSpec = {
    kind: c.compressor,
    reference,
    low: topk ? c.lowRatio : c.lowRank,
    high: topk ? c.highRatio : c.highRank,
    candidates: candidateLevels(topk ? c.autoRatios : c.autoRanks, reference, denseBf16),
    minCompressionRate: c.minCompressionRate,
  };
  checkSpec(spec);
  return spec;
}

/**
 * Automatic levels' candidates: the given ranks or ratios, the reference, 0 (dense) and with
 * `denseBf16` DENSE_BF16, ascending, without repeats.
 */
export function candidateLevels(levels: number[], reference: number, denseBf16 = false): number[] {
  return [...new Set([...levels, reference, 0, ...(denseBf16 ? [DENSE_BF16] : [])])].sort((a, b) => a - b);
}

/** Refuses levels a compressor cannot take: ranks are positive integers, ratios lie in (0, 1]. */
export function checkSpec(spec: CompressionSpec): void {
  if (spec.kind === 'none') return;
  const unit = KINDS[spec.kind].unit;
  const ok = (level: number) => (unit === 'rank' ? Number.isInteger(level) && level >= 1 : level > 0 && level <= 1);
  for (const [what, levels] of [['reference', [spec.reference]], ['low', [spec.low]], ['high', [spec.high]], ['candidate', spec.candidates.filter((l) => !isDense(l))]] as const)
    for (const level of levels)
      if (!ok(level)) throw new UsageError(`${spec.kind}: the ${what} ${unit} ${level} is not ${unit === 'rank' ? 'a positive integer' : 'in (0, 1]'}`);
}

/** The unit a compressor's levels count in. */
export function levelUnit(kind: CompressorName): 'rank' | 'ratio' | undefined {
  return kind === 'none' ? undefined : KINDS[kind].unit;
}

/** "dense", "dense-bf16", "2" (a rank) or "0.1" (a ratio): a level as logs and summaries show it. */
export function showLevel(level: number): string {
  return level === 0 ? 'dense' : level === DENSE_BF16 ? 'dense-bf16' : String(level);
}

/** "rank 2", "ratio 0.1", "dense" or "dense in bf16". */
export function describeLevel(kind: CompressorName, level: number): string {
  if (level === DENSE_BF16) return 'dense in bf16';
  return level === 0 || kind === 'none' ? 'dense' : `${KINDS[kind].unit} ${level}`;
}

/** The compressor's name with its unit: "PowerSGD rank", "TopK ratio". */
export function levelTitle(kind: CompressorName): string {
  return kind === 'none' ? 'dense' : `${KINDS[kind].title} ${KINDS[kind].unit}`;
}

/** The collective that carries a tensor at `level`: dense tensors are all-reduced. */
export function collectiveAt(kind: CompressorName, level: number): 'all-reduce' | 'all-gather' {
  return kind === 'none' || isDense(level) ? 'all-reduce' : KINDS[kind].collective;
}
