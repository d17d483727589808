/**
 * What a run tells its caller: the record of every epoch, the 'step', 'checkpoint' and level-switch
 * events, and the summary of the whole run. Epochs are counted from 1 everywhere a user reads them
 * (the console, metrics.jsonl, summary.json, the events, checkpoint directories): epoch 1 is the
 * first; "after epoch 3" is after 3 epochs.
 */
import type { Architecture, CompressorName, DatasetName } from '../config/options.js';
import type { AutoPlan } from './rules/auto-levels.js';
import type { LinkEstimate } from './link.js';
import type { StepFigures } from '../native/binding.js';

/** The epoch's figures are its steps' summed (StepFigures); broadcastFloats adds the broadcast before evaluation. */
export interface EpochRecord extends StepFigures {
  /** The epoch, from 1. */
  epoch: number;
  lr: number;
  trainLoss: number;
  trainAccuracy: number;
  testLoss: number;
  testAccuracy: number;
  /** Training samples this worker saw (tokens for a language model) in its `steps` optimiser steps. */
  samples: number;
  steps: number;
  seconds: number;
  samplesPerSecond: number;
  /** Language model: validation loss and perplexity, and test perplexity (exp of the mean loss). */
  validLoss?: number;
  validPerplexity?: number;
  testPerplexity?: number;
  /** The floats and bytes sent since the run began (floatsSent and bytesSent: the epoch's). */
  floatsSentTotal: number;
  bytesSentTotal: number;
  /** With two or more workers: the link as this worker's collectives met it over the epoch (train/link.ts). */
  link?: LinkEstimate;
  /** Floats all-reduced in the epoch to probe the link (train/link.ts ProbeSchedule), beside the exchange's, and the seconds the probes took (within `seconds`). */
  probeFloats?: number;
  probeSeconds?: number;
  /** With Accordion: per parameter, its level in this epoch (0: dense), the norm of its summed
   * gradient, and the norm-change ratio when this epoch was a check. */
  levels?: number[];
  norms?: number[];
  ratios?: (number | null)[];
  /** The global batch size of the epoch (workers × per-worker batch × micro-batches). */
  batchSize: number;
  /** Seconds of Accordion's end-of-epoch bookkeeping: reading norms, deciding, broadcasting, setting levels. */
  bookkeepingSeconds: number;
  /** Seconds of the end-of-epoch replica check: rank 0's running statistics broadcast, every state_dict entry's digest compared (0 alone). */
  syncSeconds: number;
  /** --adapt auto, on rank 0 at the epochs where levels were chosen: the budget, the plan and every matrix's candidates. */
  auto?: AutoRecord;
  /** With --evals-per-epoch above 1: the evaluations within the epoch, before the one at its end. */
  evaluations?: EvaluationEvent[];
}

/** A test-set evaluation within an epoch ('evaluation' events, and an epoch record's `evaluations`). */
export interface EvaluationEvent {
  epoch: number;
  /** The epoch's steps done before it, of `steps`. */
  step: number;
  steps: number;
  /** The epoch's training seconds before it (its evaluations left out). */
  seconds: number;
  testLoss: number;
  testAccuracy: number;
}

/**
 * The plan of automatic levels in an epoch record; costs are floats or seconds per step
 * (`costUnit`), seconds over the link of `bytesPerSecond`.
 */
export type AutoRecord = AutoPlan & { costUnit: 'floats' | 'seconds'; bytesPerSecond?: number };

/**
 * The 'step' event, after every training step: the step's own figures and the epoch's running
 * ones, which are what the progress bar shows (step of steps, loss, accuracy, samples/s, ETA).
 */
export interface StepEvent {
  /** The epoch, from 1. */
  epoch: number;
  /** The step within the epoch, from 1 to `steps`. */
  step: number;
  steps: number;
  lr: number;
  /** This step: mean loss, correct predictions, samples (tokens for a language model), floats sent. */
  loss: number;
  correct: number;
  samples: number;
  floatsSent: number;
  /** The epoch so far: mean loss and accuracy over its samples, samples, floats sent. */
  epochLoss: number;
  epochAccuracy: number;
  epochSamples: number;
  epochFloatsSent: number;
  /** Seconds since the epoch's first step began, samples per second, and the estimated seconds left. */
  seconds: number;
  samplesPerSecond: number;
  etaSeconds: number;
  /** With two or more workers: the link over the last steps' collectives (train/link.ts). */
  link?: LinkEstimate;
}

/** The 'checkpoint' event: the epoch it follows (from 1), its directory, and the seconds it took to write. */
export interface CheckpointEvent {
  epoch: number;
  path: string;
  seconds: number;
}

export interface LevelSwitch {
  /** The epoch (from 1) at whose end the decision was taken; the new level applies from the next one. 'policy': a user's own policy. */
  epoch: number;
  parameter: string;
  from: number;
  to: number;
  reason: 'norm-change' | 'lr-decay' | 'auto' | 'link' | 'policy';
  /** A change between epochs (a re-plan after the link dropped): the run's step after which it applies. */
  runStep?: number;
}

/**
 * Automatic levels planned again for a link that moved (priced in seconds): at an epoch's end
 * between checks, or after a step when the link stayed low for --replan-steps steps.
 */
export interface ReplanRecord {
  /** The epoch (from 1) it happened in, and the run's step after which the new levels apply. */
  epoch: number;
  runStep: number;
  /** The link the plan in force was priced at, and the link now (bytes per second). */
  fromBytesPerSecond: number;
  toBytesPerSecond: number;
  /** The plan: the last check's candidates and budget, priced for the link now. */
  plan: AutoRecord;
}

export interface TrainSummary {
  model: Architecture;
  dataset: DatasetName;
  parameters: number;
  epochs: EpochRecord[];
  finalTestAccuracy: number;
  bestTestAccuracy: number;
  compressor: CompressorName;
  accordion: boolean;
  switches: LevelSwitch[];
  floatsSentTotal: number;
  seconds: number;
  runDir?: string;
  /** Set when stop() ended the run before its last epoch was completed. */
  interrupted?: boolean;
}

/** The record of an epoch cut short by stop(): not evaluated, and never logged. */
export function partialRecord(epoch: number, lr: number, batchSize: number, seconds: number): EpochRecord {
  return {
    epoch: epoch + 1, lr, batchSize, seconds,
    trainLoss: NaN, trainAccuracy: NaN, testLoss: NaN, testAccuracy: NaN, samples: 0, steps: 0, samplesPerSecond: 0,
    ...zeroStepFigures(), floatsSentTotal: 0, bytesSentTotal: 0, bookkeepingSeconds: 0, syncSeconds: 0,
  };
}

const ZERO_FIGURES: StepFigures = {
  floatsSent: 0, bytesSent: 0, overheadFloats: 0, broadcastFloats: 0, computeSeconds: 0, compressionSeconds: 0, communicationSeconds: 0, exchangeWaitSeconds: 0,
};

export function zeroStepFigures(): StepFigures {
  return { ...ZERO_FIGURES };
}

/** Adds a step's figures to `sum`: the one place an epoch's figures are summed. */
export function addStepFigures(sum: StepFigures, step: StepFigures): void {
  for (const key of Object.keys(ZERO_FIGURES) as (keyof StepFigures)[]) sum[key] += step[key];
}
