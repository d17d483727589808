/**
 * Accordion on compression levels: at its checks, rank 0 applies the rule to each matrix's norm
 * change and broadcasts the regimes; every worker then sets the low level (low compression) where
 * the regime is critical and the high level elsewhere, for the epochs up to the next check. A
 * learning-rate decay for the next epoch makes every layer critical (checked every epoch).
 */
import { endOfEpoch, initialState, type AccordionState, type Decision, type Regime } from '../rules/accordion.js';
import type { LevelSwitch } from '../records.js';
import type { CheckInput, CheckOutput } from './policy.js';
import type { PolicySettings } from './settings.js';
import { StaticPolicy } from './static.js';

export class AccordionPolicy extends StaticPolicy {
  override readonly usesNorms = true;
  override readonly setsLevels = true;
  protected state: AccordionState;

  constructor(s: PolicySettings) {
    super(s);
    this.state = initialState(s.matrices.length);
  }

  override async check(input: CheckInput): Promise<CheckOutput> {
    const { decision, regimes } = await this.regimes(input);
    const { low, high } = this.s.spec;
    const levels = regimes.map((r, i) => (this.s.matrices[i] ? (r === 'critical' ? low : high) : 0));
    const reasons = regimes.map((r): LevelSwitch['reason'] => (decision.lrOverride && r === 'critical' ? 'lr-decay' : 'norm-change'));
    return { levels, reasons, regimes, record: { norms: input.norms, ratios: shownRatios(decision) } };
  }

  /** The rule on rank 0's norms; every worker takes rank 0's regimes. */
  protected async regimes(input: CheckInput): Promise<{ decision: Decision; regimes: Regime[] }> {
    const { config } = this.s;
    const decision = endOfEpoch(
      this.state,
      { epoch: input.epoch, norms: input.norms, lrCurrent: input.lrCurrent, lrNext: input.lrNext },
      { eta: config.eta, interval: config.accordionInterval },
    );
    const critical = new Float32Array(decision.state.regimes.map((r) => (r === 'critical' ? 1 : 0)));
    await input.broadcast(critical);
    const regimes: Regime[] = Array.from(critical, (c) => (c ? 'critical' : 'stable'));
    this.state = { ...decision.state, regimes };
    return { decision, regimes };
  }

  override save(): Record<string, unknown> {
    return { ...super.save(), accordion: this.state };
  }

  override restore(saved: Record<string, unknown>): void {
    super.restore(saved);
    this.state = saved.accordion as AccordionState;
  }
}

/** The norm-change ratios of a decision, as epoch records keep them (null where none or not finite). */
export function shownRatios(decision: Decision): (number | null)[] {
  return decision.ratios.map((r) => (r === undefined || !Number.isFinite(r) ? null : r));
}
