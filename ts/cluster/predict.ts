/**
 * Seconds per training step predicted for a cluster (`accordion plan`): α-β models of the collectives
 * the exchange runs over W workers, applied to a model's parameter shapes at a compression level, with
 * the compute and compression times measured (or given).
 *
 * A message of b bytes costs α + b/β (α the latency, β the bandwidth of one worker's link):
 *  - all-reduce of B bytes: two workers swap their buffers, α + B/β (the engine's pair exchange);
 *    a ring (Gloo; NCCL's ring) 2(W − 1)·α + 2(W − 1)/W · B/β; a pipelined binary tree (NCCL's
 *    trees) 2⌈log₂ W⌉·α + 2·B/β;
 *  - all-gather of b bytes per worker (TopK; a ring whatever the all-reduce's algorithm):
 *    (W − 1)·(α + b/β);
 *  - broadcast of B bytes (rank 0's batch-norm statistics before each step; a binomial tree):
 *    ⌈log₂ W⌉·(α + B/β).
 * The exchange runs per bucket, as the engine answers for shapes and a level (binding.exchangeTraffic,
 * from the rules it sends by): PowerSGD's P and Q in one all-reduce each, TopK's pairs in one
 * all-gather, matrices sent dense in bf16 in one all-reduce, the dense tensors in one; then the
 * workers' agreement on finite gradients, an all-reduce of W floats. A step takes
 *  - the exchange after backward: broadcast + compute + compression + communication;
 *  - overlapped with backward: broadcast + max(compute + compression, forward + compression +
 *    communication): the exchange starts once forward has ended and, with one core for both,
 *    compression takes the core from backward (the bound the overlap benchmark measures against).
 * Assumed: every link alike and full duplex, no contention beyond the algorithm's, collectives back
 * to back, compute the same on every worker (no waiting for a straggler).
 */
import type { CompressionSpec } from '../config/compression.js';
import type { CommDtype } from '../config/options.js';
import type { Link } from '../train/link.js';
import { binding, type BucketTraffic } from '../native/binding.js';

export type Algorithm = 'ring' | 'tree';


function rounds(workers: number): number {
  return Math.ceil(Math.log2(workers));
}

/** Seconds of an all-reduce of `bytes` per worker among `workers`. */
export function allReduceSeconds(bytes: number, workers: number, link: Link, algorithm: Algorithm): number {
  if (workers < 2 || bytes <= 0) return 0;
  const { latencySeconds: a, bytesPerSecond: b } = link;
  if (workers === 2) return a + bytes / b;
  if (algorithm === 'tree') return 2 * rounds(workers) * a + (2 * bytes) / b;
  return 2 * (workers - 1) * a + ((2 * (workers - 1)) / workers) * (bytes / b);
}

/** Seconds of an all-gather of `bytes` from each of `workers` (a ring). */
export function allGatherSeconds(bytes: number, workers: number, link: Link): number {
  if (workers < 2 || bytes <= 0) return 0;
  return (workers - 1) * (link.latencySeconds + bytes / link.bytesPerSecond);
}

/** Seconds of a broadcast of `bytes` from one worker to `workers` (a binomial tree). */
export function broadcastSeconds(bytes: number, workers: number, link: Link): number {
  if (workers < 2 || bytes <= 0) return 0;
  return rounds(workers) * (link.latencySeconds + bytes / link.bytesPerSecond);
}

/** The exchange of a model at a level, as the engine buckets it. */
export interface ExchangeShape {
  /** Parameter shapes, state_dict order. */
  shapes: number[][];
  spec: CompressionSpec;
  /** Every matrix's level (0: dense). */
  level: number;
  /** The precision values travel in (TopK's indices take 4 bytes). */
  commDtype: CommDtype;
  /** Buckets of at least this many bytes of gradients; 0: everything after backward, one bucket. */
  bucketBytes: number;
}

/** Per bucket, in the order they travel, the bytes each collective sends per worker: the engine's answer. */
export function bucketTraffic(x: ExchangeShape): BucketTraffic[] {
  const { kind: compressor, minCompressionRate } = x.spec;
  return binding.exchangeTraffic(x.shapes, { compressor, levels: x.shapes.map(() => x.level), bucketBytes: x.bucketBytes, commDtype: x.commDtype, minCompressionRate });
}

/** The seconds one step spends apart from the exchange's collectives, measured or given. */
export interface StepWork {
  /** Forward, backward and the update; forward alone. */
  computeSeconds: number;
  forwardSeconds: number;
  /** The compression kernels at the level (0 dense). */
  compressionSeconds: number;
  /** Floats rank 0 broadcasts before each step (its batch-norm running statistics). */
  broadcastFloats: number;
}

/** One row of a plan: a worker count and every level's prediction there. */
export interface PlanRow {
  workers: number;
  levels: { level: number; prediction: StepPrediction }[];
}

export interface StepPrediction {
  workers: number;
  /** Seconds of the step's collectives: the exchange, the agreement and the broadcast. */
  communicationSeconds: number;
  /** Seconds per step with the exchange after backward, and overlapped with it. */
  afterBackwardSeconds: number;
  overlappedSeconds: number;
  /** Collectives per step. */
  collectives: number;
}

/** Seconds of one training step among `workers` over `link`. */
export function predictStep(x: ExchangeShape, work: StepWork, workers: number, link: Link, algorithm: Algorithm): StepPrediction {
  let exchange = 0, collectives = 0;
  if (workers > 1) {
    for (const t of bucketTraffic(x)) {
      for (const bytes of [t.powerSgdP, t.powerSgdQ, t.denseBf16, t.dense]) {
        if (bytes > 0) collectives++;
        exchange += allReduceSeconds(bytes, workers, link, algorithm);
      }
      if (t.topkPairs > 0) collectives++;
      exchange += allGatherSeconds(t.topkPairs, workers, link);
    }
    exchange += allReduceSeconds(4 * workers, workers, link, algorithm); // the agreement
    collectives++;
  }
  const broadcast = broadcastSeconds(4 * work.broadcastFloats, workers, link);
  if (workers > 1 && work.broadcastFloats > 0) collectives++;
  const { computeSeconds: c, forwardSeconds: f, compressionSeconds: k } = work;
  return {
    workers,
    communicationSeconds: exchange + broadcast,
    afterBackwardSeconds: broadcast + c + k + exchange,
    overlappedSeconds: broadcast + Math.max(c + k, f + k + exchange),
    collectives,
  };
}
