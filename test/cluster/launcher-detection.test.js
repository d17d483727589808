// Which launcher started a worker (torchrun, Kubeflow, SLURM, Open MPI, MPICH): the detection of each
// launcher's environment on a hand-made table, and the first host of a SLURM node list.
import { expect } from 'chai';
import { detectLauncher, firstSlurmHost } from '../../lib/comm/environment.js';

describe('launchers: the first host of a SLURM node list', function () {
  const table = [
    ['node[01-04,07]', 'node01'],
    ['a,b', 'a'],
    ['gpu-[3-5]', 'gpu-3'],
    ['n[001-002]x', 'n001x'],
    ['host', 'host'],
    ['a[1-2],b[3-4]', 'a1'],
    ['gpu[003]', 'gpu003'],
    ['node[7,01-04]', 'node7'],
    ['rack[2-3]-n[05,09]', 'rack2-n05'],
    ['host.example.org,other', 'host.example.org'],
    ['127.0.0.1', '127.0.0.1'],
  ];
  for (const [list, first] of table)
    it(`${list} → ${first}`, function () {
      expect(firstSlurmHost(list)).to.equal(first);
    });

  const bad = [
    ['node[01-04', /SLURM_NODELIST is not a SLURM node list \(a '\[' without its '\]'\): 'node\[01-04'/],
    ['node01]', /without its '\['/],
    ['', /no host name/],
    [',node1', /no host name/],
    ['node[a-b]', /'\[a-b\]' does not start with a number/],
    ['node[[1]]', /nested brackets/],
  ];
  for (const [list, message] of bad)
    it(`refuses '${list}'`, function () {
      expect(() => firstSlurmHost(list)).to.throw(message);
    });
});

describe('launchers: detection from the environment', function () {
  const srun = (rank, extra = {}) => ({
    SLURM_JOB_ID: '4242',
    SLURM_STEP_ID: '0',
    SLURM_PROCID: String(rank),
    SLURM_NTASKS: '8',
    SLURM_LOCALID: String(rank % 4),
    SLURM_NODELIST: 'gpu[07-08]',
    ...extra,
  });
  const openmpi = (rank, extra = {}) => ({
    OMPI_COMM_WORLD_RANK: String(rank),
    OMPI_COMM_WORLD_SIZE: '4',
    OMPI_COMM_WORLD_LOCAL_RANK: String(rank % 2),
    PMIX_NAMESPACE: '1611399169',
    MASTER_ADDR: 'head',
    ...extra,
  });
  const place = (launcher, rank, worldSize, localRank, masterAddr, masterPort, storeHosted = false) => ({
    launcher,
    rank,
    worldSize,
    localRank,
    masterAddr,
    masterPort,
    storeHosted,
  });

  const table = [
    ['no launcher', {}, undefined],
    [
      'accordion launch',
      { RANK: '1', WORLD_SIZE: '4', LOCAL_RANK: '1', MASTER_ADDR: '10.0.0.1', MASTER_PORT: '1234', ACCORDION_JOB_TOKEN: 't', ACCORDION_STORE_HOSTED: '1' },
      place('accordion', 1, 4, 1, '10.0.0.1', 1234, true),
    ],
    [
      'torchrun',
      { RANK: '3', WORLD_SIZE: '8', LOCAL_RANK: '1', MASTER_ADDR: 'node0', MASTER_PORT: '29400', TORCHELASTIC_RUN_ID: 'run' },
      place('torchrun', 3, 8, 1, 'node0', 29400),
    ],
    [
      'a Kubeflow PyTorchJob pod (no LOCAL_RANK: the pod\'s only worker)',
      { RANK: '2', WORLD_SIZE: '3', MASTER_ADDR: 'job-master-0', MASTER_PORT: '23456', KUBERNETES_SERVICE_HOST: '10.96.0.1' },
      place('torchrun', 2, 3, 0, 'job-master-0', 23456),
    ],
    [
      "torchrun's static rendezvous (its agent's store holds MASTER_PORT): the next port",
      { RANK: '1', WORLD_SIZE: '2', LOCAL_RANK: '1', MASTER_ADDR: 'node0', MASTER_PORT: '29500', TORCHELASTIC_USE_AGENT_STORE: 'True', TORCHELASTIC_RUN_ID: 'none' },
      place('torchrun', 1, 2, 1, 'node0', 29501),
    ],
    [
      'torchrun --standalone (MASTER_PORT free)',
      { RANK: '1', WORLD_SIZE: '2', LOCAL_RANK: '1', MASTER_ADDR: 'node0', MASTER_PORT: '41234', TORCHELASTIC_USE_AGENT_STORE: 'False' },
      place('torchrun', 1, 2, 1, 'node0', 41234),
    ],
    ['RANK and WORLD_SIZE by hand (one machine)', { RANK: '1', WORLD_SIZE: '2' }, place('torchrun', 1, 2, 1, '127.0.0.1', 29500)],
    ['torchrun inside an srun step and under mpirun: torchrun wins', { ...srun(5), ...openmpi(3), RANK: '0', WORLD_SIZE: '2', MASTER_ADDR: 'm' }, place('torchrun', 0, 2, 0, 'm', 29500)],
    ['srun: master is the first host of SLURM_NODELIST', srun(5), place('slurm', 5, 8, 1, 'gpu07', 29500)],
    ['srun with MASTER_ADDR and MASTER_PORT', srun(0, { MASTER_ADDR: 'login1', MASTER_PORT: '4000' }), place('slurm', 0, 8, 0, 'login1', 4000)],
    ['srun: the step\'s node list first', srun(2, { SLURM_STEP_NODELIST: 'gpu[11-12]' }), place('slurm', 2, 8, 2, 'gpu11', 29500)],
    ['srun --mpi=pmi2 (PMI_RANK agrees): SLURM', srun(6, { PMI_RANK: '6', PMI_SIZE: '8' }), place('slurm', 6, 8, 2, 'gpu07', 29500)],
    ['srun with one task: alone', srun(0, { SLURM_NTASKS: '1' }), undefined],
    ['a batch script (SLURM variables, no step): alone', { ...srun(0), SLURM_STEP_ID: undefined }, undefined],
    ['a batch script running mpirun: Open MPI', { ...srun(0), SLURM_STEP_ID: undefined, ...openmpi(3) }, place('openmpi', 3, 4, 1, 'head', 29500)],
    ["a rank of mpirun started inside an srun step (SLURM's variables describe mpirun's daemon): Open MPI", srun(1, { SLURM_NTASKS: '2', ...openmpi(3) }), place('openmpi', 3, 4, 1, 'head', 29500)],
    ['a rank of mpiexec inside an srun step whose SLURM_NTASKS alone disagrees: MPICH', srun(1, { SLURM_NTASKS: '2', PMI_RANK: '1', PMI_SIZE: '4', MASTER_ADDR: 'h' }), place('mpich', 1, 4, 1, 'h', 29500)],
    ['Open MPI', openmpi(3, { MASTER_PORT: '5000' }), place('openmpi', 3, 4, 1, 'head', 5000)],
    ['Open MPI before MPICH', { ...openmpi(2), PMI_RANK: '0', PMI_SIZE: '9' }, place('openmpi', 2, 4, 0, 'head', 29500)],
    ['mpirun -n 1: alone', openmpi(0, { OMPI_COMM_WORLD_SIZE: '1' }), undefined],
    ['MPICH (Hydra: MPI_LOCALRANKID)', { PMI_RANK: '3', PMI_SIZE: '4', MPI_LOCALRANKID: '1', MASTER_ADDR: 'h', MASTER_PORT: '3000' }, place('mpich', 3, 4, 1, 'h', 3000)],
    ['MPICH (PMI_LOCAL_RANK)', { PMI_RANK: '3', PMI_SIZE: '4', PMI_LOCAL_RANK: '0', MASTER_ADDR: 'h' }, place('mpich', 3, 4, 0, 'h', 29500)],
    ['MPICH without a local rank: LOCAL_RANK is the rank', { PMI_RANK: '3', PMI_SIZE: '4', MASTER_ADDR: 'h' }, place('mpich', 3, 4, 3, 'h', 29500)],
  ];
  for (const [name, env, want] of table)
    it(name, function () {
      const got = detectLauncher(env);
      if (want === undefined) return expect(got).to.equal(undefined);
      const { token, ...rest } = got;
      expect(rest).to.deep.equal(want);
      expect(token).to.be.a('string').that.is.not.empty;
    });

  const errors = [
    ['a RANK that is not an integer', { RANK: 'x', WORLD_SIZE: '2' }, /environment variable RANK must be a non-negative integer, got 'x'/],
    ['RANK outside the world', { RANK: '2', WORLD_SIZE: '2' }, /RANK 2 is outside the world of 2 ranks \(WORLD_SIZE\): ranks go from 0 to 1/],
    ['RANK without WORLD_SIZE', { RANK: '0' }, /environment variable WORLD_SIZE is not set, but RANK is/],
    ['an empty world', { RANK: '0', WORLD_SIZE: '0' }, /WORLD_SIZE must be at least 1/],
    ['a LOCAL_RANK that is not an integer', { RANK: '0', WORLD_SIZE: '2', LOCAL_RANK: '-1' }, /LOCAL_RANK must be a non-negative integer, got '-1'/],
    ['MASTER_PORT out of range', { RANK: '0', WORLD_SIZE: '2', MASTER_PORT: '70000' }, /MASTER_PORT must be a TCP port from 1 to 65535, got '70000'/],
    ["torchrun's store on the last port", { RANK: '0', WORLD_SIZE: '2', MASTER_PORT: '65535', TORCHELASTIC_USE_AGENT_STORE: 'True' }, /MASTER_PORT 65535 holds torchrun's store.*lower --master-port/],
    ['an empty MASTER_ADDR', { RANK: '0', WORLD_SIZE: '2', MASTER_ADDR: ' ' }, /MASTER_ADDR is empty/],
    ['Open MPI without MASTER_ADDR', { ...openmpi(1), MASTER_ADDR: undefined }, /^Open MPI gives no master address: set MASTER_ADDR \(and MASTER_PORT\) to rank 0's host$/],
    ['MPICH without MASTER_ADDR', { PMI_RANK: '1', PMI_SIZE: '2' }, /^MPICH gives no master address: set MASTER_ADDR \(and MASTER_PORT\) to rank 0's host$/],
    ['Open MPI without its size', { OMPI_COMM_WORLD_RANK: '1', MASTER_ADDR: 'h' }, /environment variable OMPI_COMM_WORLD_SIZE is not set/],
    ['an Open MPI rank outside the world', openmpi(4), /OMPI_COMM_WORLD_RANK 4 is outside the world of 4 ranks \(OMPI_COMM_WORLD_SIZE\)/],
    ['a bad SLURM_PROCID', srun('one'), /SLURM_PROCID must be a non-negative integer, got 'one'/],
    ['SLURM_PROCID outside the step', srun(8), /SLURM_PROCID 8 is outside the world of 8 ranks \(SLURM_NTASKS\)/],
    ['srun without a node list or MASTER_ADDR', { ...srun(1), SLURM_NODELIST: undefined }, /SLURM gives no node list \(SLURM_NODELIST\).*set MASTER_ADDR \(and MASTER_PORT\)/],
    ['a malformed SLURM_NODELIST', srun(1, { SLURM_NODELIST: 'gpu[07-08' }), /SLURM_NODELIST is not a SLURM node list/],
  ];
  for (const [name, env, message] of errors)
    it(`refuses ${name}, naming the variable`, function () {
      let err;
      try {
        detectLauncher(env);
      } catch (e) {
        err = e;
      }
      expect(err, 'no error').to.not.equal(undefined);
      expect(err.code).to.equal('ERR_USAGE');
      expect(err.message).to.match(message);
    });

  it('derives one token per job, the same on every rank, and ACCORDION_JOB_TOKEN overrides it', function () {
    const tokens = (envs) => envs.map((env) => detectLauncher(env).token);
    for (const [label, rank0, rank1, otherJob] of [
      ['slurm', srun(0), srun(5), srun(0, { SLURM_JOB_ID: '4243' })],
      ['openmpi', openmpi(0), openmpi(3), openmpi(0, { PMIX_NAMESPACE: '77' })],
      ['torchrun', { RANK: '0', WORLD_SIZE: '2', MASTER_ADDR: 'a', MASTER_PORT: '1' }, { RANK: '1', WORLD_SIZE: '2', MASTER_ADDR: 'a', MASTER_PORT: '1' }, { RANK: '0', WORLD_SIZE: '2', MASTER_ADDR: 'a', MASTER_PORT: '2' }],
      ['mpich', { PMI_RANK: '0', PMI_SIZE: '2', MASTER_ADDR: 'a' }, { PMI_RANK: '1', PMI_SIZE: '2', MASTER_ADDR: 'a' }, { PMI_RANK: '0', PMI_SIZE: '2', MASTER_ADDR: 'b' }],
    ]) {
      const [t0, t1, other] = tokens([rank0, rank1, otherJob]);
      expect(t0, `${label}: ranks of one job`).to.equal(t1);
      expect(other, `${label}: another job`).to.not.equal(t0);
      expect(detectLauncher({ ...rank1, ACCORDION_JOB_TOKEN: 'secret' }).token, label).to.equal('secret');
    }
  });
});
