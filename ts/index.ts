/**
 * accordion-engine: a training engine for Node.js with a native (C++) core.
 *
 *   import { Trainer, Model } from 'accordion-engine';
 */
export { Model, type ModelOptions } from './engine/model.js';
export {
  ARCHITECTURES, DEFAULT_CONFIG, OPTIONS, presetValues, type Architecture, type TrainConfig, type OptionSpec, type PresetName, type CompressorName,
} from './config/options.js';
export { DENSE_BF16, compressionSpec, describeLevel, type CompressionSpec } from './config/compression.js';
export { bucketTraffic, type ExchangeShape } from './cluster/predict.js';
export { Batcher, type BatcherOptions } from './engine/batcher.js';
export { Trainer } from './train/trainer.js';
export type { TrainOptions } from './train/config.js';
export type { TrainerContext } from './train/setup.js';
export type { TrainSummary, EpochRecord, EvaluationEvent, StepEvent, CheckpointEvent, LevelSwitch, ReplanRecord } from './train/records.js';
export type { LinkEstimate } from './train/link.js';
export type { Policy, CheckInput, CheckOutput, StepInput, StepOutput } from './train/policies/policy.js';
export { BasePolicy } from './train/policies/policy.js';
export { scheduledRate, type PolicySettings } from './train/policies/settings.js';
export { endOfEpoch, initialState, normChangeRatio, isCritical, wholeModelNorm, type AccordionState, type AccordionRule, type Regime } from './train/rules/accordion.js';
export { ProcessGroup, distributedEnv, type DistributedEnv, type ConnectOptions } from './comm/group.js';
export { launch, type LaunchOptions } from './cluster/launch.js';
export { writeReport } from './report/report.js';
export { learningRateForEpoch, type LrSchedule } from './train/rules/schedule.js';
export { readCifar, type ImageSet, type DatasetName } from './data/cifar.js';
export { writeSyntheticCifar10, ensureSyntheticCifar10, type SyntheticOptions } from './data/synthetic.js';
export { loadImageDataset, type ImageDataset, type ImageDatasetName } from './data/datasets.js';
export { SharedData } from './data/shared.js';
export { readSafetensors, writeSafetensors, type NamedTensor, type Dtype } from './engine/safetensors.js';
export { saveCheckpoint, loadCheckpoint, type TrainerPosition } from './train/checkpoint.js';
export { MetricsLog, readMetrics, readMetricsLog, type MetricsEvent, type MetricsRead } from './base/metrics.js';
export { AccordionError, DataError, CheckpointError, UsageError, NativeError } from './base/errors.js';
import { binding, type BuildInfo, type DeviceQuery } from './native/binding.js';
import { UsageError } from './base/errors.js';
export type { BuildInfo, DeviceQuery, LibraryStatus, MemoryStats, StepResult } from './native/binding.js';
export { parseDevice, requireDevice, type DeviceName } from './native/device.js';

/** How the addon was built (oneDNN, OpenBLAS, CUDA architectures) and its thread count. */
export function buildInfo(): BuildInfo {
  return binding.buildInfo();
}

/**
 * CUDA devices visible to the addon, and whether cuDNN and cuBLAS load; never throws (a driver error
 * or a missing library is reported in the result).
 */
export function deviceQuery(): DeviceQuery {
  return binding.deviceQuery();
}

/** Number of usable CUDA devices (0 without CUDA, a driver or a GPU). */
export function deviceCount(): number {
  return binding.deviceQuery().count;
}

/** Sets the number of native (OpenMP and OpenBLAS) threads: an integer from 1 to 4096. */
export function setThreads(n: number): void {
  if (!Number.isInteger(n) || n < 1 || n > 4096) throw new UsageError(`setThreads: expected an integer from 1 to 4096, got ${String(n)}`);
  binding.setThreads(n);
}
