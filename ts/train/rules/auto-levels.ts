/**
 * Levels chosen by the engine (`--adapt auto`), after L-GreCo's knapsack with Accordion's regimes
 * steering the budget. At each of Accordion's checks (and at a learning-rate decay), for every weight
 * matrix and every candidate level (PowerSGD ranks or TopK ratios, and dense), the engine measures
 * the relative error of compressing the matrix's epoch gradient sum at that level and the level's
 * cost per step (floats sent, or with a measured link, seconds: kernel time + bytes ÷ bandwidth).
 * It then picks one level per matrix minimising the total cost while the summed error stays within
 * the budget:
 *
 *   budget = errorBudget × Σ_layers error(reference level) × (criticalBudget if the layer is in a
 *            critical regime, else 1)
 *
 * where a regime counts as critical when Accordion detects it (the trainer passes the first check,
 * which has no earlier norms to compare, as stable everywhere), and, priced in seconds with a link
 * budget (--link-share s), × the seconds the reference level's bytes take on the link per step /
 * (s × the compute seconds per step): the plan buys accuracy with a link that would otherwise idle,
 * and saves time on one that holds the step up.
 *
 * A layer's error is, by default, its squared error ‖G − C(G)‖² (the relative error times ‖G‖,
 * squared), so the layers' errors add up to the whole model's ‖G − C(G)‖², as in L-GreCo, and a
 * large layer weighs as much as its gradient; with `errorMeasure: 'relative'` it is the relative
 * error ‖G − C(G)‖ / ‖G‖ itself, every layer alike whatever its size.
 *
 * a multiple-choice knapsack, solved exactly by dynamic programming over errors counted in whole
 * units of a fixed resolution (each error rounded up, so the chosen levels never exceed the budget).
 * The resolution is a thousandth of the reference's total error, the same whatever the budget
 * factors, so a larger budget never costs more. The per-collective latency is the same for every
 * choice (the exchange runs the same collectives) and is left out of the costs.
 */
import type { LevelCost } from '../../native/binding.js';
import { collectiveAt } from '../../config/compression.js';
import type { CompressorName, ErrorMeasure } from '../../config/options.js';
import type { Regime } from './accordion.js';

/** One candidate level of one layer, with its error and its cost (floats or seconds per step). */
export interface LevelOption {
  level: number;
  error: number;
  cost: number;
}

export interface LevelChoice {
  /** Per layer, the index of its chosen option. */
  choice: number[];
  error: number;
  cost: number;
  /** Whether the chosen levels fit the budget (false only when no combination does). */
  feasible: boolean;
}

/** Error units of the discretisation: the reference's total error over this many. */
export const ERROR_STEPS = 1000;

/** Errors are counted in whole `unit`s, rounded up (a hair of slack for floating-point multiples). */
function units(error: number, unit: number): number {
  return error <= 0 ? 0 : Math.ceil(error / unit - 1e-9);
}

/**
 * The options, one per layer, of least total cost whose rounded-up errors sum to at most the
 * budget; ties go to the earlier option. Where no combination fits, each layer takes its
 * least-error option and `feasible` is false.
 */
export function chooseLevels(layers: LevelOption[][], budget: number, unit: number): LevelChoice {
  if (!(unit > 0)) throw new RangeError(`chooseLevels: the error unit must be positive, got ${unit}`);
  const capacity = Math.max(0, Math.floor(budget / unit + 1e-9));
  // best[b]: least cost of the layers so far with at most b units; picks[l][b]: layer l's option.
  let best = new Float64Array(capacity + 1);
  const picks: Int32Array[] = [];
  for (const options of layers) {
    const next = new Float64Array(capacity + 1).fill(Infinity);
    const pick = new Int32Array(capacity + 1).fill(-1);
    options.forEach((o, k) => {
      const u = units(o.error, unit);
      for (let b = u; b <= capacity; b++) {
        const c = best[b - u]! + o.cost;
        if (c < next[b]!) {
          next[b] = c;
          pick[b] = k;
        }
      }
    });
    picks.push(pick);
    best = next;
  }
  if (!Number.isFinite(best[capacity]!)) {
    const choice = layers.map((options) => options.reduce((m, o, k) => (o.error < options[m]!.error ? k : m), 0));
    return { choice, ...totals(layers, choice), feasible: false };
  }
  const choice = new Array<number>(layers.length);
  let b = capacity;
  for (let l = layers.length - 1; l >= 0; l--) {
    const k = picks[l]![b]!;
    choice[l] = k;
    b -= units(layers[l]![k]!.error, unit);
  }
  return { choice, ...totals(layers, choice), feasible: true };
}

function totals(layers: LevelOption[][], choice: number[]): { error: number; cost: number } {
  let error = 0, cost = 0;
  choice.forEach((k, l) => {
    error += layers[l]![k]!.error;
    cost += layers[l]![k]!.cost;
  });
  return { error, cost };
}

/** How a level's cost is counted: floats per step, or seconds per step over a measured link. */
export type CostModel = { kind: 'floats' } | { kind: 'seconds'; bytesPerSecond: number; workers: number; compressor: CompressorName };

/**
 * A level's cost per step. In seconds: its kernel time plus the bytes one host sends over the link:
 * an all-reduce (dense, PowerSGD) sends 2(W−1)/W of its bytes (in fp32 or, sent in 16 bits, as an
 * all-to-all and an all-gather alike), TopK's all-gather (W−1)/W of the gathered bytes it is
 * counted by. Bytes are the level's floats at the size --comm-dtype sends them.
 */
export function levelCost(c: LevelCost, model: CostModel): number {
  if (model.kind === 'floats') return c.floats;
  const w = model.workers;
  const share = collectiveAt(model.compressor, c.level) === 'all-reduce' ? (2 * (w - 1)) / w : (w - 1) / w;
  return c.seconds + (c.bytes * share) / model.bytesPerSecond;
}

export interface AutoPlan {
  /** Per parameter, its new level (0 for 1-D parameters and matrices sent dense). */
  levels: number[];
  /** The budget the levels were chosen within: the reference level and error budget's (baseBudget) × linkFactor. */
  budget: number;
  baseBudget: number;
  /** Where the budget follows the link: its factor (LinkBudget). */
  linkFactor?: number;
  /** The reference level (--rank or --topk-ratio). */
  reference: number;
  /** The reference level's summed error, and that of the chosen levels. */
  referenceError: number;
  error: number;
  cost: number;
  feasible: boolean;
  /**
   * Per matrix (by parameter index), its candidates' levels, errors (in the budget's measure) and
   * costs, and what the costs were priced from: floats and bytes per step, and where priced in
   * seconds, kernel seconds (measured times, left out of a plan in floats so that it reproduces).
   */
  candidates: { index: number; levels: number[]; errors: number[]; costs: number[]; floats: number[]; bytes: number[]; seconds?: number[] }[];
}

/**
 * A budget that follows the link: the error budget is scaled by the seconds the reference level's
 * bytes take on the link per step (every matrix at the reference) over `share` × the step's
 * compute seconds. A link on which they take that share of the compute keeps the budget; a faster
 * one tightens it (down to dense, which has no error, as the link becomes free), a slower one
 * loosens it.
 */
export interface LinkBudget {
  share: number;
  computeSeconds: number;
}

/** The factor on the error budget for `candidates` over the link of `cost` (undefined without a link budget or a link). */
export function linkFactor(candidates: AutoPlan['candidates'], reference: number, cost: CostModel, link: LinkBudget | undefined): number | undefined {
  if (cost.kind !== 'seconds' || !link || !(link.share > 0) || !(link.computeSeconds > 0)) return undefined;
  let seconds = 0;
  for (const c of candidates) {
    const k = c.levels.indexOf(reference);
    seconds += levelCost({ level: reference, error: NaN, floats: c.floats[k]!, bytes: c.bytes[k]!, seconds: 0 }, cost);
  }
  return seconds / (link.share * link.computeSeconds);
}

export interface AutoSettings {
  /** The reference level (--rank or --topk-ratio); it must be among the candidates. */
  reference: number;
  /** --error-budget: the budget as a multiple of the reference's error. */
  errorBudget: number;
  /** --critical-budget: the factor on a critical layer's share of the budget. */
  criticalBudget: number;
  /** What a layer's error is in the budget (default squared). */
  errorMeasure?: ErrorMeasure;
  cost: CostModel;
  /** With costs in seconds: the budget follows the link (linkFactor). */
  linkBudget?: LinkBudget;
}

/**
 * The levels of the next epochs from the measured costs of every matrix's candidates (`costs`, as
 * Model.levelCosts gives them: an empty list for 1-D parameters), each parameter's regime and the
 * norm ‖G‖ of its epoch gradient sum (`norms`, which the squared measure weighs errors by).
 */
export function planLevels(costs: LevelCost[][], regimes: Regime[], norms: number[], settings: AutoSettings): AutoPlan {
  const candidates: AutoPlan['candidates'] = [];
  const layers: LevelOption[][] = [];
  let referenceError = 0, budget = 0;
  const squared = (settings.errorMeasure ?? 'squared') === 'squared';
  costs.forEach((list, index) => {
    if (list.length === 0) return;
    const reference = list.find((c) => c.level === settings.reference);
    if (!reference) throw new RangeError(`planLevels: the reference level ${settings.reference} is not among the candidates of parameter ${index}`);
    const norm = norms[index] ?? NaN;
    if (squared && !(norm >= 0)) throw new RangeError(`planLevels: parameter ${index} has no gradient norm (got ${norm})`);
    const errorOf = (c: LevelCost) => (squared ? (c.error * norm) ** 2 : c.error);
    referenceError += errorOf(reference);
    budget += errorOf(reference) * (regimes[index] === 'critical' ? settings.criticalBudget : 1);
    const options = list.map((c) => ({ level: c.level, error: errorOf(c), cost: levelCost(c, settings.cost) }));
    layers.push(options);
    candidates.push({
      index,
      levels: options.map((o) => o.level),
      errors: options.map((o) => o.error),
      costs: options.map((o) => o.cost),
      floats: list.map((c) => c.floats),
      bytes: list.map((c) => c.bytes),
      ...(settings.cost.kind === 'seconds' ? { seconds: list.map((c) => c.seconds) } : {}),
    });
  });
  const base = budget * settings.errorBudget;
  const factor = linkFactor(candidates, settings.reference, settings.cost, settings.linkBudget);
  return { ...choose(costs.length, candidates, base * (factor ?? 1), referenceError), baseBudget: base, reference: settings.reference, ...(factor !== undefined ? { linkFactor: factor } : {}) };
}

/** The levels of `parameters` parameters from their matrices' priced candidates, within `budget`. */
function choose(parameters: number, candidates: AutoPlan['candidates'], budget: number, referenceError: number): Omit<AutoPlan, 'baseBudget' | 'reference'> {
  const layers = candidates.map((c) => c.levels.map((level, k) => ({ level, error: c.errors[k]!, cost: c.costs[k]! })));
  const unit = referenceError > 0 ? referenceError / ERROR_STEPS : Number.MIN_VALUE;
  const chosen = chooseLevels(layers, budget, unit);
  const levels = new Array<number>(parameters).fill(0);
  candidates.forEach((c, l) => (levels[c.index] = c.levels[chosen.choice[l]!]!));
  return { levels, budget, referenceError, error: chosen.error, cost: chosen.cost, feasible: chosen.feasible, candidates };
}

/**
 * A plan made again for another link: the same candidates, errors and budget as `previous` (the
 * last check's measurements), every cost priced anew by `cost`, the budget following the link anew
 * where `linkBudget` is given.
 */
export function replanLevels(previous: AutoPlan, cost: CostModel, linkBudget?: LinkBudget): AutoPlan {
  const candidates = previous.candidates.map((c) => ({
    ...c,
    costs: c.levels.map((level, k) => levelCost({ level, error: NaN, floats: c.floats[k]!, bytes: c.bytes[k]!, seconds: c.seconds?.[k] ?? 0 }, cost)),
  }));
  const factor = linkFactor(candidates, previous.reference, cost, linkBudget);
  const plan = choose(previous.levels.length, candidates, previous.baseBudget * (factor ?? 1), previous.referenceError);
  return { ...plan, baseBudget: previous.baseBudget, reference: previous.reference, ...(factor !== undefined ? { linkFactor: factor } : {}) };
}
