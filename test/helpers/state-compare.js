// Comparing two devices' state dicts (test/gpu/): relative errors per tensor, and what TopK's error
// feedback conserves where a selection may differ between them.
import { expect } from 'chai';

/** ‖a − b‖ / ‖b‖ over two float32 byte arrays. */
export function relativeError(aBytes, bBytes) {
  const a = new Float32Array(aBytes.buffer, aBytes.byteOffset, aBytes.byteLength / 4);
  const b = new Float32Array(bBytes.buffer, bBytes.byteOffset, bBytes.byteLength / 4);
  let diff = 0, norm = 0;
  for (let i = 0; i < a.length; i++) {
    if (!Number.isFinite(a[i]) || !Number.isFinite(b[i])) return Infinity;
    diff += (a[i] - b[i]) ** 2;
    norm += b[i] ** 2;
  }
  return Math.sqrt(diff) / Math.max(Math.sqrt(norm), 1e-30);
}

function normOf(bytes) {
  let sum = 0;
  for (const v of new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4)) sum += v * v;
  return Math.sqrt(sum);
}

/**
 * Every entry of two state dicts agrees: floats within `tolerance`, integers exactly. A float tensor
 * whose value is zero up to rounding on both devices (below 1e-6 of the norm of its group, the
 * optimizer's tensors or the model's) has no relative error to speak of: a convolution's bias before
 * batch norm has a gradient of exactly zero, so its momentum buffer holds only rounding.
 */
export function expectStatesClose(gpu, cpu, tolerance) {
  expect(gpu.map((t) => t.name)).to.deep.equal(cpu.map((t) => t.name));
  const group = (name) => (name.startsWith('optimizer.') ? 'optimizer' : 'model');
  const totals = {};
  for (const t of cpu) if (t.dtype === 'F32') totals[group(t.name)] = Math.hypot(totals[group(t.name)] ?? 0, normOf(t.data));
  for (let i = 0; i < cpu.length; i++) {
    const [g, c] = [gpu[i], cpu[i]];
    expect(g.shape, c.name).to.deep.equal(c.shape);
    if (c.dtype !== 'F32') expect(Buffer.from(g.data).equals(Buffer.from(c.data)), c.name).to.equal(true);
    else if (Math.max(normOf(g.data), normOf(c.data)) >= 1e-6 * totals[group(c.name)]) expect(relativeError(g.data, c.data), c.name).to.be.below(tolerance);
  }
}

/**
 * Each state with what error feedback conserves in place of a compressed tensor's weight, momentum
 * buffer and error memory. A step sends d (of a = g + e), keeps e' = a − d and, with Nesterov
 * momentum μ at learning rate lr, sets b' = μb + d and w' = w − lr(d + μb'). So b' + e' and
 * w' − lr(1 + μ)e' do not depend on which entries d took: they replace the buffer and the weight,
 * and the memory goes (the step's weight-decay term is the same on both sides, from the same w).
 */
export function conserved(states, { learningRate, momentum }) {
  const floats = (t) => new Float32Array(t.data.slice().buffer);
  return states.map((state) => {
    const memories = new Map(state.filter((t) => t.name.startsWith('compressor.memory.')).map((t) => [t.name.slice(18), floats(t)]));
    const plus = (t, memory, k) => ({ ...t, data: new Uint8Array(floats(t).map((v, i) => v + k * memory[i]).buffer) });
    return state
      .filter((t) => !(t.name.startsWith('compressor.memory.') && memories.has(t.name.slice(18))))
      .map((t) => {
        const buffer = t.name.startsWith('optimizer.momentum_buffer.') && memories.get(t.name.slice(26));
        if (buffer) return plus(t, buffer, 1);
        const memory = memories.get(t.name);
        return memory ? plus(t, memory, -learningRate * (1 + momentum)) : t;
      });
  });
}
