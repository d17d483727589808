/**
 * How the command line describes a run's compression and its level switches.
 */
import { DENSE_BF16, compressionSpec, describeLevel, isDense, levelUnit, showLevel } from '../config/compression.js';
import type { TrainConfig } from '../config/options.js';
import type { TrainSummary } from '../train/records.js';

export function describeCompressor(c: TrainConfig): string {
  if (c.compressor === 'none') return 'none (dense all-reduce)';
  const spec = compressionSpec(c);
  const unit = levelUnit(spec.kind)!;
  const every = `η ${c.eta}, checked every ${c.accordionInterval} epoch${c.accordionInterval > 1 ? 's' : ''}`;
  if (c.adapt === 'auto') {
    const given = spec.candidates.filter((l) => !isDense(l));
    const dense = spec.candidates.includes(DENSE_BF16) ? 'dense (fp32 or bf16)' : 'dense';
    return (
      `${c.compressor} with automatic levels (${unit}s ${given.join(', ')} or ${dense}, costed in ${c.autoCost}; ${c.errorMeasure} error budget ${c.errorBudget} × ` +
      `that of ${describeLevel(spec.kind, spec.reference)}, ×${c.criticalBudget} for critical layers` +
      `${c.autoCost === 'seconds' && c.linkShare > 0 ? `, following the link (share ${c.linkShare} of compute)` : ''}; ${every})`
    );
  }
  if (c.accordion === 'on') return `${c.compressor} with Accordion (${unit} ${spec.low} in critical regimes, ${spec.high} otherwise; ${every})`;
  return `${c.compressor} ${describeLevel(spec.kind, spec.reference)}`;
}

/** One line per epoch that changed levels: "after epoch 3: 9 layers rank 2 → 1 (conv1.weight, …)". */
export function describeSwitches(summary: TrainSummary): string[] {
  const byEpoch = new Map<number, TrainSummary['switches']>();
  for (const s of summary.switches) byEpoch.set(s.epoch, [...(byEpoch.get(s.epoch) ?? []), s]);
  const unit = levelUnit(summary.compressor);
  return [...byEpoch].map(([epoch, list]) => {
    const groups = new Map<string, string[]>();
    for (const s of list) {
      const change = `${showLevel(s.from)} → ${showLevel(s.to)}${s.reason === 'lr-decay' ? ' (lr decay)' : ''}`;
      groups.set(change, [...(groups.get(change) ?? []), s.parameter]);
    }
    const parts = [...groups].map(([change, names]) => `${names.length} layer${names.length > 1 ? 's' : ''} ${unit} ${change} (${names.slice(0, 3).join(', ')}${names.length > 3 ? ', …' : ''})`);
    return `  after epoch ${epoch}: ${parts.join('; ')}`;
  });
}
