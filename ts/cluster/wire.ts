/**
 * What the wire should carry: the bytes a host puts on the wire, predicted from the engine's bytes
 * accounting and the collectives' algorithms (predictedWireBytes, broadcastWireBytes, topkExchange), and
 * compared with the kernel's counters in network.jsonl (compareWire).
 */
import { UsageError } from '../base/errors.js';
import type { CommDtype } from '../config/options.js';
import { binding } from '../native/binding.js';
import type { NetworkRecord } from './network-log.js';

/** Bytes of Ethernet (14), IPv4 (20) and TCP (32, with timestamps) headers in front of each packet's payload. */
export const PACKET_HEADER_BYTES = 66;

/**
 * Bytes one worker hands to the collectives, by how they travel: fp32 all-reduces (Gloo's ring, or
 * two ranks' pair exchange), all-reduces of values sent in 16 bits (an all-to-all of shares, then an
 * all-gather of their sums: ProcessGroup::allReduceSumAs), and all-gathers (their whole result).
 */
export interface Exchange {
  allReduceBytes: number;
  splitReduceBytes: number;
  allGatherBytes: number;
}

/**
 * Payload bytes one host sends (and, by symmetry, receives) for an exchange, by the algorithms over
 * n = hosts × procsPerHost workers, ranks placed host by host, p = procsPerHost:
 *  - all-reduce (gloo::allreduce, ring: reduce-scatter then all-gather of n chunks) sends
 *    2(n−1)/n of the buffer to the ring's next rank. For n = 2 each rank sends the half it does not
 *    own, receives the reduced other half back, and sends its reduced half: 2 × ½ = the whole buffer.
 *  - all-gather (gloo::allgather, ring) forwards n−1 of the n contributions: (n−1)/n of the result.
 *    Only one edge of each ring leaves a host, so a host sends what one rank does.
 *  - an all-reduce sent in 16 bits: every rank sends the 1/n share of its buffer that another rank
 *    sums to that rank directly, p(n−p)/n of the buffer leaving a host, then the sums travel as an
 *    all-gather, (n−1)/n. For n = 2: ½ + ½, the whole (16-bit) buffer, as the ring's.
 * Nothing leaves a single host.
 */
export function predictedWireBytes(exchange: Exchange, hosts: number, procsPerHost: number): number {
  if (hosts < 2) return 0;
  const n = hosts * procsPerHost, p = procsPerHost;
  return (exchange.allReduceBytes * 2 * (n - 1)) / n + (exchange.splitReduceBytes * (p * (n - p) + n - 1)) / n + (exchange.allGatherBytes * (n - 1)) / n;
}

/** Bytes of a value sent in `commDtype` (fp32 when absent). */
function valueBytes(commDtype: string | undefined): number {
  return commDtype === 'bf16' || commDtype === 'fp16' ? 2 : 4;
}

/** An exchange where everything is all-reduced (dense, PowerSGD): `bytes` in the precision sent. */
function allReduced(bytes: number, commDtype: string | undefined): Exchange {
  return valueBytes(commDtype) === 4 ? { allReduceBytes: bytes, splitReduceBytes: 0, allGatherBytes: 0 } : { allReduceBytes: 0, splitReduceBytes: bytes, allGatherBytes: 0 };
}

/**
 * Payload bytes each host sends and receives when rank 0 broadcasts `floats` floats, by Gloo's
 * binomial tree (gloo::broadcast): rank r > 0 receives the buffer once, from r with its highest bit
 * cleared, so the bytes leave a host only where that parent sits on another host (ranks placed host
 * by host). Indexed by host.
 */
export function broadcastWireBytes(floats: number, hosts: number, procsPerHost: number): { sent: number[]; received: number[] } {
  const sent = new Array<number>(hosts).fill(0);
  const received = new Array<number>(hosts).fill(0);
  const hostOf = (rank: number) => Math.floor(rank / procsPerHost);
  for (let rank = 1; rank < hosts * procsPerHost; rank++) {
    const parent = rank ^ (1 << Math.floor(Math.log2(rank)));
    if (hostOf(parent) === hostOf(rank)) continue;
    sent[hostOf(parent)]! += 4 * floats;
    received[hostOf(rank)]! += 4 * floats;
  }
  return { sent, received };
}

/**
 * The exchange of `bytesSent` bytes of TopK steps: each step all-reduces the 1-D tensors and the
 * matrices at level 0 (dense), and all-gathers every other matrix's pairs from each of the `workers`,
 * as the engine answers for the shapes and each parameter's ratio (binding.exchangeTraffic). Bytes that
 * are not whole steps are an error in the accounting.
 */
export function topkExchange(shapes: number[][], ratios: number[], workers: number, bytesSent: number, commDtype: CommDtype = 'fp32'): Exchange {
  const [t] = binding.exchangeTraffic(shapes, { compressor: 'topk', levels: ratios, bucketBytes: 0, commDtype, minCompressionRate: 1 });
  const { dense, denseBf16 } = t!, gathered = t!.topkPairs * workers;
  const steps = bytesSent / (dense + denseBf16 + gathered);
  if (!Number.isInteger(steps)) throw new Error(`${bytesSent} bytes are not whole TopK steps of ${dense + denseBf16} all-reduced + ${gathered} all-gathered bytes`);
  const [a, b] = [allReduced(steps * dense, commDtype), allReduced(steps * denseBf16, 'bf16')];
  return { allReduceBytes: a.allReduceBytes + b.allReduceBytes, splitReduceBytes: a.splitReduceBytes + b.splitReduceBytes, allGatherBytes: steps * gathered };
}

export interface WireComparison {
  epoch: number;
  host: number;
  /** The exchange's bytes (the same sent and received) plus rank 0's broadcasts, as this host sends and receives them. */
  predictedSentBytes: number;
  predictedReceivedBytes: number;
  /** The interface's bytes less PACKET_HEADER_BYTES per packet. */
  sentPayloadBytes: number;
  receivedPayloadBytes: number;
  sentRatio: number;
  receivedRatio: number;
  /** Both ratios within 1 ± tolerance. */
  ok: boolean;
}

/**
 * Compares each epoch record of network.jsonl with the prediction from rank 0's bytes sent: the
 * gradient exchange and rank 0's broadcasts of its running statistics. With compressor none or
 * powersgd every byte sent is all-reduced; topk all-reduces the 1-D tensors and all-gathers the
 * rest, so `exchange` must split its bytes. Matrices that automatic levels send dense in bf16 in an
 * fp32 job are all-reduced in 16 bits (split); on two hosts the two algorithms send alike. The small collectives (the finite agreement, the
 * replica digests) are not predicted.
 */
export function compareWire(records: NetworkRecord[], options: { exchange?: (r: NetworkRecord) => Exchange; tolerance?: number } = {}): WireComparison[] {
  const tolerance = options.tolerance ?? 0.1;
  let start: NetworkRecord | undefined;
  const rows: WireComparison[] = [];
  for (const r of records) {
    if (r.event === 'start') {
      start = r;
      continue;
    }
    if (r.event !== 'epoch') continue;
    if (!start) throw new UsageError('network.jsonl: an epoch record comes before any start record');
    let exchange: Exchange;
    if (options.exchange) exchange = options.exchange(r);
    else if (start.compressor === 'none' || start.compressor === 'powersgd') exchange = allReduced(r.bytesSent ?? 4 * (r.floatsSent ?? 0), start.commDtype);
    else throw new UsageError(`compareWire: the ${start.compressor} exchange mixes all-reduce and all-gather; give options.exchange`);
    const hosts = start.hosts ?? 1, procsPerHost = start.procsPerHost ?? 1;
    const exchanged = predictedWireBytes(exchange, hosts, procsPerHost) + (r.linkFloats ? predictedWireBytes(allReduced(4 * r.linkFloats, 'fp32'), hosts, procsPerHost) : 0);
    const broadcast = broadcastWireBytes(r.broadcastFloats ?? 0, hosts, procsPerHost);
    const predictedSentBytes = exchanged + broadcast.sent[r.host]!;
    const predictedReceivedBytes = exchanged + broadcast.received[r.host]!;
    const sentPayloadBytes = r.txBytes! - PACKET_HEADER_BYTES * r.txPackets!;
    const receivedPayloadBytes = r.rxBytes! - PACKET_HEADER_BYTES * r.rxPackets!;
    const sentRatio = sentPayloadBytes / predictedSentBytes;
    const receivedRatio = receivedPayloadBytes / predictedReceivedBytes;
    rows.push({
      epoch: r.epoch!,
      host: r.host,
      predictedSentBytes,
      predictedReceivedBytes,
      sentPayloadBytes,
      receivedPayloadBytes,
      sentRatio,
      receivedRatio,
      ok: Math.abs(sentRatio - 1) <= tolerance && Math.abs(receivedRatio - 1) <= tolerance,
    });
  }
  return rows;
}
