/**
 * Quantities as people read them.
 */

/** "100 Mbit/s", "1 Gbit/s", "94.17 Mbit/s": a rate in bits per second as people write it. */
export function formatRate(bits: number): string {
  for (const [unit, scale] of [['Gbit/s', 1e9], ['Mbit/s', 1e6], ['kbit/s', 1e3]] as const) if (bits >= scale) return `${+(bits / scale).toPrecision(4)} ${unit}`;
  return `${+bits.toPrecision(4)} bit/s`;
}

/** "250 kB", "1.5 MB", "512 B": a size in bytes, in powers of 1000 as rates are. */
export function formatBytes(bytes: number): string {
  for (const [unit, scale] of [['GB', 1e9], ['MB', 1e6], ['kB', 1e3]] as const) if (bytes >= scale) return `${+(bytes / scale).toPrecision(3)} ${unit}`;
  return `${Math.round(bytes)} B`;
}
