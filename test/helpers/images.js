// A tiny image set for tests: deterministic, distinct uint8 CIFAR-shaped images with labels
// i mod classes, in the shape the Batcher takes.
export function tinyImageSet(count, classes, seed) {
  const images = new Uint8Array(count * 3072);
  let s = seed >>> 0;
  for (let i = 0; i < images.length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    images[i] = s >>> 24;
  }
  const labels = Int32Array.from({ length: count }, (_, i) => i % classes);
  return { images, labels, count, classes, height: 32, width: 32, channels: 3 };
}
