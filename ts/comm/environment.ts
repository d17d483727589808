/**
 * Which launcher started this process, and the worker's place in its job, read from the launcher's
 * environment variables. In this order (the first that applies wins):
 *
 *   accordion  `accordion launch`: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
 *              ACCORDION_JOB_TOKEN and ACCORDION_STORE_HOSTED=1 (the launcher hosts the store)
 *   torchrun   torchrun or a Kubeflow PyTorchJob: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
 *              (MASTER_PORT + 1 when torchrun's own store holds MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE)
 *   slurm      a task of an srun step: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; master: the first
 *              host of the step's node list unless MASTER_ADDR is set (MPI variables that disagree
 *              come from an mpirun inside the allocation, and win)
 *   openmpi    Open MPI's mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK; MASTER_ADDR required
 *   mpich      MPICH or Intel MPI (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID or PMI_LOCAL_RANK;
 *              MASTER_ADDR required
 *
 * Without a launcher of our own, rank 0 hosts the token-checked store at MASTER_ADDR:MASTER_PORT
 * (DEFAULT_MASTER_PORT unless MASTER_PORT says otherwise). The token is ACCORDION_JOB_TOKEN when set, else it is
 * derived from what every rank of the job shares (the launcher's job id, the master address and
 * port, the world size): it keeps apart jobs that meet on one port, but it is no secret.
 */
import { createHash } from 'node:crypto';
import { UsageError } from '../base/errors.js';

export type Launcher = 'accordion' | 'torchrun' | 'slurm' | 'openmpi' | 'mpich';

export interface LaunchEnvironment {
  launcher: Launcher;
  rank: number;
  worldSize: number;
  localRank: number;
  masterAddr: string;
  masterPort: number;
  token: string;
  /** Whether the launcher hosts the store (else rank 0 does). */
  storeHosted: boolean;
}

/** torchrun's defaults, used when the launcher names no port or address and MASTER_PORT, MASTER_ADDR are unset. */
export const DEFAULT_MASTER_PORT = 29500;
export const DEFAULT_MASTER_ADDR = '127.0.0.1';

type Env = Record<string, string | undefined>;

/** The variable's value as a non-negative integer; `fallback` when it is unset (else an error). */
function integer(env: Env, name: string, fallback?: number): number {
  const raw = env[name];
  if (raw === undefined && fallback !== undefined) return fallback;
  if (raw === undefined) throw new UsageError(`environment variable ${name} is not set`);
  if (!/^\d+$/.test(raw) || !Number.isSafeInteger(Number(raw)))
    throw new UsageError(`environment variable ${name} must be a non-negative integer, got '${raw}'`);
  return Number(raw);
}

function masterPort(env: Env): number {
  const port = integer(env, 'MASTER_PORT', DEFAULT_MASTER_PORT);
  if (port < 1 || port > 65535) throw new UsageError(`environment variable MASTER_PORT must be a TCP port from 1 to 65535, got '${env.MASTER_PORT}'`);
  return port;
}

/** MASTER_ADDR, else `fallback`, else the error `missing`; an empty MASTER_ADDR is an error too. */
function masterAddr(env: Env, fallback: string | undefined, missing?: string): string {
  const addr = env.MASTER_ADDR ?? fallback;
  if (addr === undefined) throw new UsageError(missing ?? 'environment variable MASTER_ADDR is not set');
  if (addr.trim() === '') throw new UsageError('environment variable MASTER_ADDR is empty: set it to the host of rank 0');
  return addr.trim();
}

/**
 * The first host of a SLURM node list in its compressed form: `node[01-04,07]` → node01,
 * `a,b` → a, `gpu-[3-5]` → gpu-3, `n[001-002]x` → n001x, `host` → host. Each bracket contributes
 * its first number as written (zero padding kept).
 */
export function firstSlurmHost(nodelist: string, variable = 'SLURM_NODELIST'): string {
  const bad = (why: string) => new UsageError(`environment variable ${variable} is not a SLURM node list (${why}): '${nodelist}'`);
  let host = '';
  let depth = 0;
  let bracket = '';
  for (const ch of nodelist.trim()) {
    if (depth === 0 && ch === ',') break; // the end of the first host expression
    if (ch === '[') {
      if (depth++ > 0) throw bad('nested brackets');
      bracket = '';
    } else if (ch === ']') {
      if (depth-- === 0) throw bad("a ']' without its '['");
      const first = bracket.split(',')[0]!.split('-')[0]!.trim();
      if (!/^\d+$/.test(first)) throw bad(`'[${bracket}]' does not start with a number`);
      host += first;
    } else if (depth > 0) bracket += ch;
    else host += ch;
  }
  if (depth > 0) throw bad("a '[' without its ']'");
  if (host.trim() === '' || /\s/.test(host.trim())) throw bad('no host name');
  return host.trim();
}

/** A token every rank of the job computes alike from values they all share; not a secret. */
function derivedToken(launcher: Launcher, shared: (string | number | undefined)[]): string {
  return `${launcher}-` + createHash('sha256').update(JSON.stringify([launcher, ...shared])).digest('hex').slice(0, 32);
}

function checkRank(rank: number, worldSize: number, names: [string, string]): void {
  if (worldSize < 1) throw new UsageError(`environment variable ${names[1]} must be at least 1, got ${worldSize}`);
  if (rank >= worldSize) throw new UsageError(`${names[0]} ${rank} is outside the world of ${worldSize} ranks (${names[1]}): ranks go from 0 to ${worldSize - 1}`);
}

function torchrunStyle(env: Env): LaunchEnvironment {
  for (const name of ['RANK', 'WORLD_SIZE'])
    if (env[name] === undefined)
      throw new UsageError(`environment variable ${name} is not set, but ${name === 'RANK' ? 'WORLD_SIZE' : 'RANK'} is: a launcher sets both (torchrun, Kubeflow PyTorchJob)`);
  const rank = integer(env, 'RANK');
  const worldSize = integer(env, 'WORLD_SIZE');
  checkRank(rank, worldSize, ['RANK', 'WORLD_SIZE']);
  const storeHosted = env.ACCORDION_STORE_HOSTED === '1';
  const addr = masterAddr(env, DEFAULT_MASTER_ADDR);
  let port = masterPort(env);
  // torchrun's agent keeps its own store on MASTER_PORT and says so: the job's store takes the next port.
  if (!storeHosted && env.TORCHELASTIC_USE_AGENT_STORE?.toLowerCase() === 'true') {
    if (port === 65535) throw new UsageError("MASTER_PORT 65535 holds torchrun's store and the job's store takes the next port: give torchrun a lower --master-port");
    port += 1;
  }
  // A Kubeflow PyTorchJob runs one worker per pod and sets no LOCAL_RANK: each is its pod's first.
  const localRank = integer(env, 'LOCAL_RANK', env.KUBERNETES_SERVICE_HOST !== undefined ? 0 : rank);
  return {
    launcher: storeHosted ? 'accordion' : 'torchrun',
    rank,
    worldSize,
    localRank,
    masterAddr: addr,
    masterPort: port,
    token: env.ACCORDION_JOB_TOKEN ?? derivedToken('torchrun', [env.TORCHELASTIC_RUN_ID, addr, port, worldSize]),
    storeHosted,
  };
}

/** An MPI launcher's rank and size, when its variables are set. */
function mpiRank(env: Env): { launcher: 'openmpi' | 'mpich'; names: [string, string]; rank: number; worldSize: number } | undefined {
  if (env.OMPI_COMM_WORLD_RANK !== undefined || env.OMPI_COMM_WORLD_SIZE !== undefined)
    return { launcher: 'openmpi', names: ['OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'], rank: integer(env, 'OMPI_COMM_WORLD_RANK'), worldSize: integer(env, 'OMPI_COMM_WORLD_SIZE') };
  if (env.PMI_RANK !== undefined || env.PMI_SIZE !== undefined)
    return { launcher: 'mpich', names: ['PMI_RANK', 'PMI_SIZE'], rank: integer(env, 'PMI_RANK'), worldSize: integer(env, 'PMI_SIZE') };
  return undefined;
}

function slurm(env: Env): LaunchEnvironment | undefined {
  const rank = integer(env, 'SLURM_PROCID');
  const worldSize = integer(env, 'SLURM_NTASKS');
  checkRank(rank, worldSize, ['SLURM_PROCID', 'SLURM_NTASKS']);
  if (worldSize === 1) return undefined; // a step of one task trains alone
  const nodelistVar = env.SLURM_STEP_NODELIST !== undefined ? 'SLURM_STEP_NODELIST' : env.SLURM_NODELIST !== undefined ? 'SLURM_NODELIST' : undefined;
  const addr = masterAddr(
    env,
    nodelistVar && env.MASTER_ADDR === undefined ? firstSlurmHost(env[nodelistVar]!, nodelistVar) : undefined,
    'SLURM gives no node list (SLURM_NODELIST) to find rank 0 on: set MASTER_ADDR (and MASTER_PORT) to the host of rank 0',
  );
  const port = masterPort(env);
  return {
    launcher: 'slurm',
    rank,
    worldSize,
    localRank: integer(env, 'SLURM_LOCALID', rank),
    masterAddr: addr,
    masterPort: port,
    token: env.ACCORDION_JOB_TOKEN ?? derivedToken('slurm', [env.SLURM_JOB_ID, env.SLURM_STEP_ID, addr, port, worldSize]),
    storeHosted: false,
  };
}

function mpi(env: Env): LaunchEnvironment | undefined {
  const found = mpiRank(env)!;
  const { launcher, rank, worldSize } = found;
  checkRank(rank, worldSize, found.names);
  if (worldSize === 1) return undefined;
  const name = launcher === 'openmpi' ? 'Open MPI' : 'MPICH';
  const addr = masterAddr(env, undefined, `${name} gives no master address: set MASTER_ADDR (and MASTER_PORT) to rank 0's host`);
  const port = masterPort(env);
  const localName = launcher === 'openmpi' ? 'OMPI_COMM_WORLD_LOCAL_RANK' : env.MPI_LOCALRANKID !== undefined ? 'MPI_LOCALRANKID' : 'PMI_LOCAL_RANK';
  // Open MPI's job id: PMIX_NAMESPACE (v4 and later) or the ESS job id (v4).
  const jobId = launcher === 'openmpi' ? (env.PMIX_NAMESPACE ?? env.OMPI_MCA_ess_base_jobid) : undefined;
  return {
    launcher,
    rank,
    worldSize,
    localRank: integer(env, localName, rank),
    masterAddr: addr,
    masterPort: port,
    token: env.ACCORDION_JOB_TOKEN ?? derivedToken(launcher, [jobId, addr, port, worldSize]),
    storeHosted: false,
  };
}

/**
 * The worker's place in its job from the environment `env`: undefined when no launcher started it
 * (or one started it as a world of one, except torchrun and `accordion launch`). Bad values are
 * usage errors naming the variable.
 */
export function detectLauncher(env: Env = process.env): LaunchEnvironment | undefined {
  if (env.RANK !== undefined || env.WORLD_SIZE !== undefined) return torchrunStyle(env);
  const mpiPlace = mpiRank(env);
  // A batch script or an salloc shell also has SLURM_PROCID and SLURM_NTASKS; only srun starts a step.
  if (env.SLURM_PROCID !== undefined && env.SLURM_NTASKS !== undefined && env.SLURM_STEP_ID !== undefined) {
    // srun's MPI support (PMI) gives the same place. Otherwise mpirun started this process inside
    // the step (its daemons on other nodes run as srun tasks): its ranks inherit SLURM variables
    // that describe those daemons, and mpirun's own tell where this process is.
    const inner = mpiPlace && (String(mpiPlace.rank) !== env.SLURM_PROCID || String(mpiPlace.worldSize) !== env.SLURM_NTASKS);
    if (!inner) return slurm(env);
  }
  if (mpiPlace) return mpi(env);
  return undefined;
}

/** How messages name each launcher. */
export const LAUNCHER_NAMES: Record<Launcher, string> = {
  accordion: 'accordion launch',
  torchrun: 'torchrun or Kubeflow PyTorchJob',
  slurm: 'SLURM (srun)',
  openmpi: 'Open MPI',
  mpich: 'MPICH or Intel MPI',
};

/** One line for `accordion info`: the launcher, the worker's place and the master. */
export function describeLaunch(job: LaunchEnvironment | undefined): string {
  if (!job) return 'running alone';
  return (
    `${LAUNCHER_NAMES[job.launcher]}: rank ${job.rank} of ${job.worldSize}, local rank ${job.localRank}, master ${job.masterAddr}:${job.masterPort}` +
    (job.storeHosted ? ' (store hosted by the launcher)' : ' (rank 0 hosts the store)')
  );
}
