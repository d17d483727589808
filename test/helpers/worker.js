// The scaffold of a test's worker process: its spec from argv[2], the job's process group from the
// environment, its result as one JSON line on stdout, and a failure on stderr with exit code 1.
import { pathToFileURL } from 'node:url';
import { ProcessGroup, distributedEnv } from '../../lib/comm/group.js';

/**
 * Runs `main(spec)`, the spec being argv[2] as JSON, when the module at `moduleUrl` is the process's
 * script (not when a test imports it). A failure is written to stderr and ends the process with code 1.
 */
export function runAsWorker(moduleUrl, main) {
  if (!process.argv[1] || moduleUrl !== pathToFileURL(process.argv[1]).href) return;
  main(JSON.parse(process.argv[2])).catch((err) => {
    process.stderr.write(`error: ${err.code ?? ''} ${err.stack ?? err.message}\n`);
    process.exit(1);
  });
}

/**
 * Joins the job's process group (RANK, WORLD_SIZE, … from the environment), runs `fn(group, env)` and
 * prints `{ rank, ...result }` as one JSON line; the group is disposed of either way.
 */
export async function printFromGroup(timeoutMs, fn) {
  const env = distributedEnv();
  const group = await ProcessGroup.fromEnv(env, timeoutMs);
  try {
    const result = await fn(group, env);
    process.stdout.write(JSON.stringify({ rank: env.rank, ...result }) + '\n');
  } finally {
    await group.dispose();
  }
}
