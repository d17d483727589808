/**
 * The interface of the policies that decide, at the end of an epoch, the compression levels and the
 * global batch of the epochs that follow (Accordion, automatic levels, batch growth, Smith's
 * baseline, batch and levels together, or nothing: static levels), and, after a step, whether the
 * link has moved enough to change levels at once (automatic levels). A policy takes the epoch's
 * norms, the candidate levels' measured costs and the link; it returns decisions, which the trainer
 * applies, logs and emits. Rank 0 decides; `broadcast` carries its decisions to the other workers.
 */
import type { LevelCost } from '../../native/binding.js';
import type { Regime } from '../rules/accordion.js';
import type { Link, LinkEstimate } from '../link.js';
import type { AutoRecord, LevelSwitch, ReplanRecord } from '../records.js';

/** The end of an epoch, as a policy sees it. */
export interface CheckInput {
  /** The epoch, from 0. */
  epoch: number;
  /** The rate the epoch ran at, and the schedule's own rates of this epoch and the next (a grown batch's scaling left out). */
  lr: number;
  lrCurrent: number;
  lrNext: number;
  /** Per parameter, the norm of the epoch's summed local gradients (rank 0's count). */
  norms: number[];
  /** Per parameter, its level in the epoch (0: dense). */
  levels: number[];
  /** On rank 0, when candidates() asked for them: per matrix, every candidate level's error and cost. */
  costs?: LevelCost[][];
  /** The link as this worker's collectives met it over the epoch (with two or more workers). */
  link?: LinkEstimate;
  /** This worker's compute seconds per step over the epoch (forward, backward and update). */
  computeSeconds: number;
  /** Steps run since the run began, after the epoch's last. */
  runStep: number;
  /** Sends rank 0's values to every worker, in place (nothing alone). */
  broadcast(values: Float32Array): Promise<void>;
}

/** What a policy decided: nothing, new levels (every parameter's, even unchanged), a larger batch, or both. */
export interface CheckOutput {
  levels?: number[];
  /** Why each changed level changed. */
  reasons?: LevelSwitch['reason'][];
  /** For the epoch record: the norms, the norm-change ratios where this was a check, and an automatic plan. */
  record?: { norms: number[]; ratios: (number | null)[]; auto?: AutoRecord };
  /** On rank 0, where the levels are a plan in force priced again for a link that moved. */
  replan?: ReplanRecord;
  /** The global batch grew (from the next epoch); `ratio` is the norm change that decided it. */
  batch?: { from: number; to: number; ratio: number | null };
  /** Each parameter's regime (tests and the joint mode read it). */
  regimes?: Regime[];
}

/** After a training step, as a policy sees it: every worker, after every step. */
export interface StepInput {
  /** The epoch, from 1, and the steps run since the run began (a resumed run's earlier steps included). */
  epoch: number;
  runStep: number;
  /** The link over this worker's last steps' collectives. */
  link?: LinkEstimate;
  broadcast(values: Float32Array): Promise<void>;
}

/** Levels changed by a re-plan: every parameter's, why each changed, and (on rank 0) the re-plan. */
export interface StepOutput {
  levels: number[];
  reasons: LevelSwitch['reason'][];
  replan?: ReplanRecord;
}

export interface Policy {
  /** Whether the engine keeps the epoch's gradient sums for the norms. */
  readonly usesNorms: boolean;
  /** Whether the policy sets per-layer levels (the epoch records then carry them). */
  readonly setsLevels: boolean;
  /** The learning rate and the global batch of an epoch (from 0). */
  plan(epoch: number): { lr: number; batch: number };
  /** The candidate levels whose costs rank 0 measures before check() at this epoch's end, if any. */
  candidates(epoch: number): number[] | undefined;
  /** Whether the policy needs a measured link that it does not have yet. */
  needsLink(): boolean;
  useLink(link: Link): void;
  /** Whether the policy follows the link training measures (which then probes it when the exchange cannot). */
  followsLink(): boolean;
  check(input: CheckInput): Promise<CheckOutput>;
  /** After every step on every worker; new levels from the next step, or none. */
  afterStep(input: StepInput): Promise<StepOutput | undefined>;
  /** The policy's state for a checkpoint, and its restoration (the same keys). */
  save(): Record<string, unknown>;
  restore(saved: Record<string, unknown>): void;
}

/** What every policy shares by default: no norms, no levels, no link, nothing decided. */
export abstract class BasePolicy implements Policy {
  readonly usesNorms: boolean = false;
  readonly setsLevels: boolean = false;
  abstract plan(epoch: number): { lr: number; batch: number };
  candidates(_epoch: number): number[] | undefined {
    return undefined;
  }
  needsLink(): boolean {
    return false;
  }
  useLink(_link: Link): void {}
  followsLink(): boolean {
    return false;
  }
  async check(_input: CheckInput): Promise<CheckOutput> {
    return {};
  }
  async afterStep(_input: StepInput): Promise<StepOutput | undefined> {
    return undefined;
  }
  abstract save(): Record<string, unknown>;
  abstract restore(saved: Record<string, unknown>): void;
}
