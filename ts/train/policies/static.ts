/**
 * No adaptation: every matrix keeps the configured level (or is sent dense) and every step takes
 * one batch per worker, at the schedule's learning rate.
 */
import { BasePolicy } from './policy.js';
import { scheduledRate, type PolicySettings } from './settings.js';

export class StaticPolicy extends BasePolicy {
  protected globalBatch: number;

  constructor(protected readonly s: PolicySettings) {
    super();
    this.globalBatch = s.config.batchSize * s.config.workers;
  }

  plan(epoch: number): { lr: number; batch: number } {
    return { lr: scheduledRate(this.s, epoch), batch: this.globalBatch };
  }

  save(): Record<string, unknown> {
    return { globalBatch: this.globalBatch };
  }

  restore(saved: Record<string, unknown>): void {
    if (typeof saved.globalBatch === 'number') this.globalBatch = saved.globalBatch;
  }
}
