// One worker of the collectives benchmark (started by bench/collectives.js with RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT set). Times all-reduce (sum) and all-gather per message size; rank 0
// prints one JSON line: { sizes: [{ op, bytes, ms }] } with the median over the timed iterations.
import { ProcessGroup, distributedEnv } from '../lib/comm/group.js';

const { sizes, warmup, budgetBytes, minIterations, maxIterations } = JSON.parse(process.argv[2]);
// Fewer iterations for large messages: about `budgetBytes` moved per size, between `minIterations` and `maxIterations`.
const iterations = (bytes) => Math.min(maxIterations, Math.max(minIterations, Math.round(budgetBytes / bytes)));
const group = await ProcessGroup.fromEnv(distributedEnv(), 120_000);
const results = [];
for (const op of ['allreduce', 'allgather']) {
  for (const bytes of sizes) {
    // all-gather: `bytes` is the size of the gathered output, as nccl-tests counts it.
    const count = op === 'allreduce' ? bytes / 4 : bytes / 4 / group.worldSize;
    const data = new Float32Array(count).fill(group.rank + 1);
    // Like torch.distributed's all_gather, into an output allocated once.
    const output = new Float32Array(op === 'allgather' ? count * group.worldSize : 0);
    const run = () => (op === 'allreduce' ? group.allReduce(data) : group.allGather(data, undefined, output));
    const n = iterations(bytes);
    for (let i = 0; i < warmup; i++) await run();
    const times = [];
    for (let i = 0; i < n; i++) {
      await group.barrier();
      const t = performance.now();
      await run();
      times.push(performance.now() - t);
    }
    // The slowest rank decides how long a collective took: take the maximum over ranks.
    const worst = new Float32Array(times);
    const all = await group.allGather(worst);
    const perIteration = times.map((_, i) => Math.max(...Array.from({ length: group.worldSize }, (_, r) => all[r * n + i])));
    perIteration.sort((a, b) => a - b);
    results.push({ op, bytes, ms: perIteration[n >> 1] });
  }
}
if (group.rank === 0) process.stdout.write(JSON.stringify({ sizes: results }) + '\n');
await group.dispose();
