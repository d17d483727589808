/**
 * The job's rendezvous store: a small TCP key-value store hosted by the launcher (or by rank 0 when
 * workers are started by hand), addressed by MASTER_ADDR / MASTER_PORT as with torchrun. Workers
 * exchange their Gloo addresses and configuration through it. Every connection must first present
 * the job's token, so a stranger on the port is refused: before that it may send only one small
 * request, within a few seconds, and only a few such connections are kept at once.
 *
 * Wire format (little-endian), shared with cpp/comm/store_client.cpp:
 *   request  = u8 op, u32 key length, key, u32 value length, value
 *   response = u8 status (0 ok, 1 error, 2 timeout), u32 length, payload
 *   ops: 0 hello (key = token), 1 set, 2 get (value = u32 timeout ms; waits for the key),
 *        3 add (value = i64 delta; payload = i64 new value)
 */
import * as net from 'node:net';
import { AccordionError } from '../base/errors.js';
import { DEFAULT_MASTER_ADDR } from './environment.js';

export class RendezvousError extends AccordionError {
  constructor(message: string) {
    super('ERR_RENDEZVOUS', message);
  }
}

const OP_HELLO = 0, OP_SET = 1, OP_GET = 2, OP_ADD = 3;
const OK = 0, ERROR = 1, TIMEOUT = 2;

function frame(status: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt8(status, 0);
  head.writeUInt32LE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

interface Request {
  op: number;
  key: string;
  value: Buffer;
}

/** A frame announced larger than the reader accepts; the connection is closed without reading it. */
class FrameTooLarge extends Error {}

/**
 * Splits a byte stream into requests. A length prefix above `maxFrame` throws FrameTooLarge as soon
 * as it is read, before any of the frame's body is buffered; chunks of a frame are kept as they
 * came and joined once, when the frame is complete.
 */
class RequestReader {
  private chunks: Buffer[] = [];
  private length = 0;

  constructor(public maxFrame: number) {}

  private bytes(n: number): Buffer {
    if (this.chunks.length > 1 && this.chunks[0]!.length < n) this.chunks = [Buffer.concat(this.chunks)];
    return this.chunks[0]!;
  }

  private consume(n: number): Buffer {
    const all = this.bytes(n);
    const out = Buffer.from(all.subarray(0, n));
    if (all.length === n) this.chunks.shift();
    else this.chunks[0] = all.subarray(n);
    this.length -= n;
    return out;
  }

  push(chunk: Buffer): Request[] {
    this.chunks.push(chunk);
    this.length += chunk.length;
    const out: Request[] = [];
    for (;;) {
      if (this.length < 5) break;
      const keyLength = this.bytes(5).readUInt32LE(1);
      if (9 + keyLength > this.maxFrame) throw new FrameTooLarge(`a key of ${keyLength} bytes`);
      if (this.length < 9 + keyLength) break;
      const valueLength = this.bytes(9 + keyLength).readUInt32LE(5 + keyLength);
      const total = 9 + keyLength + valueLength;
      if (total > this.maxFrame) throw new FrameTooLarge(`a request of ${total} bytes`);
      if (this.length < total) break;
      const frame = this.consume(total);
      out.push({ op: frame.readUInt8(0), key: frame.subarray(5, 5 + keyLength).toString('utf8'), value: frame.subarray(9 + keyLength) });
    }
    return out;
  }
}

export interface StoreLimits {
  /** Milliseconds a new connection has to present the job's token (default 5000). */
  authTimeoutMs?: number;
  /** Connections that have not yet presented the token; more are closed at once (default 32). */
  maxPending?: number;
  /** Largest request of a connection that has not presented the token, in bytes (default 4096). */
  maxHelloBytes?: number;
  /** Largest request of a member of the job, in bytes (default 16 MiB). */
  maxFrameBytes?: number;
}

const DEFAULT_LIMITS: Required<StoreLimits> = { authTimeoutMs: 5000, maxPending: 32, maxHelloBytes: 4096, maxFrameBytes: 16 << 20 };

export class StoreServer {
  private readonly values = new Map<string, Buffer>();
  private readonly waiters = new Map<string, (() => void)[]>();
  private readonly sockets = new Set<net.Socket>();
  private pending = 0;

  private constructor(
    private readonly server: net.Server,
    private readonly token: string,
    private readonly limits: Required<StoreLimits>,
  ) {}

  /**
   * Listens on host:port (port 0 picks a free one). A port in use is a clear error. Before a
   * connection has presented the job's token it may send one small request, within
   * `authTimeoutMs`, and only `maxPending` such connections are kept at a time.
   */
  static async listen(options: { host: string; port: number; token: string } & StoreLimits): Promise<StoreServer> {
    const server = net.createServer();
    const limits = { ...DEFAULT_LIMITS };
    for (const key of Object.keys(DEFAULT_LIMITS) as (keyof StoreLimits)[]) if (options[key] !== undefined) limits[key] = options[key]!;
    const store = new StoreServer(server, options.token, limits);
    server.on('connection', (socket) => store.serve(socket));
    await new Promise<void>((resolve, reject) => {
      server.once('error', (err: NodeJS.ErrnoException) => {
        reject(
          new RendezvousError(
            err.code === 'EADDRINUSE'
              ? `cannot host the rendezvous store: port ${options.port} on ${options.host} is already in use (another job? choose another --master-port)`
              : `cannot host the rendezvous store on ${options.host}:${options.port}: ${err.message}`,
          ),
        );
      });
      server.listen(options.port, options.host, () => resolve());
    });
    return store;
  }

  get port(): number {
    return (this.server.address() as net.AddressInfo).port;
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private serve(socket: net.Socket): void {
    if (this.pending >= this.limits.maxPending) {
      // Too many connections that have not said who they are: this one is refused unread.
      socket.destroy();
      return;
    }
    this.pending++;
    this.sockets.add(socket);
    socket.setNoDelay(true);
    const reader = new RequestReader(this.limits.maxHelloBytes);
    let authenticated = false;
    let first = true;
    let counted = true;
    const leavePending = () => {
      if (counted) this.pending--;
      counted = false;
    };
    const deadline = setTimeout(() => socket.destroy(), this.limits.authTimeoutMs);
    socket.on('data', (chunk) => {
      if (first && chunk.length > 0) {
        first = false;
        if (chunk[0] !== OP_HELLO) {
          socket.destroy(); // not a member of a job: its first byte is not a hello
          return;
        }
      }
      let requests: Request[];
      try {
        requests = reader.push(chunk);
      } catch (err) {
        if (!(err instanceof FrameTooLarge)) throw err;
        socket.destroy();
        return;
      }
      for (const request of requests) {
        if (socket.destroyed) return;
        if (!authenticated) {
          if (request.op !== OP_HELLO || request.key !== this.token) {
            socket.end(frame(ERROR, Buffer.from('wrong job token: this store belongs to another job')));
            socket.destroy();
            return;
          }
          authenticated = true;
          clearTimeout(deadline);
          leavePending();
          reader.maxFrame = this.limits.maxFrameBytes;
          socket.write(frame(OK));
          continue;
        }
        this.handle(socket, request);
      }
    });
    socket.on('error', () => socket.destroy());
    socket.on('close', () => {
      clearTimeout(deadline);
      leavePending();
      this.sockets.delete(socket);
    });
  }

  private handle(socket: net.Socket, request: Request): void {
    switch (request.op) {
      case OP_SET:
        this.values.set(request.key, request.value);
        socket.write(frame(OK));
        for (const wake of this.waiters.get(request.key) ?? []) wake();
        this.waiters.delete(request.key);
        return;
      case OP_GET: {
        const timeoutMs = request.value.length >= 4 ? request.value.readUInt32LE(0) : 0;
        const existing = this.values.get(request.key);
        if (existing) {
          socket.write(frame(OK, existing));
          return;
        }
        // The wait ends with the key, its timeout or its connection (a worker that is gone, or the
        // store closing): no timer outlives the one who waits.
        const forget = () => {
          clearTimeout(timer);
          socket.off('close', forget);
          const list = (this.waiters.get(request.key) ?? []).filter((w) => w !== wake);
          if (list.length) this.waiters.set(request.key, list);
          else this.waiters.delete(request.key);
        };
        const timer = setTimeout(() => {
          forget();
          if (!socket.destroyed) socket.write(frame(TIMEOUT));
        }, timeoutMs);
        const wake = () => {
          clearTimeout(timer);
          socket.off('close', forget);
          if (!socket.destroyed) socket.write(frame(OK, this.values.get(request.key)!));
        };
        socket.on('close', forget);
        this.waiters.set(request.key, [...(this.waiters.get(request.key) ?? []), wake]);
        return;
      }
      case OP_ADD: {
        const current = this.values.get(request.key);
        const next = (current && current.length === 8 ? current.readBigInt64LE(0) : 0n) + request.value.readBigInt64LE(0);
        const bytes = Buffer.alloc(8);
        bytes.writeBigInt64LE(next, 0);
        this.values.set(request.key, bytes);
        socket.write(frame(OK, bytes));
        for (const wake of this.waiters.get(request.key) ?? []) wake();
        this.waiters.delete(request.key);
        return;
      }
      default:
        socket.write(frame(ERROR, Buffer.from(`unknown operation ${request.op}`)));
    }
  }
}

/** The TS side's client (configuration checks, decisions); the native side has its own. */
export class StoreClient {
  private readonly pending: { resolve: (r: { status: number; payload: Buffer }) => void; reject: (e: Error) => void }[] = [];
  private buffered = Buffer.alloc(0);
  /** Set once the connection is gone: later requests fail at once with this error. */
  private closedError?: RendezvousError;

  private constructor(
    private readonly socket: net.Socket,
    private readonly where: string,
  ) {
    socket.setNoDelay(true);
    socket.on('data', (chunk) => {
      this.buffered = Buffer.concat([this.buffered, chunk]);
      while (this.buffered.length >= 5) {
        const length = this.buffered.readUInt32LE(1);
        if (this.buffered.length < 5 + length) break;
        const status = this.buffered.readUInt8(0);
        const payload = Buffer.from(this.buffered.subarray(5, 5 + length));
        this.buffered = this.buffered.subarray(5 + length);
        this.pending.shift()?.resolve({ status, payload });
      }
    });
    const fail = (err: RendezvousError) => {
      this.closedError ??= err;
      for (const p of this.pending.splice(0)) p.reject(this.closedError);
    };
    socket.on('error', (err) => fail(new RendezvousError(`lost the connection to ${where}: ${err.message}`)));
    socket.on('close', () => fail(new RendezvousError(`${where} closed the connection`)));
  }

  /** The local address of the connection: the interface other workers can reach this one on. */
  get localAddress(): string {
    return this.socket.localAddress ?? DEFAULT_MASTER_ADDR;
  }

  /** Connects (retrying until the deadline: the store may not be up yet) and presents the token. */
  static async connect(host: string, port: number, token: string, timeoutMs: number): Promise<StoreClient> {
    const where = `the rendezvous store at ${host}:${port}`;
    const deadline = Date.now() + timeoutMs;
    let lastError = '';
    for (;;) {
      try {
        const socket = await new Promise<net.Socket>((resolve, reject) => {
          const s = net.connect({ host, port });
          s.once('connect', () => resolve(s));
          s.once('error', reject);
        });
        const client = new StoreClient(socket, where);
        // A store that closes the connection unanswered may have too many strangers waiting: retry.
        const hello = await client.request(OP_HELLO, token, Buffer.alloc(0)).catch((err: Error) => {
          socket.destroy();
          throw new Error(err.message);
        });
        if (hello.status !== OK) {
          socket.destroy();
          throw new RendezvousError(`${where} refused this worker: ${hello.payload.toString()}`);
        }
        return client;
      } catch (err) {
        if (err instanceof RendezvousError) throw err;
        lastError = (err as Error).message;
      }
      if (Date.now() >= deadline)
        throw new RendezvousError(
          `cannot reach ${where} within ${timeoutMs} ms (${lastError}); is the master address right and rank 0 or the launcher running?`,
        );
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  private request(op: number, key: string, value: Buffer): Promise<{ status: number; payload: Buffer }> {
    const keyBytes = Buffer.from(key, 'utf8');
    const head = Buffer.alloc(5);
    head.writeUInt8(op, 0);
    head.writeUInt32LE(keyBytes.length, 1);
    const valueHead = Buffer.alloc(4);
    valueHead.writeUInt32LE(value.length, 0);
    return new Promise((resolve, reject) => {
      if (this.closedError || this.socket.destroyed) {
        reject(this.closedError ?? new RendezvousError(`the connection to ${this.where} is closed`));
        return;
      }
      this.pending.push({ resolve, reject });
      this.socket.write(Buffer.concat([head, keyBytes, valueHead, value]));
    });
  }

  async set(key: string, value: Buffer | string): Promise<void> {
    const r = await this.request(OP_SET, key, Buffer.from(value));
    if (r.status !== OK) throw new RendezvousError(`${this.where} refused to set '${key}': ${r.payload.toString()}`);
  }

  async get(key: string, timeoutMs: number): Promise<Buffer> {
    const t = Buffer.alloc(4);
    t.writeUInt32LE(timeoutMs, 0);
    const r = await this.request(OP_GET, key, t);
    if (r.status === TIMEOUT) throw new RendezvousError(`timed out after ${timeoutMs} ms waiting for '${key}' in ${this.where}`);
    if (r.status !== OK) throw new RendezvousError(`${this.where} refused to read '${key}': ${r.payload.toString()}`);
    return r.payload;
  }

  async add(key: string, delta: number): Promise<number> {
    const v = Buffer.alloc(8);
    v.writeBigInt64LE(BigInt(delta), 0);
    const r = await this.request(OP_ADD, key, v);
    if (r.status !== OK) throw new RendezvousError(`${this.where} refused to add to '${key}'`);
    return Number(r.payload.readBigInt64LE(0));
  }

  close(): void {
    this.socket.destroy();
  }
}
