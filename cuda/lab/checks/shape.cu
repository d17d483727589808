// The kernel lab's checks: activation shape ops.
#include "lab/lab.h"

namespace accordion::lab {

void checkGlobalAvgPool(Lab& lab) {
  // Odd shapes, ResNet-18's pool at batch 128, and 256 MiB of input for bandwidth.
  for (const Dims& d : {Dims{1, 1, 1, 1}, Dims{3, 5, 7, 9}, Dims{1, 3, 13, 1}, Dims{128, 512, 4, 4}, Dims{256, 64, 64, 64}}) {
    const int64_t rows = d.n * d.c;
    lab.run("globalAvgPool.forward", d.label(), kPoolingSum, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(d.numel()), d), y = lab.empty<float>(rows);
      auto op = [&](Backend& b) { b.globalAvgPoolForward(x.on(b), y.on(b), d.n, d.c, d.h, d.w); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(4.0 * (d.numel() + rows)));  // read x, write y
    });
    lab.run("globalAvgPool.backward", d.label(), kOneRounding, [&](Check& check) {
      Twin<float> dy = lab.input(lab.random.normal(rows)), dx = lab.activation(d);
      auto op = [&](Backend& b) { b.globalAvgPoolBackward(dy.on(b), dx.on(b), d.n, d.c, d.h, d.w); };
      lab.both(op, dx);
      lab.expect(check, "dx", dx);
      lab.measure(check, op, Work::memory(4.0 * (rows + d.numel())));  // read dy, write dx
    });
  }
}

void checkFlatten(Lab& lab) {
  // NCHW host images into the activation layout: a CIFAR batch, and odd sizes.
  for (const Dims& d : {Dims{128, 3, 32, 32}, Dims{1, 3, 5, 7}, Dims{3, 1, 1, 1}})
    lab.run("uploadImages", d.label(), kExact, [&](Check& check) {
      const std::vector<float> host = lab.random.normal(d.numel());
      Twin<float> images = lab.activation(d);
      auto op = [&](Backend& b) { b.uploadImages(host.data(), images.on(b), d.n, d.c, d.h, d.w); };
      lab.both(op, images);
      lab.expect(check, "images", images);
      lab.measure(check, op, Work::transfer(4.0 * d.numel()));
    });
  // Odd shapes, VGG's flatten at batch 128, and 256 MiB for bandwidth.
  for (const Dims& d : {Dims{1, 1, 1, 1}, Dims{3, 5, 7, 9}, Dims{128, 512, 1, 1}, Dims{128, 64, 8, 8}, Dims{256, 64, 64, 64}}) {
    lab.run("flatten.forward", d.label(), kExact, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(d.numel()), d), y = lab.empty<float>(d.numel());
      auto op = [&](Backend& b) { b.flattenForward(x.on(b), y.on(b), d.n, d.c, d.h, d.w); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(8.0 * d.numel()));  // read x, write y
    });
    lab.run("flatten.backward", d.label(), kExact, [&](Check& check) {
      Twin<float> dy = lab.input(lab.random.normal(d.numel())), dx = lab.activation(d);
      auto op = [&](Backend& b) { b.flattenBackward(dy.on(b), dx.on(b), d.n, d.c, d.h, d.w); };
      lab.both(op, dx);
      lab.expect(check, "dx", dx);
      lab.measure(check, op, Work::memory(8.0 * d.numel()));  // read dy, write dx
    });
  }
}

}  // namespace accordion::lab
