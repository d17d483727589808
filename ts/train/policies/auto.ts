/**
 * Automatic levels: Accordion's regimes steer an error budget, and at each check (and at a
 * learning-rate decay) rank 0 picks every matrix's level among the candidates by their measured
 * errors and costs (../auto-levels.ts), broadcast as indices into the candidates so that every worker
 * sets exactly the same values. Priced in seconds, the costs use the link measured at the start and
 * the kernel times of the first plan, kept in the state so that a resumed run plans alike.
 */
import type { LevelCost } from '../../native/binding.js';
import { planLevels, type CostModel } from '../auto-levels.js';
import type { Regime } from '../accordion.js';
import type { AutoRecord, LevelSwitch } from '../records.js';
import { AccordionPolicy, shownRatios } from './accordion.js';
import type { CheckInput, CheckOutput, Link } from './policy.js';
import { scheduledRate } from './settings.js';

interface AutoState {
  bytesPerSecond?: number;
  latencySeconds?: number;
  kernelSeconds?: number[][];
}

export class AutoPolicy extends AccordionPolicy {
  private auto: AutoState = {};

  /** Levels are chosen at Accordion's checks and where the schedule decays the rate. */
  private chooses(epoch: number): boolean {
    return epoch % this.s.config.accordionInterval === 0 || scheduledRate(this.s, epoch + 1) < scheduledRate(this.s, epoch);
  }

  override candidates(epoch: number): number[] | undefined {
    return this.chooses(epoch) ? this.s.spec.candidates : undefined;
  }

  override needsLink(): boolean {
    return this.s.config.autoCost === 'seconds' && this.auto.bytesPerSecond === undefined;
  }

  override useLink(link: Link): void {
    Object.assign(this.auto, link);
  }

  override async check(input: CheckInput): Promise<CheckOutput> {
    const { decision, regimes } = await this.regimes(input);
    let levels = input.levels;
    let auto: AutoRecord | undefined;
    if (this.chooses(input.epoch)) {
      const candidates = this.s.spec.candidates;
      const picked = new Float32Array(input.levels.length);
      if (input.costs) {
        // The first check has no earlier norms: every layer is critical there by rule, not by
        // measurement, and the budget is the reference's error, as Accordion takes its low level.
        // Later a layer's share tightens where a critical regime is detected (a norm change of η or
        // more, or a learning-rate decay).
        const detected = regimes.map((r, i): Regime => (r === 'critical' && (decision.ratios[i] !== undefined || decision.lrOverride) ? 'critical' : 'stable'));
        auto = this.planAuto(input.costs, detected, input.norms);
        auto.levels.forEach((level, i) => (picked[i] = candidates.indexOf(level)));
      }
      await input.broadcast(picked);
      levels = Array.from(picked, (k, i) => (this.s.matrices[i] ? candidates[k]! : 0));
    }
    const reasons = levels.map((): LevelSwitch['reason'] => 'auto');
    return { levels, reasons, regimes, record: { norms: input.norms, ratios: shownRatios(decision), ...(auto ? { auto } : {}) } };
  }

  /** Rank 0's plan of automatic levels. */
  private planAuto(costs: LevelCost[][], regimes: Regime[], norms: number[]): AutoRecord {
    const { config, spec } = this.s;
    let cost: CostModel = { kind: 'floats' };
    if (config.autoCost === 'seconds' && this.auto.bytesPerSecond) {
      this.auto.kernelSeconds ??= costs.map((list) => list.map((c) => c.seconds));
      const kept = this.auto.kernelSeconds;
      costs = costs.map((list, i) => list.map((c, k) => ({ ...c, seconds: kept[i]?.[k] ?? c.seconds })));
      cost = { kind: 'seconds', bytesPerSecond: this.auto.bytesPerSecond, workers: config.workers, compressor: spec.kind };
    }
    const plan = planLevels(costs, regimes, norms, {
      reference: spec.reference,
      errorBudget: config.errorBudget,
      criticalBudget: config.criticalBudget,
      errorMeasure: config.errorMeasure,
      cost,
    });
    return { ...plan, costUnit: cost.kind };
  }

  override save(): Record<string, unknown> {
    return { ...super.save(), auto: this.auto };
  }

  override restore(saved: Record<string, unknown>): void {
    super.restore(saved);
    if (saved.auto) this.auto = saved.auto as AutoState;
  }
}
