/**
 * accordion-engine: a training engine for Node.js with a native (C++) core.
 *
 *   import { Trainer, Model } from 'accordion-engine';
 */
export { Model, ARCHITECTURES, type Architecture, type ModelOptions } from './model.js';
export { Batcher, type BatcherOptions } from './batcher.js';
export {
  Trainer, DEFAULT_CONFIG, SYNTHETIC_PRESET, type TrainConfig, type TrainSummary, type EpochRecord, type StepEvent, type CheckpointEvent, type LevelSwitch, type TrainerContext,
} from './trainer.js';
export { endOfEpoch, initialState, normChangeRatio, isCritical, wholeModelNorm, type AccordionState, type AccordionRule, type Regime } from './accordion.js';
export { ProcessGroup, distributedEnv, type DistributedEnv, type ConnectOptions } from './cluster/group.js';
export { launch, type LaunchOptions } from './cluster/launch.js';
export { writeReport } from './report/report.js';
export { learningRateForEpoch, type LrSchedule } from './schedule.js';
export { readCifar, type ImageSet, type DatasetName } from './data/cifar.js';
export { writeSyntheticCifar10, ensureSyntheticCifar10, type SyntheticOptions } from './data/synthetic.js';
export { loadImageDataset, type ImageDataset, type ImageDatasetName } from './data/datasets.js';
export { readSafetensors, writeSafetensors, type NamedTensor, type Dtype } from './safetensors.js';
export { saveCheckpoint, loadCheckpoint, type TrainerPosition } from './checkpoint.js';
export { MetricsLog, readMetrics, readMetricsLog, type MetricsEvent, type MetricsRead } from './metrics.js';
export { AccordionError, DataError, CheckpointError, UsageError, NativeError } from './errors.js';
import { binding, type BuildInfo, type DeviceQuery } from './native.js';
import { UsageError } from './errors.js';
export type { BuildInfo, DeviceQuery, LibraryStatus, MemoryStats, StepResult } from './native.js';
export { parseDevice, requireDevice, type DeviceName } from './device.js';

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
