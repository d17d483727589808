/**
 * The plain values the addon takes and returns (options, results, build and device information):
 * data only, with no behaviour; ts/native/binding.ts, the seam itself, re-exports them.
 */
import type { CommDtype, CompressorName } from '../config/options.js';

export type { CommDtype, CompressorName };

/**
 * What compressing one weight matrix's epoch gradient sum G at one level costs: the relative error
 * ‖G − C(G)‖ / ‖G‖ of one worker's compression from fresh state, the floats sent per step, and the
 * compression kernels' seconds on G, and the floats' bytes on the wire in the exchange's precision.
 * Level 0 is dense (error 0).
 */
export interface LevelCost {
  level: number;
  error: number;
  floats: number;
  bytes: number;
  seconds: number;
}

export interface BuildInfo {
  dnnl: string;
  openblas: string;
  threads: number;
  /**
   * oneDNN's view of the CPU; bf16 products 'native' (AVX512-BF16, AMX) or 'rounded' (rounded inputs,
   * fp32 products); fp32 products on OpenBLAS, or on oneDNN where OpenBLAS fell back to its generic kernels.
   */
  cpu: { isa: string; bf16: 'native' | 'rounded'; sgemm: 'openblas' | 'onednn' };
  /** `nccl`: true when libnccl.so.2 loads, else the reason it does not. */
  cuda: { built: boolean; architectures: string; runtimeVersion: number; nccl: true | string };
  models: string[];
}

/** A library loaded at run time: its file and version, or why it did not load (every path tried). */
export interface LibraryStatus {
  loaded: boolean;
  path: string;
  version: string;
  error: string;
}

export interface DeviceQuery {
  count: number;
  /** The CUDA runtime's error code when the query failed (e.g. 35: driver too old or absent), else 0. */
  errorCode: number;
  error: string;
  devices: { name: string; computeCapability: string; memoryBytes: number }[];
  cudnn: LibraryStatus;
  cublas: LibraryStatus;
  nccl: LibraryStatus;
}

/** Bytes of device memory a model's tensors hold now and held at most (0 on the CPU). */
export interface MemoryStats {
  device: string;
  allocated: number;
  peak: number;
}

/**
 * What a step sent and how long its parts took: one step's (StepResult), or summed over an epoch's
 * steps (EpochRecord, summed by train/records.ts's addStepFigures).
 */
export interface StepFigures {
  /** Floats this worker sent in the gradient exchange (the paper's figure; docs/accounting.md §1). */
  floatsSent: number;
  /** Those floats at their size on the wire (4 bytes, 2 for values sent in bf16 or fp16; indices 4). */
  bytesSent: number;
  /** Floats of the step's control traffic, not in floatsSent: the workers' agreement that every
   * gradient is finite, an all-reduce of W floats, and rank 0's batch-norm running statistics
   * broadcast before the step (0 with one worker). */
  overheadFloats: number;
  /** Of overheadFloats, rank 0's running statistics broadcast before the step (sent by rank 0). */
  broadcastFloats: number;
  /** Seconds in forward, backward and the update; in compression; waiting in collectives (rank 0's statistics' broadcast included). */
  computeSeconds: number;
  compressionSeconds: number;
  communicationSeconds: number;
  /**
   * Seconds the step waited for the exchange after backward: all of compression and communication
   * when the exchange follows backward, only what backward did not hide when it overlaps (buckets).
   */
  exchangeWaitSeconds: number;
}

export interface StepResult extends StepFigures {
  /** Mean loss over the samples. */
  loss: number;
  correct: number;
  samples: number;
  /**
   * The exchange's collectives in the order they ran, as pairs: the bytes this rank sent (2(W − 1)/W
   * of an all-reduce's buffer, W − 1 contributions of an all-gather) and the seconds it took, waiting
   * for a late peer included (empty with one worker). The link estimate reads them (train/link.ts).
   */
  collectives: Float64Array;
}

/** How an engine shares out its threads and buckets its exchange (Model.exchangePlan). */
export interface ExchangePlan {
  /** OpenMP threads of forward, backward and the update. */
  computeThreads: number;
  /** 1 when a communication thread overlaps the exchange with backward, else 0. */
  communicationThreads: number;
  /** The overlapped exchange's buckets: parameter indices (state_dict order) in the order they travel. */
  buckets: number[][];
}

/**
 * What a group's collectives have carried on this rank, in floats: an all-reduce of n counts n, an
 * all-gather its whole result (n·W for n per rank), a broadcast n; a collective of a one-worker group
 * counts nothing. `elements` is the sum over the three kinds; `bytes` the same elements at their size
 * on the wire (4, or 2 for the values of an all-reduce or all-gather sent in bf16 or fp16).
 */
export interface CollectiveCounts {
  allReduce: { calls: number; elements: number };
  allGather: { calls: number; elements: number };
  broadcast: { calls: number; elements: number };
  barrier: { calls: number };
  elements: number;
  bytes: number;
}


export interface StateEntry {
  name: string;
  dtype: 'F32' | 'F64' | 'I64';
  shape: number[];
  data: ArrayBuffer | Uint8Array;
}


/** An exchange described by its shapes alone: each parameter's level (read for matrices; 0 dense). */
export interface TrafficOptions {
  compressor: CompressorName;
  levels: number[];
  /** Buckets of at least this many bytes of gradients; 0: one bucket. */
  bucketBytes: number;
  commDtype: CommDtype;
  minCompressionRate: number;
}

/**
 * One bucket's bytes per worker by collective: the all-reduce of the dense tensors, the all-reduce of
 * matrices sent dense in bf16, PowerSGD's all-reduces of P and Q, TopK's all-gather of its pairs.
 */
export interface BucketTraffic {
  dense: number;
  denseBf16: number;
  powerSgdP: number;
  powerSgdQ: number;
  topkPairs: number;
}
