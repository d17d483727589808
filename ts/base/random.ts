/**
 * Seeded pseudo-random streams: mulberry32, the splitmix32-style finaliser that derives its seeds,
 * and standard normals by Box-Muller. The synthetic dataset, the tests and the benchmarks all draw
 * from these, so one seed gives the same numbers everywhere.
 */

/** splitmix32-style finaliser: a well-mixed 32-bit value of `x`; used to derive independent stream seeds. */
export function mix32(x: number): number {
  x = Math.imul(x ^ (x >>> 16), 0x21f0aaad);
  x = Math.imul(x ^ (x >>> 15), 0x735a2d97);
  return (x ^ (x >>> 15)) >>> 0;
}

/**
 * mulberry32: tiny, fast, and good enough for noise and tests. A class rather than a closure, so that
 * its state stays an int32 field: the synthetic dataset draws three words per pixel.
 */
export class Mulberry32 {
  private state: number;

  constructor(seed: number) {
    this.state = seed | 0;
  }

  /** The next raw 32-bit word, unsigned. */
  u32(): number {
    let t = (this.state = (this.state + 0x6d2b79f5) | 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }
}

/** mulberry32 from a 32-bit seed as a uniform stream in [0, 1): each draw is one word divided by 2³². */
export function mulberry32(seed: number): () => number {
  const words = new Mulberry32(seed);
  return () => words.u32() / 4294967296;
}

/**
 * Standard normals by Box-Muller from a uniform stream in [0, 1): each pair of uniforms (u, v) gives
 * √(−2 ln(1 − u))·cos(2πv), returned first, then the same radius times sin(2πv). 1 − u keeps the
 * log's argument in (0, 1], so a draw of u = 0 needs no special case.
 */
export function normals(uniform: () => number): () => number {
  let spare: number | null = null;
  return () => {
    if (spare !== null) {
      const v = spare;
      spare = null;
      return v;
    }
    const r = Math.sqrt(-2 * Math.log(1 - uniform()));
    const a = 2 * Math.PI * uniform();
    spare = r * Math.sin(a);
    return r * Math.cos(a);
  };
}
