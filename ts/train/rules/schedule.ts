/**
 * Learning-rate schedule of the paper (Table 7): the base rate scaled by the number of workers,
 * reached by a linear warm-up, divided by `decay` after each milestone.
 *
 * As in the reference code, the rate is computed at the END of epoch e and used in epoch e + 1;
 * the first epoch uses the base rate, and a milestone m counts once e > m. So with base 0.1, 4
 * workers, warm-up 5 and milestones 150/250, the epochs counted from 1 use 0.1, 0.1, 0.16, 0.22,
 * 0.28, 0.34, 0.4 …, then 0.04 from epoch 153 (m + 3) and 0.004 from epoch 253.
 */
export interface LrSchedule {
  /** Base learning rate for one worker. */
  base: number;
  workers: number;
  warmupEpochs: number;
  milestones: number[];
  /** Multiplier applied at each milestone. */
  decay: number;
}

/** The rate computed at the end of `epoch` (the reference code's get_lr). */
function rateAfter(epoch: number, s: LrSchedule): number {
  const warm = s.warmupEpochs > 0 ? Math.min(epoch / s.warmupEpochs, 1) : 1;
  const factor = 1 + (s.workers - 1) * warm;
  const decays = s.milestones.filter((m) => epoch > m).length;
  return s.base * factor * s.decay ** decays;
}

/** The learning rate used during `epoch` (0-based). */
export function learningRateForEpoch(epoch: number, s: LrSchedule): number {
  return epoch === 0 ? s.base : rateAfter(epoch - 1, s);
}

/** Whether `epoch` (0-based) runs below the warm-up's full rate: the warm-up ramps only with two or more workers. */
export function inWarmup(epoch: number, s: LrSchedule): boolean {
  return s.workers > 1 && epoch <= s.warmupEpochs;
}
