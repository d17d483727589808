/**
 * Accordion's switching rule (Agarwal et al., MLSys 2021), as a pure module: from the norms of each
 * parameter's accumulated gradient it decides, per parameter, whether training is in a critical
 * regime (use the low-compression level) or not (use the high-compression level).
 *
 * - A parameter is critical when |old − curr| / old ≥ η, where curr is the norm of the sum of its
 *   raw local gradients over the epoch just finished and old the same norm at the previous check
 *   (old = 0 counts as critical, and so does a NaN ratio).
 * - Checks happen at the end of every `interval`-th epoch (epochs 0, interval, 2·interval, …); epoch
 *   0 always chooses low compression.
 * - A decrease of the learning rate for the next epoch forces low compression for every parameter;
 *   this is checked at the end of every epoch.
 * - 1-D parameters (biases, batch norm) are never compressed: they have no level.
 * - A decision taken at the end of epoch e applies from epoch e + 1.
 *
 * The same rule drives batch-size mode on the whole-model norm (one "parameter").
 */
import { UsageError } from '../../base/errors.js';

export type Regime = 'critical' | 'stable';

export interface AccordionRule {
  /** Threshold on the relative change of the norm (default 0.5). */
  eta: number;
  /** Epochs between checks (default 10 for vision models, 5 for the LSTM). */
  interval: number;
}

/** The norm-change ratio of one parameter, as the reference code computes it. */
export function normChangeRatio(old: number, curr: number): number {
  if (old === 0) return Number.POSITIVE_INFINITY; // no reference: counts as critical
  return Math.abs(old - curr) / old;
}

/** Critical when ratio ≥ η; a NaN ratio (NaN norms) is critical too. */
export function isCritical(ratio: number, eta: number): boolean {
  return !(ratio < eta);
}

export interface AccordionState {
  /** Norms stored at the last check (per parameter), the reference of the next check. */
  reference: number[] | null;
  /** Epoch of the last check, or −1 before the first. */
  referenceEpoch: number;
  /** Current regime per parameter. */
  regimes: Regime[];
}

export function initialState(parameters: number): AccordionState {
  return { reference: null, referenceEpoch: -1, regimes: new Array<Regime>(parameters).fill('critical') };
}

export interface EpochEnd {
  /** The epoch that just finished (0-based). */
  epoch: number;
  /** ‖Σ_t g_t‖ per parameter over that epoch (rank 0's local gradients). */
  norms: number[];
  /** Learning rate used in that epoch, and the one the next epoch will use. */
  lrCurrent: number;
  lrNext: number;
}

export interface Decision {
  /** The state to keep for the next epoch. */
  state: AccordionState;
  /** Whether this epoch was a check epoch. */
  checked: boolean;
  /** Per parameter: the ratio computed at this check (undefined when none was computed). */
  ratios: (number | undefined)[];
  /** Whether the learning-rate decrease forced every parameter to low compression. */
  lrOverride: boolean;
  /** Parameters whose regime changed, with the old and new regime. */
  switches: { index: number; from: Regime; to: Regime }[];
}

/** Applies the rule at the end of an epoch; the returned regimes govern the next epoch. */
export function endOfEpoch(state: AccordionState, end: EpochEnd, rule: AccordionRule): Decision {
  const n = state.regimes.length;
  if (end.norms.length !== n) throw new UsageError(`endOfEpoch: expected ${n} norms (one per parameter), got ${end.norms.length}`);
  const regimes = [...state.regimes];
  const ratios: (number | undefined)[] = new Array(n).fill(undefined);
  let reference = state.reference;
  let referenceEpoch = state.referenceEpoch;
  const checked = end.epoch % rule.interval === 0;
  if (checked) {
    for (let i = 0; i < n; i++) {
      if (end.epoch === 0 || reference === null) {
        regimes[i] = 'critical';
        continue;
      }
      const ratio = normChangeRatio(reference[i]!, end.norms[i]!);
      ratios[i] = ratio;
      regimes[i] = isCritical(ratio, rule.eta) ? 'critical' : 'stable';
    }
    reference = [...end.norms];
    referenceEpoch = end.epoch;
  }
  const lrOverride = end.lrNext < end.lrCurrent;
  if (lrOverride) regimes.fill('critical');
  const switches = regimes.flatMap((to, index) => (to !== state.regimes[index] ? [{ index, from: state.regimes[index]!, to }] : []));
  return { state: { reference, referenceEpoch, regimes }, checked, ratios, lrOverride, switches };
}

/** The whole model's norm from per-parameter norms of the summed gradient. */
export function wholeModelNorm(norms: number[]): number {
  return Math.sqrt(norms.reduce((sum, v) => sum + v * v, 0));
}
