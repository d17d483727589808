// The kernel lab's checks: memory.
#include "lab/lab.h"

namespace accordion::lab {

void checkMemory(Lab& lab) {
  // Around CudaBackend's 4 MiB threshold between staged and direct uploads, and far beyond it.
  for (int64_t n : {int64_t{997}, int64_t{1} << 20, (int64_t{1} << 20) + 3, int64_t{64} << 20}) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    lab.run("upload/download", countLabel(n), kExact, [&](Check& check) {
      const std::vector<float> host = lab.random.normal(n);
      Twin<float> data = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.upload(data.on(b), host.data(), bytes); };
      lab.both(op, data);
      lab.expect(check, "data", data);  // downloads the GPU's copy
      lab.measure(check, op, Work::transfer(static_cast<double>(bytes)));  // the upload alone
    });
    lab.run("uploadAhead", countLabel(n), kExact, [&](Check& check) {
      const auto host = std::make_shared<const std::vector<float>>(lab.random.normal(n));
      auto roundTrip = [&](Backend& b) {
        std::shared_ptr<void> stored = b.uploadAhead(host->data(), bytes, host);
        std::vector<float> back(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
        b.download(back.data(), stored.get(), bytes);
        b.synchronize();
        return back;
      };
      compare(check, "data", roundTrip(lab.gpu), roundTrip(lab.cpu), kExact);
      lab.measure(check, [&](Backend& b) { b.uploadAhead(host->data(), bytes, host); }, Work::transfer(static_cast<double>(bytes)));
    });
  }
  for (int64_t n : kElementCounts)
    lab.run("copy", countLabel(n), kExact, [&](Check& check) {
      Twin<float> src = lab.input(lab.random.normal(n)), dst = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.copy(dst.on(b), src.on(b), src.bytes()); };
      lab.both(op, dst);
      lab.expect(check, "dst", dst);
      lab.measure(check, op, Work::memory(8.0 * n));  // read n + write n floats
    });
}

}  // namespace accordion::lab
