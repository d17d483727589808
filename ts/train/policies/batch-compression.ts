/**
 * Batch and levels together: the batch grows as the batch policy grows it and the levels follow
 * Accordion's rule, both from the same norms at the same checks (levels first, then the batch).
 */
import { AccordionPolicy } from './accordion.js';
import { BatchPolicy } from './batch.js';
import { BasePolicy, type CheckInput, type CheckOutput } from './policy.js';
import type { PolicySettings } from './settings.js';

export class BatchCompressionPolicy extends BasePolicy {
  override readonly usesNorms = true;
  override readonly setsLevels = true;
  private readonly levels: AccordionPolicy;
  private readonly batch: BatchPolicy;

  constructor(s: PolicySettings) {
    super();
    this.levels = new AccordionPolicy(s);
    this.batch = new BatchPolicy(s);
  }

  plan(epoch: number): { lr: number; batch: number } {
    return this.batch.plan(epoch);
  }

  override async check(input: CheckInput): Promise<CheckOutput> {
    const levels = await this.levels.check(input);
    const batch = await this.batch.check(input);
    return { ...levels, ...batch };
  }

  save(): Record<string, unknown> {
    // The batch's global batch is the run's.
    return { ...this.levels.save(), ...this.batch.save() };
  }

  restore(saved: Record<string, unknown>): void {
    this.levels.restore(saved);
    this.batch.restore(saved);
  }
}
