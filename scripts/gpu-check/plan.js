// The GPU check's stages as data: each fits one command of at most 10 minutes on a GPU machine
// (a minute to start a cold one); chained in one command they take about 10 minutes, inside a
// session's 15 minutes of device time. Expected minutes as measured on an H200, rounded up: probe 11 s, abi-lab
// 96-121 s, sanitizer 48-75 s, suite 146-148 s, bench-quick 56-69 s, bench-full 129 s (2026-11-26 and 11-28); the
// experiments peers 110 s without its compiled run (about 30 s more) and reproduce 160 s for 6 epochs (2026-11-28).
// Since then abi-lab has TF32, bf16 and NHWC rows and the suite the precision and both layouts' training tests:
// a minute more each, estimated; peers one more engine run (bf16 on channels-first activations).

/** The test files of the suite stage, run with ACCORDION_REQUIRE_GPU=1. */
export const SUITE = [
  'test/gpu/gpu-devices.test.js', 'test/gpu/gpu-training.test.js', 'test/gpu/gpu-precision.test.js', 'test/native/gradients.test.js', 'test/compress/powersgd.test.js',
  'test/compress/topk-error-feedback.test.js', 'test/compress/levels-and-floats.test.js', 'test/compress/reducer-state.test.js', 'test/native/binding.test.js',
];

/** stage, expected minutes, its own limit in seconds, what it does. */
export const PLAN = [
  { stage: 'probe', minutes: 0.5, limit: 60, what: 'what the machine supports: GPU, driver, cuDNN, cuBLAS, NCCL, compute-sanitizer, the carried build' },
  { stage: 'abi-lab', minutes: 3, limit: 300, what: 'abi_check.cu against the real headers, then the kernel lab quick, one process per op family' },
  { stage: 'sanitizer', minutes: 1.5, limit: 300, what: 'memcheck, then racecheck (the engine\'s kernels), over kernel_check --iterations 1 for every family' },
  { stage: 'suite', minutes: 3.5, limit: 360, what: `${SUITE.join(', ')} with ACCORDION_REQUIRE_GPU=1` },
  { stage: 'bench-quick', minutes: 1, limit: 240, what: 'bench/step.js, bench/lstm.js, bench/compression.js against PyTorch, a few steps' },
  { stage: 'bench-full', minutes: 2.5, limit: 420, what: 'the same benchmarks with their full settings' },
];
/**
 * Experiments that use a GPU session's time apart from the check (each fits a session with the
 * probe): what they measure is in BENCHMARKS.md.
 */
export const EXPERIMENTS = [
  {
    stage: 'precision', minutes: 6, limit: 360,
    what: 'mixed precision and channels-last in one command: the lab rows of the ops they change, the precision and training GPU tests, the LSTM step in fp32 and bf16 beside cuDNN\'s, then peers',
  },
  { stage: 'peers', minutes: 3, limit: 230, what: 'PyTorch as users run it (fp32 with every cuDNN candidate timed; bf16 autocast + channels-last, eager and compiled) beside the engine\'s fp32 and bf16 steps, batch 128' },
  { stage: 'prebuilt', minutes: 1, limit: 120, what: 'the platform package (pack-for-gpu.sh --prebuilt, in place of the data) in a fresh node_modules: accordion info and one epoch on cuda:0 from it' },
  { stage: 'reproduce', minutes: 5.5, limit: 330, what: 'ResNet-18 at full width, PowerSGD rank 2, rank 1 and Accordion, seeds 1 and 2, 4 workers sharing the GPU over Gloo, as many epochs as fit' },
];
/** Starting a cold machine, counted for every command (35 s measured, the checkout's transfer included). */
export const START_MINUTES = 1;
/** The limit of `rebuild`, which is in no plan (only where the carried build does not load). */
export const REBUILD_LIMIT = 540;

export const limitOf = (stage) => [...PLAN, ...EXPERIMENTS].find((p) => p.stage === stage)?.limit ?? REBUILD_LIMIT;

export const COMMAND = 'bash scripts/gpu-check/run.sh';

/** The plan as printed by `plan`. */
export function planText() {
  const lines = [
    `GPU check: ${PLAN.length} commands on the GPU machine, in this order, from the checkout's root with .node-dist carried.`,
    'Each stage runs under its own timeout; give the command a limit a minute longer (the unpacking of a cold machine).',
    '',
    `  ${'#'.padEnd(2)} ${'command'.padEnd(44)} ${'expected'.padStart(9)} ${'timeout'.padStart(8)}  what`,
  ];
  PLAN.forEach((p, i) => lines.push(`  ${String(i + 1).padEnd(2)} ${`${COMMAND} ${p.stage}`.padEnd(44)} ${String(p.minutes).padStart(5)} min ${String(p.limit).padStart(6)} s  ${p.what}`));
  const work = PLAN.reduce((a, p) => a + p.minutes, 0);
  lines.push(
    '',
    `Expected GPU machine time: ${work.toFixed(1)} min of stages + ${START_MINUTES} min of machine start = ${(work + START_MINUTES).toFixed(1)} min with the stages chained in one`,
    `command while the machine stays warm (${COMMAND} probe; ${COMMAND} suite; …), each stage appending its own rows;`,
    `${(work + PLAN.length * START_MINUTES).toFixed(1)} min as ${PLAN.length} commands on a machine started for each.`,
    '$OUT/gpu-check.jsonl (one JSON object per line, appended and flushed per row) and $OUT/gpu-check.log: 2 files per command (at most 6 allowed).',
    `Read them with: node scripts/gpu-check/main.js summary FILE...`,
    `If the probe reports that the carried build does not load: ${COMMAND} rebuild (timeout ${REBUILD_LIMIT} s) first; every stage also rebuilds by itself then, within its own timeout.`,
    '',
    'Experiments, apart from the check (a session of their own, after the probe):',
    ...EXPERIMENTS.map((p) => `  -  ${`${COMMAND} ${p.stage}`.padEnd(44)} ${String(p.minutes).padStart(5)} min ${String(p.limit).padStart(6)} s  ${p.what}`),
  );
  return lines.join('\n');
}
