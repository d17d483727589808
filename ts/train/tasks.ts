/**
 * What a training run iterates over, behind one interface so the trainer's epoch loop, Accordion,
 * checkpoints and metrics serve every model: images through the native batcher (ResNet-18,
 * VGG-19bn), or token windows of a text corpus by truncated backpropagation through time (LSTM).
 */
import * as path from 'node:path';
import type { Model } from '../engine/model.js';
import type { StepResult } from '../native/binding.js';
import { Batcher } from '../engine/batcher.js';
import type { ImageDataset } from '../data/datasets.js';
import { DataError, UsageError } from '../base/errors.js';
import { WIKITEXT_FILES, batchify, bpttWindows, shardForRank, type Corpus } from '../data/wikitext.js';

export interface EvaluationSums {
  /** Summed over the samples (tokens for a language model) of this worker's shard. */
  lossSum: number;
  correct: number;
  samples: number;
}

export interface TrainingTask {
  readonly kind: 'image' | 'language';
  /** Output classes (the vocabulary for a language model). */
  readonly classes: number;
  readonly trainSamples: number;
  readonly testSamples: number;
  /** The evaluation splits, reported every epoch. */
  readonly splits: readonly ('valid' | 'test')[];
  /** Prepares an epoch; returns its number of optimiser steps. */
  startEpoch(model: Model, epoch: number, microBatches: number): Promise<number>;
  step(model: Model, microBatches: number): Promise<StepResult | null>;
  evaluate(model: Model, split: 'valid' | 'test'): Promise<EvaluationSums>;
}

export class ImageTask implements TrainingTask {
  readonly kind = 'image';
  readonly splits = ['test'] as const;
  private readonly train: Batcher;
  private readonly test: Batcher;

  constructor(
    readonly dataset: ImageDataset,
    options: { batchSize: number; evalBatchSize: number; seed: number; rank: number; worldSize: number; device: string },
  ) {
    const common = { mean: dataset.mean, std: dataset.std, seed: options.seed, rank: options.rank, worldSize: options.worldSize, device: options.device };
    this.train = new Batcher(dataset.train, { ...common, batchSize: options.batchSize, shuffle: true, augment: true });
    this.test = new Batcher(dataset.test, { ...common, batchSize: options.evalBatchSize, shuffle: false, augment: false, padShards: false });
  }

  get classes(): number {
    return this.dataset.classes;
  }
  get trainSamples(): number {
    return this.dataset.train.count;
  }
  get testSamples(): number {
    return this.dataset.test.count;
  }

  async startEpoch(_model: Model, epoch: number, microBatches: number): Promise<number> {
    this.train.startEpoch(epoch);
    return Math.ceil(this.train.batchesPerEpoch / microBatches);
  }

  step(model: Model, microBatches: number): Promise<StepResult | null> {
    return model.trainStep(this.train, microBatches);
  }

  async evaluate(model: Model): Promise<EvaluationSums> {
    this.test.startEpoch(0);
    const r = await model.evaluate(this.test);
    return { lossSum: r.loss * r.samples, correct: r.correct, samples: r.samples };
  }
}

/**
 * Word-level language modelling: each worker takes a contiguous slice of the training stream,
 * batchified into `batchSize` columns, and steps through windows of `bptt` rows with the hidden
 * state carried between windows (reset at each epoch and each evaluation).
 */
export class LanguageTask implements TrainingTask {
  readonly kind = 'language';
  readonly splits = ['valid', 'test'] as const;
  private readonly train: ReturnType<typeof batchify>;
  private readonly windows: { start: number; length: number }[];
  private readonly evalData: Record<'valid' | 'test', ReturnType<typeof batchify>>;
  private next = 0;

  constructor(
    readonly corpus: Corpus,
    private readonly options: { batchSize: number; evalBatchSize: number; bptt: number; rank: number; worldSize: number },
  ) {
    this.train = splitData(corpus, 'train', options.batchSize, '--batch-size', options);
    this.windows = bpttWindows(this.train.rows, options.bptt);
    this.evalData = {
      valid: splitData(corpus, 'valid', options.evalBatchSize, '--eval-batch-size', options),
      test: splitData(corpus, 'test', options.evalBatchSize, '--eval-batch-size', options),
    };
  }

  get classes(): number {
    return this.corpus.vocabulary.length;
  }
  get trainSamples(): number {
    return this.corpus.train.length;
  }
  get testSamples(): number {
    return this.corpus.test.length;
  }

  async startEpoch(model: Model, _epoch: number, microBatches: number): Promise<number> {
    this.next = 0;
    await model.resetState();
    return Math.ceil(this.windows.length / microBatches);
  }

  /** One step over the next `microBatches` windows (consecutive: the hidden state runs through them). */
  async step(model: Model, microBatches: number): Promise<StepResult | null> {
    const windows = this.windows.slice(this.next, this.next + microBatches);
    this.next += windows.length;
    if (windows.length === 0) return null;
    return model.trainStep(windows.map((window) => ({ ...slice(this.train, window), steps: window.length, batch: this.train.columns })));
  }

  async evaluate(model: Model, split: 'valid' | 'test'): Promise<EvaluationSums> {
    const data = this.evalData[split];
    await model.resetState();
    const sums: EvaluationSums = { lossSum: 0, correct: 0, samples: 0 };
    for (const window of bpttWindows(data.rows, this.options.bptt)) {
      const r = await model.evaluate({ ...slice(data, window), steps: window.length, batch: data.columns });
      sums.lossSum += r.loss * r.samples;
      sums.correct += r.correct;
      sums.samples += r.samples;
    }
    await model.resetState();
    return sums;
  }
}

/**
 * This worker's shard of a split laid out in `columns` columns. A split too small for that names its
 * file: an empty one is a data error, one with fewer tokens than the columns need a usage error
 * naming the batch-size option.
 */
function splitData(
  corpus: Corpus,
  split: 'train' | 'valid' | 'test',
  columns: number,
  option: string,
  job: { rank: number; worldSize: number },
): ReturnType<typeof batchify> {
  const tokens = corpus[split];
  const file = path.join(corpus.dir, WIKITEXT_FILES[split]);
  if (tokens.length === 0) throw new DataError(`WikiText ${split} split is empty: ${file} holds no text (0 tokens)`);
  const needed = columns * job.worldSize;
  if (tokens.length < needed)
    throw new UsageError(
      `${file} has ${tokens.length} token${tokens.length === 1 ? '' : 's'}, fewer than ${option} ${columns}` +
        `${job.worldSize > 1 ? ` × ${job.worldSize} workers` : ''} needs (one per column); use a smaller ${option} or a larger file`,
    );
  return batchify(shardForRank(tokens, job.rank, job.worldSize), columns);
}

/** Rows [start, start + length) as tokens and the rows one further as targets (views, no copies). */
function slice(data: ReturnType<typeof batchify>, window: { start: number; length: number }) {
  const { columns } = data;
  return {
    tokens: data.data.subarray(window.start * columns, (window.start + window.length) * columns),
    targets: data.data.subarray((window.start + 1) * columns, (window.start + 1 + window.length) * columns),
  };
}
