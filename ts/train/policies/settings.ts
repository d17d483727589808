/**
 * What every policy is built from: the run's configuration, its compression spec, the learning-rate
 * schedule and which parameters are weight matrices (the ones compression levels apply to).
 */
import type { TrainConfig } from '../../config/options.js';
import type { CompressionSpec } from '../../config/compression.js';
import { learningRateForEpoch, type LrSchedule } from '../rules/schedule.js';

export interface PolicySettings {
  config: TrainConfig;
  spec: CompressionSpec;
  schedule: LrSchedule;
  /** Per parameter, whether it is a matrix (more than one dimension). */
  matrices: boolean[];
}

/** The schedule's rate of an epoch (from 0). */
export function scheduledRate(s: PolicySettings, epoch: number): number {
  return learningRateForEpoch(epoch, s.schedule);
}
