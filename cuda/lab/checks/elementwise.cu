// The kernel lab's checks: element-wise ops.
#include "lab/lab.h"

namespace accordion::lab {

void checkFill(Lab& lab) {
  for (int64_t n : kElementCounts)
    lab.run("fill", countLabel(n), kExact, [&](Check& check) {
      const float value = lab.random.scalar();
      Twin<float> data = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.fill(data.on(b), n, value); };
      lab.both(op, data);
      lab.expect(check, "data", data);
      lab.measure(check, op, Work::memory(4.0 * n));  // write n floats
    });
}

void checkRelu(Lab& lab) {
  for (int64_t n : kElementCounts) {
    lab.run("relu.forward", countLabel(n), kExact, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(n)), y = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.reluForward(x.on(b), y.on(b), n); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(8.0 * n));  // read x, write y
    });
    // The models' ReLUs run in place (y = x).
    lab.run("relu.forward", countLabel(n) + ", in place", kExact, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(n));
      auto op = [&](Backend& b) { b.reluForward(x.on(b), x.on(b), n); };
      lab.both(op);
      lab.expect(check, "x", x);
      lab.measure(check, op, Work::memory(8.0 * n));  // read x, write x
    });
    lab.run("relu.backward", countLabel(n), kExact, [&](Check& check) {
      Twin<float> y = lab.input(lab.random.normal(n)), dy = lab.input(lab.random.normal(n)), dx = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.reluBackward(y.on(b), dy.on(b), dx.on(b), n); };
      lab.both(op, dx);
      lab.expect(check, "dx", dx);
      lab.measure(check, op, Work::memory(12.0 * n));  // read y and dy, write dx
    });
  }
}

void checkAdd(Lab& lab) {
  for (int64_t n : kElementCounts) {
    lab.run("addInPlace", countLabel(n), kExact, [&](Check& check) {
      Twin<float> a = lab.input(lab.random.normal(n)), b = lab.input(lab.random.normal(n));
      auto op = [&](Backend& backend) { backend.addInPlace(a.on(backend), b.on(backend), n); };
      lab.both(op);
      lab.expect(check, "a", a);
      lab.measure(check, op, Work::memory(12.0 * n));  // read a and b, write a
    });
    lab.run("add", countLabel(n), kExact, [&](Check& check) {
      Twin<float> a = lab.input(lab.random.normal(n)), b = lab.input(lab.random.normal(n)), out = lab.empty<float>(n);
      auto op = [&](Backend& backend) { backend.add(a.on(backend), b.on(backend), out.on(backend), n); };
      lab.both(op, out);
      lab.expect(check, "out", out);
      lab.measure(check, op, Work::memory(12.0 * n));  // read a and b, write out
    });
  }
}

void checkScale(Lab& lab) {
  for (int64_t n : kElementCounts)
    lab.run("scale", countLabel(n), kExact, [&](Check& check) {
      const float s = lab.random.scalar();
      Twin<float> x = lab.input(lab.random.normal(n)), y = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.scale(x.on(b), y.on(b), n, s); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(8.0 * n));  // read x, write y
    });
}

void checkDropout(Lab& lab) {
  // VGG's dropout is p = 0.5 (scale 2, exact in any order); 0.3 gives a scale with a full mantissa.
  const double drop = 0.3;
  const float scale = static_cast<float>(1.0 / (1.0 - drop));
  std::vector<int64_t> counts = kElementCounts;
  counts.push_back(128 * 512);  // VGG's classifier input at batch 128
  for (int64_t n : counts) {
    // The mask drawn on the device from a key: the CPU's, bit for bit.
    lab.run("dropout.mask", countLabel(n), kExact, [&](Check& check) {
      Twin<uint8_t> keep = lab.empty<uint8_t>(n);
      const uint64_t key = lab.random.key();
      auto op = [&](Backend& b) { b.dropoutMask(key, static_cast<float>(drop), keep.on(b), n); };
      lab.both(op, keep);
      lab.expect(check, "keep", keep);
      lab.measure(check, op, Work::memory(1.0 * n));  // write the byte mask
    });
    lab.run("dropout.forward", countLabel(n), kExact, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(n)), y = lab.empty<float>(n);
      Twin<uint8_t> keep = lab.input(lab.random.bernoulli(n, 1.0 - drop));
      auto op = [&](Backend& b) { b.dropoutForward(x.on(b), keep.on(b), y.on(b), n, scale); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(9.0 * n));  // read x and the byte mask, write y
    });
    lab.run("dropout.backward", countLabel(n), kExact, [&](Check& check) {
      Twin<float> dy = lab.input(lab.random.normal(n)), dx = lab.empty<float>(n);
      Twin<uint8_t> keep = lab.input(lab.random.bernoulli(n, 1.0 - drop));
      auto op = [&](Backend& b) { b.dropoutBackward(dy.on(b), keep.on(b), dx.on(b), n, scale); };
      lab.both(op, dx);
      lab.expect(check, "dx", dx);
      lab.measure(check, op, Work::memory(9.0 * n));  // read dy and the byte mask, write dx
    });
  }
}

}  // namespace accordion::lab
