// The kernel lab's checks: max pooling.
#include "lab/lab.h"

namespace accordion::lab {

void checkMaxPool2d(Lab& lab) {
  struct PoolCase {
    Dims in;
    int64_t kernel, stride, padding;
    bool ties = false;  // inputs rounded to whole numbers, so that windows hold equal maxima
  };
  const PoolCase cases[] = {
      // VGG-19's five 2×2 pools at batch 128.
      {{128, 64, 32, 32}, 2, 2, 0},
      {{128, 128, 16, 16}, 2, 2, 0},
      {{128, 256, 8, 8}, 2, 2, 0},
      {{128, 512, 4, 4}, 2, 2, 0},
      {{128, 512, 2, 2}, 2, 2, 0},
      // Overlapping 3×3 windows with stride 2 and padding 1 (ImageNet ResNet's stem pool).
      {{128, 64, 32, 32}, 3, 2, 1},
      // Odd sizes, where windows leave the last row and column out or hang over the padding.
      {{3, 5, 7, 9}, 2, 2, 0},
      {{1, 1, 3, 3}, 2, 2, 0},
      {{3, 5, 7, 9}, 3, 2, 1},
      {{1, 3, 5, 5}, 3, 2, 1},
      // Equal maxima, where the first in the window, row by row, must win (as on the CPU).
      {{3, 5, 7, 9}, 2, 2, 0, true},
      {{3, 5, 7, 9}, 3, 2, 1, true},
      {{128, 64, 32, 32}, 3, 2, 1, true},
      // 256 MiB of input for bandwidth.
      {{256, 64, 64, 64}, 2, 2, 0},
      {{256, 64, 64, 64}, 3, 2, 1},
  };
  for (const PoolCase& c : cases) {
    const Pool2dSpec spec{c.in.n, c.in.c, c.in.h, c.in.w, c.kernel, c.stride, c.padding};
    const Dims out{c.in.n, c.in.c, spec.outHeight(), spec.outWidth()};
    const std::string label = c.in.label() + " k" + std::to_string(c.kernel) + " s" + std::to_string(c.stride) + " p" +
                              std::to_string(c.padding) + (c.ties ? ", ties" : "");
    auto inputOf = [&] {
      std::vector<float> x = lab.random.normal(c.in.numel());
      if (c.ties)
        for (float& v : x) v = std::round(v);
      return x;
    };
    // Read one tensor and write the other; where each maximum came from is the implementation's
    // business and not counted.
    const double bytes = 4.0 * (c.in.numel() + out.numel());
    lab.run("maxPool2d.forward", label, kExact, [&](Check& check) {
      TwinOp<MaxPool2dOp> pool{lab.cpu.maxPool2d(spec), lab.gpu.maxPool2d(spec)};
      Twin<float> x = lab.input(inputOf(), c.in), y = lab.activation(out);
      auto op = [&](Backend& b) { pool.on(b).forward(x.on(b), y.on(b)); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(bytes));
    });
    // Windows that overlap may send several gradients to one input, summed in any order.
    lab.run("maxPool2d.backward", label, c.kernel > c.stride ? kOneRounding : kExact, [&](Check& check) {
      TwinOp<MaxPool2dOp> pool{lab.cpu.maxPool2d(spec), lab.gpu.maxPool2d(spec)};
      Twin<float> x = lab.input(inputOf(), c.in), y = lab.activation(out);
      lab.both([&](Backend& b) { pool.on(b).forward(x.on(b), y.on(b)); }, y);  // where the maxima are
      Twin<float> dy = lab.input(lab.random.normal(out.numel()), out), dx = lab.activation(c.in);
      auto op = [&](Backend& b) { pool.on(b).backward(dy.on(b), dx.on(b)); };
      lab.both(op, dx);
      lab.expect(check, "dx", dx);
      lab.measure(check, op, Work::memory(bytes));
    });
  }
}

}  // namespace accordion::lab
