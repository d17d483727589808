// A worker of the multi-process collective tests: connects through the environment (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ACCORDION_JOB_TOKEN), runs the collectives named in
// argv[2] (JSON) on deterministic per-rank data, and prints one JSON line with the results.
import { ProcessGroup, distributedEnv } from '../../lib/dist/group.js';

/** Rank r's data for case c: values anyone can recompute. */
export function dataFor(rank, length, salt) {
  return Float32Array.from({ length }, (_, i) => Math.fround(Math.sin(0.1 * i + 1.7 * rank + salt) * (rank + 1)));
}

const spec = JSON.parse(process.argv[2] ?? '{}');
const env = distributedEnv();
const group = await ProcessGroup.fromEnv(env, spec.timeoutMs ?? 20000);
const out = { rank: env.rank, results: [] };
for (const c of spec.cases ?? []) {
  const length = c.lengths ? c.lengths[env.rank] : c.length;
  const data = dataFor(env.rank, length, c.salt ?? 0);
  if (c.op === 'allReduce') await group.allReduce(data, { average: c.average });
  if (c.op === 'broadcast') await group.broadcast(data, c.root);
  if (c.op === 'barrier') await group.barrier();
  const result = c.op === 'allGather' ? await group.allGather(data, c.lengths) : data;
  out.results.push(Array.from(result));
}
if (spec.config) await group.checkConfig({ ...spec.config, ...(spec.configByRank?.[env.rank] ?? {}) });
process.stdout.write(JSON.stringify(out) + '\n');
await group.dispose();
