/**
 * Accordion on the batch size: the rule on the whole model's norm; once training leaves the
 * critical regime the global batch grows from B_low to B_high (never shrinking), from the next epoch,
 * and the learning rate scales with it (B / B_low). A step accumulates the micro-batches that make up
 * the global batch before one exchange.
 */
import { endOfEpoch, initialState, wholeModelNorm, type AccordionState } from '../rules/accordion.js';
import type { CheckInput, CheckOutput } from './policy.js';
import { BasePolicy } from './policy.js';
import { scheduledRate, type PolicySettings } from './settings.js';

export class BatchPolicy extends BasePolicy {
  override readonly usesNorms = true;
  private globalBatch: number;
  private state: AccordionState = initialState(1);

  constructor(private readonly s: PolicySettings) {
    super();
    this.globalBatch = s.config.batchLow;
  }

  plan(epoch: number): { lr: number; batch: number } {
    return { lr: scheduledRate(this.s, epoch) * (this.globalBatch / this.s.config.batchLow), batch: this.globalBatch };
  }

  override async check(input: CheckInput): Promise<CheckOutput> {
    const { config } = this.s;
    // Only growth: the learning-rate override of the compression rule does not apply here.
    const decision = endOfEpoch(
      this.state,
      { epoch: input.epoch, norms: [wholeModelNorm(input.norms)], lrCurrent: input.lr, lrNext: input.lr },
      { eta: config.eta, interval: config.accordionInterval },
    );
    const stable = new Float32Array([decision.state.regimes[0] === 'stable' ? 1 : 0]);
    await input.broadcast(stable);
    this.state = { ...decision.state, regimes: [stable[0] ? 'stable' : 'critical'] };
    if (stable[0] && this.globalBatch === config.batchLow && config.batchHigh !== config.batchLow) {
      this.globalBatch = config.batchHigh;
      return { batch: { from: config.batchLow, to: config.batchHigh, ratio: decision.ratios[0] ?? null } };
    }
    return {};
  }

  save(): Record<string, unknown> {
    return { batch: this.state, globalBatch: this.globalBatch };
  }

  restore(saved: Record<string, unknown>): void {
    this.state = saved.batch as AccordionState;
    if (typeof saved.globalBatch === 'number') this.globalBatch = saved.globalBatch;
  }
}
