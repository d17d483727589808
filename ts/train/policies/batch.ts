/**
 * Accordion on the batch size: the rule on the whole model's norm; once training leaves the
 * critical regime the global batch grows from B_low to B_high (never shrinking), from the next epoch,
 * and the learning rate scales with it (B / B_low). A step accumulates the micro-batches that make up
 * the global batch before one exchange.
 *
 * The batch never grows into the warm-up: the rate, still ramping up, would be multiplied by
 * B_high / B_low in one step (in the paper the first check, at epoch 10, follows a 5-epoch warm-up).
 * The rule keeps reading the norms meanwhile; the first growth lands on the warm-up's full rate.
 *
 * With --batch-ramp R > 0 the rate does not jump with the batch: in the epoch of the growth it keeps
 * the factor 1 it had, and over the next R epochs the factor rises linearly to B_high / B_low (a
 * second warm-up, in the schedule's grain of one epoch). R = 0 is the paper's jump. With
 * --batch-rate-scaling none the rate stays the schedule's: the growth then acts as a decay of the
 * rate per sample, as in Smith et al.'s schedule, but at the rule's check rather than a milestone.
 */
import { endOfEpoch, initialState, wholeModelNorm, type AccordionState } from '../rules/accordion.js';
import type { CheckInput, CheckOutput } from './policy.js';
import { BasePolicy } from './policy.js';
import { inWarmup } from '../rules/schedule.js';
import { scheduledRate, type PolicySettings } from './settings.js';

export class BatchPolicy extends BasePolicy {
  override readonly usesNorms = true;
  private globalBatch: number;
  /** The first epoch at B_high (none before the growth). */
  private grownAt: number | undefined;
  private state: AccordionState = initialState(1);

  constructor(private readonly s: PolicySettings) {
    super();
    this.globalBatch = s.config.batchLow;
  }

  plan(epoch: number): { lr: number; batch: number } {
    return { lr: scheduledRate(this.s, epoch) * this.rateFactor(epoch), batch: this.globalBatch };
  }

  /** The rate's multiple of the schedule's: B / B_low, reached over --batch-ramp epochs after the growth; 1 with --batch-rate-scaling none. */
  private rateFactor(epoch: number): number {
    if (this.s.config.batchRateScaling === 'none') return 1;
    const full = this.globalBatch / this.s.config.batchLow;
    const ramp = this.s.config.batchRamp;
    if (this.grownAt === undefined || !(ramp > 0)) return full;
    return 1 + (full - 1) * Math.min((epoch - this.grownAt) / ramp, 1);
  }

  override async check(input: CheckInput): Promise<CheckOutput> {
    const { config } = this.s;
    // Only growth: the learning-rate override of the compression rule does not apply here.
    const decision = endOfEpoch(
      this.state,
      { epoch: input.epoch, norms: [wholeModelNorm(input.norms)], lrCurrent: input.lr, lrNext: input.lr },
      { eta: config.eta, interval: config.accordionInterval },
    );
    const stable = decision.state.regimes[0] === 'stable' && !inWarmup(input.epoch + 1, this.s.schedule);
    const decided = new Float32Array([stable ? 1 : 0]);
    await input.broadcast(decided);
    this.state = { ...decision.state, regimes: [decided[0] ? 'stable' : 'critical'] };
    if (decided[0] && this.globalBatch === config.batchLow && config.batchHigh !== config.batchLow) {
      this.globalBatch = config.batchHigh;
      this.grownAt = input.epoch + 1;
      return { batch: { from: config.batchLow, to: config.batchHigh, ratio: decision.ratios[0] ?? null } };
    }
    return {};
  }

  save(): Record<string, unknown> {
    return { batch: this.state, globalBatch: this.globalBatch, ...(this.grownAt === undefined ? {} : { grownAt: this.grownAt }) };
  }

  restore(saved: Record<string, unknown>): void {
    this.state = saved.batch as AccordionState;
    if (typeof saved.globalBatch === 'number') this.globalBatch = saved.globalBatch;
    if (typeof saved.grownAt === 'number') this.grownAt = saved.grownAt;
  }
}
