/**
 * The baseline of Smith et al. ("don't decay the learning rate, increase the batch size"): at each
 * milestone the global batch is multiplied by 1/decay instead of the rate decaying, up to B_high;
 * the rate decays only by what the cap leaves over.
 */
import { learningRateForEpoch } from '../rules/schedule.js';
import { BasePolicy } from './policy.js';
import type { PolicySettings } from './settings.js';

export class SmithPolicy extends BasePolicy {
  constructor(private readonly s: PolicySettings) {
    super();
  }

  plan(epoch: number): { lr: number; batch: number } {
    const { config, schedule } = this.s;
    const undecayed = learningRateForEpoch(epoch, { ...schedule, milestones: [] });
    const decayed = learningRateForEpoch(epoch, schedule);
    const growth = undecayed / decayed; // 1/decay per milestone passed
    const batch = Math.min(config.batchLow * Math.round(growth), config.batchHigh);
    return { lr: undecayed * (batch / config.batchLow / growth), batch };
  }

  save(): Record<string, unknown> {
    return { globalBatch: this.s.config.batchLow };
  }

  restore(): void {}
}
