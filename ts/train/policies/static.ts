/**
 * No adaptation: every matrix keeps the configured level (or is sent dense) and every step takes
 * one batch per worker, at the schedule's learning rate.
 */
import { BasePolicy } from './policy.js';
import { scheduledRate, type PolicySettings } from './settings.js';

export class StaticPolicy extends BasePolicy {
  constructor(protected readonly s: PolicySettings) {
    super();
  }

  /** One batch per worker: the global batch follows the job's size, also when a resume changes it. */
  plan(epoch: number): { lr: number; batch: number } {
    return { lr: scheduledRate(this.s, epoch), batch: this.s.config.batchSize * this.s.config.workers };
  }

  save(): Record<string, unknown> {
    return {};
  }

  restore(_saved: Record<string, unknown>): void {}
}
