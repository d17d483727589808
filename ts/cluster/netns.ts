/**
 * Simulated hosts on one machine, built with iproute2: one network namespace per host, joined by a
 * veth pair (its "cable": eth0 in the host, h<i> in the switch) to a bridge that lives in a switch
 * namespace of its own. Each host has an IPv4 address on the bridge's subnet and its egress shaped
 * with tc. Everything a cluster creates lives inside its namespaces, so deleting them removes the
 * veth pairs, the bridge and the qdiscs too; nothing is added to the machine's own namespace.
 *
 * Names: acc-<pid>-<random>-sw and acc-<pid>-<random>-h<i>, where pid is the owning process. A
 * second run never collides with a first (the random part differs), and sweepStale() removes the
 * namespaces of an owner that no longer exists, e.g. a cluster command killed with SIGKILL.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import { AccordionError, UsageError } from '../base/errors.js';

export class NetworkError extends AccordionError {
  constructor(message: string) {
    super('ERR_NETWORK', message);
  }
}

/** Egress of each host: a token bucket at `bitsPerSecond`, an optional delay, and random loss. */
export interface LinkShape {
  bitsPerSecond: number;
  /** One-way delay added to every packet the host sends (netem); 0 for none. */
  delaySeconds: number;
  /** Fraction of the host's outgoing packets dropped at random, in [0, 1). */
  loss: number;
  /** The host's token bucket as seconds of traffic at its rate (default DEFAULT_BURST_SECONDS). */
  burstSeconds?: number;
}

/** The token bucket of a host: 2 ms of traffic at its rate. */
export const DEFAULT_BURST_SECONDS = 0.002;

export interface Host {
  index: number;
  namespace: string;
  address: string;
  /** The switch's end of the host's veth pair, in the switch namespace. */
  port: string;
  /**
   * Where the host's rate changes while it runs: the largest length a qdisc counts for a packet it
   * sends (its interface's gso_max_size over GSO_SHARE), which every bucket it gets holds
   * (createNetwork).
   */
  packetBytes?: number;
}

export interface ClusterNetwork {
  id: string;
  switchNamespace: string;
  hosts: Host[];
  prefixLength: number;
}

export interface Counters {
  txBytes: number;
  rxBytes: number;
  txPackets: number;
  rxPackets: number;
}

/** The host's interface, in its namespace. */
export const HOST_DEVICE = 'eth0';
const BRIDGE = 'br0';
const NAME = /^(acc-(\d+)-[0-9a-f]+)-(sw|h(\d+))$/;
/** Bound on every ip or tc command: they answer in milliseconds unless the kernel is stuck. */
const COMMAND_TIMEOUT_MS = 15_000;
/** An Ethernet frame of a full 1500-byte packet. */
const FRAME_BYTES = 1514;

/** The capabilities that network namespaces (CAP_SYS_ADMIN: mounts) and links and qdiscs need. */
const NEEDED_CAPABILITIES: [string, number][] = [
  ['CAP_NET_ADMIN', 12],
  ['CAP_SYS_ADMIN', 21],
];

/** The needed capabilities missing from this process's effective set (CapEff in /proc/self/status). */
export function missingCapabilities(status?: string): string[] {
  let text = status;
  if (text === undefined) {
    try {
      text = fs.readFileSync('/proc/self/status', 'utf8');
    } catch {
      text = '';
    }
  }
  const match = /^CapEff:\s*([0-9a-fA-F]+)\s*$/m.exec(text);
  const effective = match ? BigInt(`0x${match[1]}`) : 0n;
  return NEEDED_CAPABILITIES.filter(([, bit]) => ((effective >> BigInt(bit)) & 1n) === 0n).map(([name]) => name);
}

function run(command: 'ip' | 'tc', args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(command, args, { timeout: COMMAND_TIMEOUT_MS, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (!err) return resolve(stdout);
      const e = err as NodeJS.ErrnoException & { killed?: boolean };
      if (e.code === 'ENOENT') return reject(new NetworkError(`'${command}' was not found: the cluster needs iproute2 (apt-get install iproute2)`));
      const why = e.killed ? `no answer within ${COMMAND_TIMEOUT_MS / 1000} s` : stderr.trim() || e.message;
      reject(new NetworkError(`${command} ${args.join(' ')} failed: ${why}`));
    });
  });
}

const ip = (...args: string[]) => run('ip', args);
const tc = (...args: string[]) => run('tc', args);

/** A new cluster's name prefix, owned by this process. */
export function newClusterId(): string {
  return `acc-${process.pid}-${randomBytes(3).toString('hex')}`;
}

/** Every network namespace whose name a cluster could have made. */
export async function listClusterNamespaces(): Promise<string[]> {
  const out = await ip('netns', 'list');
  return out
    .split('\n')
    .map((line) => line.trim().split(/\s+/)[0] ?? '')
    .filter((name) => NAME.test(name));
}

/** The hosts and switch of a live cluster (e.g. one another process runs), from its namespaces' names. */
export async function findNetwork(ownerPid: number): Promise<ClusterNetwork | undefined> {
  const names = (await listClusterNamespaces()).filter((n) => NAME.exec(n)![2] === String(ownerPid));
  if (names.length === 0) return undefined;
  const id = NAME.exec(names[0]!)![1]!;
  const hosts: Host[] = [];
  let prefixLength = 0;
  for (const name of names) {
    const m = NAME.exec(name)!;
    if (m[1] !== id || m[4] === undefined) continue;
    const index = Number(m[4]);
    const out = JSON.parse(await ip('-n', name, '-j', 'addr', 'show', 'dev', HOST_DEVICE)) as { addr_info?: { family: string; local: string; prefixlen: number }[] }[];
    const inet = out[0]?.addr_info?.find((a) => a.family === 'inet');
    prefixLength = inet?.prefixlen ?? prefixLength;
    hosts.push({ index, namespace: name, address: inet?.local ?? '', port: `h${index}` });
  }
  hosts.sort((a, b) => a.index - b.index);
  return { id, switchNamespace: `${id}-sw`, hosts, prefixLength };
}

/** An IPv4 subnet: its network address as a 32-bit number and its prefix length. */
export interface Subnet {
  network: number;
  prefixLength: number;
}

export function formatAddress(value: number): string {
  return [24, 16, 8, 0].map((shift) => (value >>> shift) & 255).join('.');
}

/**
 * Creates the switch and `hosts` hosts; host i gets the subnet's address i + 1 and sends at
 * `hostRates[i]` where given, else at the shape's rate, later changed to each of `laterRates`
 * (setEgressRate). On any failure what was already made is removed before the error is thrown.
 *
 * A host whose rate will change sends packets no larger than the smallest token bucket it will
 * have, but at least MIN_PACKET_BYTES (`packetBytes`), and every bucket it gets holds at least such
 * a packet: tbf sends a packet only once the bucket holds its length, so a packet queued under a
 * larger bucket and longer than the new one would hold the queue, and the link, until the rate
 * rises again. (A packet longer than the bucket in force is cut into segments as it is queued;
 * only a change of rate can strand one.) The length tbf weighs is that of the packet's segments on
 * the wire, each with its own headers, so the interface's gso_max_size is GSO_SHARE of it. The
 * floor keeps the fast phases fast: packets of a few frames cost the veth pair more per byte than a
 * 1 Gbit/s link allows on a busy machine.
 */
export async function createNetwork(options: {
  hosts: number;
  subnet: Subnet;
  shape: LinkShape;
  hostRates?: (number | undefined)[];
  laterRates?: number[];
  id?: string;
}): Promise<ClusterNetwork> {
  const id = options.id ?? newClusterId();
  const { subnet, shape } = options;
  const network: ClusterNetwork = {
    id,
    switchNamespace: `${id}-sw`,
    prefixLength: subnet.prefixLength,
    hosts: Array.from({ length: options.hosts }, (_, index) => ({
      index,
      namespace: `${id}-h${index}`,
      address: formatAddress(subnet.network + index + 1),
      port: `h${index}`,
    })),
  };
  const sw = network.switchNamespace;
  try {
    await ip('netns', 'add', sw);
    await ip('-n', sw, 'link', 'add', BRIDGE, 'type', 'bridge');
    // No IPv6 link-local addresses: their neighbour discovery would add packets to the counters.
    await ip('-n', sw, 'link', 'set', BRIDGE, 'addrgenmode', 'none');
    await ip('-n', sw, 'link', 'set', BRIDGE, 'up');
    for (const host of network.hosts) {
      const ns = host.namespace;
      await ip('netns', 'add', ns);
      await ip('link', 'add', HOST_DEVICE, 'netns', ns, 'type', 'veth', 'peer', 'name', host.port, 'netns', sw);
      await ip('-n', sw, 'link', 'set', host.port, 'addrgenmode', 'none');
      await ip('-n', sw, 'link', 'set', host.port, 'master', BRIDGE, 'up');
      await ip('-n', ns, 'link', 'set', HOST_DEVICE, 'addrgenmode', 'none');
      const ownRate = options.hostRates?.[host.index];
      if (ownRate === undefined && options.laterRates?.length) {
        const smallest = bucketBytes(Math.min(shape.bitsPerSecond, ...options.laterRates), shape.burstSeconds);
        host.packetBytes = Math.min(Math.max(smallest, MIN_PACKET_BYTES), DEFAULT_GSO_MAX_SIZE);
        await ip('-n', ns, 'link', 'set', 'dev', HOST_DEVICE, 'gso_max_size', String(Math.floor(host.packetBytes * GSO_SHARE)));
      }
      await ip('-n', ns, 'addr', 'add', `${host.address}/${subnet.prefixLength}`, 'dev', HOST_DEVICE);
      await ip('-n', ns, 'link', 'set', 'lo', 'up');
      await ip('-n', ns, 'link', 'set', HOST_DEVICE, 'up');
      await shapeEgress(ns, { ...shape, bitsPerSecond: ownRate ?? shape.bitsPerSecond }, host.packetBytes);
    }
  } catch (err) {
    await removeNetwork(id).catch(() => undefined);
    throw err;
  }
  return network;
}

/**
 * Shapes what a host sends: tbf at the rate, behind netem when there is a delay (netem as the root
 * qdisc with tbf as its child, netem's documented recipe for delay plus rate). The bucket holds
 * the shape's burst (2 ms of traffic by default), at least two full frames; tbf queues at most
 * 50 ms beyond it. Loss is a filter on the clsact egress hook (classic BPF: a random 32-bit number
 * below loss × 2³² drops the packet), which needs no netem; like netem's loss, a dropped packet never
 * reaches the interface's counters.
 */
async function shapeEgress(ns: string, shape: LinkShape, packetBytes?: number): Promise<void> {
  const bytesPerSecond = shape.bitsPerSecond / 8;
  const tbf = tokenBucket(shape.bitsPerSecond, packetBytes, shape.burstSeconds);
  if (shape.delaySeconds > 0) {
    // Room for every packet in flight during the delay at the full rate, twice over.
    const limit = Math.max(1000, Math.ceil((2 * bytesPerSecond * shape.delaySeconds) / FRAME_BYTES));
    const delay = `${Math.round(shape.delaySeconds * 1e6)}us`;
    try {
      await tc('-n', ns, 'qdisc', 'add', 'dev', HOST_DEVICE, 'root', 'handle', '1:', 'netem', 'delay', delay, 'limit', String(limit));
    } catch (err) {
      if (/qdisc kind is unknown/i.test((err as Error).message))
        throw new UsageError(
          "a link latency needs the kernel's netem queueing discipline (sch_netem), which this kernel does not have " +
            '(load it with modprobe sch_netem, or leave out --latency)',
        );
      throw err;
    }
    await tc('-n', ns, 'qdisc', 'add', 'dev', HOST_DEVICE, 'parent', '1:1', 'handle', '10:', ...tbf);
  } else {
    await tc('-n', ns, 'qdisc', 'add', 'dev', HOST_DEVICE, 'root', 'handle', '1:', ...tbf);
  }
  if (shape.loss > 0) {
    await tc('-n', ns, 'qdisc', 'add', 'dev', HOST_DEVICE, 'clsact');
    await tc('-n', ns, 'filter', 'add', 'dev', HOST_DEVICE, 'egress', 'bpf', 'da', 'bytecode', dropFilter(shape.loss));
  }
}

/** The bytes of tbf's bucket at a rate: `burstSeconds` of traffic, at least two full frames. */
export function bucketBytes(bitsPerSecond: number, burstSeconds = DEFAULT_BURST_SECONDS): number {
  return Math.max(Math.ceil((bitsPerSecond / 8) * burstSeconds), 2 * FRAME_BYTES);
}

/** A veth interface's largest packet before segmentation, as Linux sets it (GSO_MAX_SIZE). */
const DEFAULT_GSO_MAX_SIZE = 65536;
/** The smallest packet cap of a host whose rate changes (createNetwork). */
const MIN_PACKET_BYTES = 8192;
/**
 * A GSO packet's share of the length a qdisc counts for it: the qdisc adds the headers of every
 * segment after the first (14 + 20 + 32 bytes for TCP over IPv4 with timestamps, beside 1,448 bytes
 * of payload, 4.6%; over IPv6 6.0%), so a packet of gso_max_size bytes weighs up to 1.06 times it.
 */
const GSO_SHARE = 0.9;

/** tbf's arguments for a rate: a bucket of bucketBytes (at least `packetBytes`), and 50 ms of queue beyond it. */
function tokenBucket(bitsPerSecond: number, packetBytes = 0, burstSeconds?: number): string[] {
  return ['tbf', 'rate', `${Math.round(bitsPerSecond)}bit`, 'burst', String(Math.max(bucketBytes(bitsPerSecond, burstSeconds), packetBytes)), 'latency', '50ms'];
}

/** Changes a host's egress rate while it runs (its token bucket, under netem's delay when there is one). */
export async function setEgressRate(host: Host, bitsPerSecond: number, shape: Pick<LinkShape, 'delaySeconds' | 'burstSeconds'>): Promise<void> {
  const where = shape.delaySeconds > 0 ? ['parent', '1:1', 'handle', '10:'] : ['root', 'handle', '1:'];
  await tc('-n', host.namespace, 'qdisc', 'change', 'dev', HOST_DEVICE, ...where, ...tokenBucket(bitsPerSecond, host.packetBytes, shape.burstSeconds));
}

/** The egress rate the kernel holds for a host, in bits per second: its token bucket's, as tc reports it. */
export async function readEgressRate(host: Host): Promise<number> {
  const qdiscs = JSON.parse(await tc('-n', host.namespace, '-j', 'qdisc', 'show', 'dev', HOST_DEVICE)) as { kind: string; options?: { rate?: number } }[];
  const tbf = qdiscs.find((q) => q.kind === 'tbf');
  if (tbf?.options?.rate === undefined) throw new NetworkError(`host ${host.index} has no token bucket on ${HOST_DEVICE}`);
  return 8 * tbf.options.rate; // tc reports bytes per second
}

/** Classic BPF (tc's bytecode syntax) that drops a packet with probability `loss`. */
function dropFilter(loss: number): string {
  const SHOT = 2; // TC_ACT_SHOT: drop
  if (loss >= 1) return `1,6 0 0 ${SHOT}`;
  const RANDOM = 0xfffff000 + 56; // SKF_AD_OFF + SKF_AD_RANDOM: load a random 32-bit number
  const threshold = Math.min(Math.round(loss * 2 ** 32), 2 ** 32 - 1);
  // A = random; if A >= threshold skip one (to "return 0": TC_ACT_OK, pass) else "return SHOT".
  return `4,32 0 0 ${RANDOM},53 1 0 ${threshold},6 0 0 ${SHOT},6 0 0 0`;
}

/**
 * Cuts a host off, or reconnects it: every packet from or to it is dropped at its switch port (a
 * filter on both directions; the link stays up, as when a switch or cable in between fails).
 */
export async function setPartitioned(network: ClusterNetwork, hostIndex: number, partitioned: boolean): Promise<void> {
  const host = network.hosts[hostIndex];
  if (!host) throw new UsageError(`host ${hostIndex} is not in the cluster (hosts 0..${network.hosts.length - 1})`);
  const sw = network.switchNamespace;
  if (!partitioned) {
    await tc('-n', sw, 'qdisc', 'del', 'dev', host.port, 'clsact');
    return;
  }
  await tc('-n', sw, 'qdisc', 'add', 'dev', host.port, 'clsact');
  for (const direction of ['ingress', 'egress'])
    await tc('-n', sw, 'filter', 'add', 'dev', host.port, direction, 'bpf', 'da', 'bytecode', dropFilter(1));
}

/** The kernel's byte and packet counters of a host's interface. */
export async function readCounters(namespace: string): Promise<Counters> {
  const out = await ip('-n', namespace, '-j', '-s', 'link', 'show', 'dev', HOST_DEVICE);
  const stats = (JSON.parse(out) as { stats64?: { tx: { bytes: number; packets: number }; rx: { bytes: number; packets: number } } }[])[0]?.stats64;
  if (!stats) throw new NetworkError(`ip gave no counters for ${HOST_DEVICE} in ${namespace}`);
  return { txBytes: stats.tx.bytes, rxBytes: stats.rx.bytes, txPackets: stats.tx.packets, rxPackets: stats.rx.packets };
}

/**
 * The same counters read through a process that runs in the host's namespace: /proc/<pid>/net/dev
 * shows the devices of the process's network namespace. A synchronous file read, without starting a
 * process; undefined when the process is gone.
 */
export function readCountersOf(pid: number): Counters | undefined {
  let text: string;
  try {
    text = fs.readFileSync(`/proc/${pid}/net/dev`, 'utf8');
  } catch {
    return undefined;
  }
  // "  eth0: rx bytes packets errs drop fifo frame compressed multicast tx bytes packets …"
  const line = text.split('\n').find((l) => l.trim().startsWith(`${HOST_DEVICE}:`));
  if (!line) return undefined;
  const f = line.slice(line.indexOf(':') + 1).trim().split(/\s+/).map(Number);
  return { rxBytes: f[0]!, rxPackets: f[1]!, txBytes: f[8]!, txPackets: f[9]! };
}

/** Processes running in a namespace. */
export async function namespacePids(namespace: string): Promise<number[]> {
  const out = await ip('netns', 'pids', namespace);
  return out.split(/\s+/).filter((s) => /^\d+$/.test(s)).map(Number);
}

/** SIGKILLs every process of a namespace and waits (at most `waitMs`) until they are gone; returns those killed. */
export async function killNamespace(namespace: string, waitMs = 5000): Promise<number[]> {
  const pids = await namespacePids(namespace);
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone meanwhile
    }
  }
  const deadline = Date.now() + waitMs;
  while (pids.some(isAlive) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20));
  return pids;
}

/** Whether a process exists and has not exited (a zombie only waits for its parent to reap it). */
function isAlive(pid: number): boolean {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !/^[ZX]$/.test(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0] ?? '');
  } catch {
    return false;
  }
}

/**
 * Removes a cluster: kills what still runs in its hosts, then deletes the host namespaces and the
 * switch's (which takes the veth pairs, the bridge and the qdiscs with them).
 */
export async function removeNetwork(id: string): Promise<void> {
  const names = (await listClusterNamespaces()).filter((n) => NAME.exec(n)![1] === id);
  const hosts = names.filter((n) => !n.endsWith('-sw'));
  await Promise.all(hosts.map((ns) => killNamespace(ns).catch(() => undefined)));
  const failures: string[] = [];
  for (const ns of [...hosts, ...names.filter((n) => n.endsWith('-sw'))]) {
    try {
      await ip('netns', 'del', ns);
    } catch (err) {
      // Another process (a sweep) may have removed it meanwhile.
      if (!/No such file/i.test((err as Error).message)) failures.push((err as Error).message);
    }
  }
  if (failures.length) throw new NetworkError(`could not remove cluster ${id}: ${failures.join('; ')}`);
}

/** Removes the clusters whose owning process no longer exists; returns their ids. */
export async function sweepStale(): Promise<string[]> {
  const stale = new Set<string>();
  for (const name of await listClusterNamespaces()) {
    const m = NAME.exec(name)!;
    if (!isAlive(Number(m[2]))) stale.add(m[1]!);
  }
  for (const id of stale) await removeNetwork(id);
  return [...stale];
}
