/**
 * Automatic levels: Accordion's regimes steer an error budget, and at each check (and at a
 * learning-rate decay) rank 0 picks every matrix's level among the candidates by their measured
 * errors and costs (../rules/auto-levels.ts), broadcast as indices into the candidates so that every worker
 * sets exactly the same values.
 *
 * With --link-share the budget follows the link as well (../rules/auto-levels.ts, LinkBudget):
 * rank 0's compute seconds per step at the last check weigh the reference level's seconds.
 *
 * Priced in seconds, the costs use the link: first the one measured at the start, then the one
 * training measures from its own collectives (../link.ts) once it has moved by more than
 * --replan-factor since the plan in force was priced. Then the plan is made again: at a check from
 * fresh measurements; at the end of another epoch, and after a step once the link has stayed below the
 * plan's ÷ factor for --replan-steps steps in a row, by pricing the last check's candidates anew
 * (replanLevels). Every worker takes part in the broadcast of such a change at the same points (every
 * epoch's end, every --replan-steps steps), so all apply rank 0's plan from the same step. The link,
 * the kernel times of the first plan and the plan in force are kept in the state, so that a resumed
 * run plans alike.
 */
import type { LevelCost } from '../../native/binding.js';
import { planLevels, replanLevels, type AutoPlan, type CostModel, type LinkBudget } from '../rules/auto-levels.js';
import type { Regime } from '../rules/accordion.js';
import type { Link, LinkEstimate } from '../link.js';
import type { AutoRecord, LevelSwitch, ReplanRecord } from '../records.js';
import { AccordionPolicy, shownRatios } from './accordion.js';
import type { CheckInput, CheckOutput, StepInput, StepOutput } from './policy.js';
import { scheduledRate } from './settings.js';

interface AutoState {
  /** The link the plan in force was priced at (bytes a second, and its latency). */
  bytesPerSecond?: number;
  latencySeconds?: number;
  kernelSeconds?: number[][];
  /** Rank 0's plan in force, priced in seconds: what a re-plan prices anew. */
  plan?: AutoPlan;
  /** Rank 0's count of steps in a row whose link stayed below the plan's ÷ --replan-factor. */
  lowSteps?: number;
  /** Rank 0's compute seconds per step over the last check's epoch (what --link-share weighs the link against). */
  computeSeconds?: number;
}

export class AutoPolicy extends AccordionPolicy {
  private auto: AutoState = {};

  /** Levels are chosen at Accordion's checks and where the schedule decays the rate. */
  private chooses(epoch: number): boolean {
    return epoch % this.s.config.accordionInterval === 0 || scheduledRate(this.s, epoch + 1) < scheduledRate(this.s, epoch);
  }

  /** The trainer probes the link for a policy that re-plans (../link.ts ProbeSchedule). */
  override followsLink(): boolean {
    return this.replans();
  }

  /** Whether plans follow the link measured in training: priced in seconds, with a link to measure. */
  private replans(): boolean {
    const { config } = this.s;
    return config.autoCost === 'seconds' && config.replanFactor > 0 && config.workers > 1;
  }

  /** Whether `link` has moved by more than --replan-factor from the one the plan in force was priced at. */
  private moved(link: LinkEstimate | undefined): link is LinkEstimate & { bytesPerSecond: number } {
    const was = this.auto.bytesPerSecond, now = link?.bytesPerSecond;
    if (was === undefined || now === undefined) return false;
    return Math.max(now / was, was / now) > this.s.config.replanFactor;
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
    const record = { norms: input.norms, ratios: shownRatios(decision) };
    if (!this.chooses(input.epoch)) {
      // Between checks: the plan in force again, for the epoch's link when it has moved.
      const replanned = this.replans() ? await this.syncReplan(input.epoch + 1, input.runStep, input.link, true, input.broadcast) : undefined;
      return { ...(replanned ?? {}), regimes, record };
    }
    if (this.replans() && this.moved(input.link)) this.priceAt(input.link);
    this.auto.computeSeconds = input.computeSeconds;
    const candidates = this.s.spec.candidates;
    const picked = new Float32Array(input.levels.length);
    let auto: AutoRecord | undefined;
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
    const levels = Array.from(picked, (k, i) => (this.s.matrices[i] ? candidates[k]! : 0));
    const reasons = levels.map((): LevelSwitch['reason'] => 'auto');
    return { levels, reasons, regimes, record: { ...record, ...(auto ? { auto } : {}) } };
  }

  override async afterStep(input: StepInput): Promise<StepOutput | undefined> {
    if (!this.replans()) return undefined;
    const { replanFactor, replanSteps } = this.s.config;
    const planned = this.auto.bytesPerSecond, now = input.link?.bytesPerSecond;
    this.auto.lowSteps = planned !== undefined && now !== undefined && now < planned / replanFactor ? (this.auto.lowSteps ?? 0) + 1 : 0;
    if (input.runStep % replanSteps !== 0) return undefined;
    return this.syncReplan(input.epoch, input.runStep, input.link, this.auto.lowSteps >= replanSteps, input.broadcast);
  }

  /** From now on levels are priced over `link`. */
  private priceAt(link: LinkEstimate & { bytesPerSecond: number }): void {
    Object.assign(this.auto, { bytesPerSecond: link.bytesPerSecond, latencySeconds: link.latencySeconds, lowSteps: 0 });
  }

  /**
   * A point where every worker takes part. Rank 0, when `due` and `link` has moved from the one the
   * plan in force was priced at, prices that plan's candidates over `link` (replanLevels); a flag and
   * the new plan's candidate indices are broadcast, and every worker returns the plan's levels (the
   * same as before where the new prices change nothing).
   */
  private async syncReplan(
    epoch: number,
    runStep: number,
    link: LinkEstimate | undefined,
    due: boolean,
    broadcast: (values: Float32Array) => Promise<void>,
  ): Promise<StepOutput | undefined> {
    const candidates = this.s.spec.candidates;
    const message = new Float32Array(1 + this.s.matrices.length);
    const previous = this.auto.plan;
    let record: ReplanRecord | undefined;
    if (due && previous && this.moved(link)) {
      const from = this.auto.bytesPerSecond!;
      this.priceAt(link);
      const next = replanLevels(previous, this.costModel(), this.linkBudget());
      this.auto.plan = next;
      message[0] = 1;
      next.levels.forEach((level, i) => (message[1 + i] = candidates.indexOf(level)));
      record = { epoch, runStep, fromBytesPerSecond: from, toBytesPerSecond: link.bytesPerSecond, plan: { ...next, costUnit: 'seconds', bytesPerSecond: link.bytesPerSecond } };
    }
    await broadcast(message);
    if (message[0] !== 1) return undefined;
    const levels = Array.from(message.subarray(1), (k, i) => (this.s.matrices[i] ? candidates[k]! : 0));
    return { levels, reasons: levels.map((): LevelSwitch['reason'] => 'link'), ...(record ? { replan: record } : {}) };
  }

  /** How levels are priced now: floats, or seconds over the link in this.auto. */
  private costModel(): CostModel {
    const { config, spec } = this.s;
    return config.autoCost === 'seconds' && this.auto.bytesPerSecond
      ? { kind: 'seconds', bytesPerSecond: this.auto.bytesPerSecond, workers: config.workers, compressor: spec.kind }
      : { kind: 'floats' };
  }

  /** With --link-share, the budget that follows the link (rank 0's compute seconds per step at the last check). */
  private linkBudget(): LinkBudget | undefined {
    const share = this.s.config.linkShare, computeSeconds = this.auto.computeSeconds;
    return share > 0 && computeSeconds !== undefined ? { share, computeSeconds } : undefined;
  }

  /** Rank 0's plan of automatic levels. */
  private planAuto(costs: LevelCost[][], regimes: Regime[], norms: number[]): AutoRecord {
    const { config, spec } = this.s;
    const cost = this.costModel();
    if (cost.kind === 'seconds') {
      this.auto.kernelSeconds ??= costs.map((list) => list.map((c) => c.seconds));
      const kept = this.auto.kernelSeconds;
      costs = costs.map((list, i) => list.map((c, k) => ({ ...c, seconds: kept[i]?.[k] ?? c.seconds })));
    }
    const plan = planLevels(costs, regimes, norms, {
      reference: spec.reference,
      errorBudget: config.errorBudget,
      criticalBudget: config.criticalBudget,
      errorMeasure: config.errorMeasure,
      cost,
      ...(this.linkBudget() ? { linkBudget: this.linkBudget() } : {}),
    });
    if (cost.kind === 'seconds') this.auto.plan = plan;
    return { ...plan, costUnit: cost.kind, ...(cost.kind === 'seconds' ? { bytesPerSecond: cost.bytesPerSecond } : {}) };
  }

  override save(): Record<string, unknown> {
    return { ...super.save(), auto: this.auto };
  }

  override restore(saved: Record<string, unknown>): void {
    super.restore(saved);
    if (saved.auto) this.auto = saved.auto as AutoState;
    // A plan saved before plans kept their base budget and reference: no link factor then.
    const plan = this.auto.plan as (Omit<AutoPlan, 'baseBudget' | 'reference'> & Partial<AutoPlan>) | undefined;
    if (plan && plan.baseBudget === undefined) this.auto.plan = { ...plan, baseBudget: plan.budget, reference: this.s.spec.reference };
  }
}
