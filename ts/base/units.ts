/**
 * Quantities as people read them.
 */

/** "100 Mbit/s", "1 Gbit/s", "94.17 Mbit/s": a rate in bits per second as people write it. */
export function formatRate(bits: number): string {
  for (const [unit, scale] of [['Gbit/s', 1e9], ['Mbit/s', 1e6], ['kbit/s', 1e3]] as const) if (bits >= scale) return `${+(bits / scale).toPrecision(4)} ${unit}`;
  return `${+bits.toPrecision(4)} bit/s`;
}
