// The kernel lab's checks: per-parameter lists.
#include "lab/lab.h"

namespace accordion::lab {

void checkSgdUpdate(Lab& lab) {
  struct Variant {
    const char* label;
    float momentum;
    bool nesterov, first;
    double bytesPerElement;
  };
  // First steps: read p and g, write p and the momentum buffer (which the step must not read).
  // Later steps also read the buffer. Without momentum: read p and g, write p; the buffer stays.
  const Variant variants[] = {{"Nesterov, first step", 0.9f, true, true, 16},
                              {"Nesterov, later step", 0.9f, true, false, 20},
                              {"heavy ball, first step", 0.9f, false, true, 16},
                              {"heavy ball, later step", 0.9f, false, false, 20},
                              {"no momentum", 0.0f, false, false, 12}};
  for (const TensorList& list : tensorLists())
    for (const Variant& v : variants)
      lab.run("sgdUpdate", list.label + ", " + v.label, kFewRoundings, [&](Check& check) {
        const SgdHyper hyper{0.1f, v.momentum, 5e-4f, v.nesterov};
        const bool bufferWritten = v.momentum != 0.0f, bufferRead = bufferWritten && !v.first;
        std::vector<Twin<float>> values = inputs(lab, normals(lab, list.sizes)), grads = inputs(lab, normals(lab, list.sizes)),
                                 buffers = inputs(lab, normals(lab, list.sizes));
        auto op = [&](Backend& b) {
          std::vector<SgdSlot> slots;
          for (size_t k = 0; k < values.size(); ++k) slots.push_back({values[k].on(b), grads[k].on(b), buffers[k].on(b), values[k].size()});
          b.sgdUpdate(slots, hyper, v.first);
        };
        // At the first step the buffer is an output only (buf = d), so whatever it held must not matter.
        if (bufferWritten && !bufferRead)
          for (Twin<float>& buffer : buffers) lab.poison(buffer);
        lab.both(op);
        for (size_t k = 0; k < values.size(); ++k) {
          lab.expect(check, indexed("value", k), values[k]);
          lab.expect(check, indexed("momentum", k), buffers[k], bufferWritten ? check.tolerance : kExact);
        }
        lab.measure(check, op, Work::memory(v.bytesPerElement * static_cast<double>(list.total())));
      });
}

void checkFindNonFinite(Lab& lab) {
  struct Planted {
    size_t tensor;
    int64_t element;
    float value;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const TensorList& list : tensorLists()) {
    const size_t count = list.sizes.size();
    auto anywhereIn = [&](size_t tensor, float value) { return Planted{tensor, lab.random.index(list.sizes[tensor]), value}; };
    struct Case {
      std::string label;
      std::vector<Planted> planted;
    };
    std::vector<Case> cases = {{"clean", {}}, {"Inf at the very last element", {{count - 1, list.sizes.back() - 1, inf}}}};
    if (count >= 2) {
      // One bad value in each half of the list: the op must report the earlier tensor.
      const size_t early = static_cast<size_t>(lab.random.index(static_cast<int64_t>(count / 2)));
      const size_t late = count / 2 + static_cast<size_t>(lab.random.index(static_cast<int64_t>(count - count / 2)));
      cases.push_back({"NaN in tensor " + std::to_string(late) + ", Inf in tensor " + std::to_string(early),
                       {anywhereIn(late, nan), anywhereIn(early, inf)}});
      cases.push_back({"NaN in tensor " + std::to_string(early) + ", -Inf in tensor " + std::to_string(late),
                       {anywhereIn(early, nan), anywhereIn(late, -inf)}});
    }
    for (const Case& c : cases)
      lab.run("findNonFinite", list.label + ", " + c.label, kExact, [&](Check& check) {
        std::vector<std::vector<float>> hosts = normals(lab, list.sizes);
        double expected = 0;
        for (const Planted& p : c.planted) {
          hosts[p.tensor][static_cast<size_t>(p.element)] = p.value;
          expected = expected == 0 ? p.tensor + 1.0 : std::min(expected, p.tensor + 1.0);
        }
        std::vector<Twin<float>> tensors = inputs(lab, hosts);
        Twin<double> firstBad = lab.empty<double>(1);
        auto op = [&](Backend& b) { b.findNonFinite(constSpans(tensors, b), firstBad.on(b)); };
        lab.both(op, firstBad);
        lab.expect(check, "firstBad", firstBad);
        compare(check, "firstBad (CPU reference against the planted values)", lab.fromCpu(firstBad)[0], expected, kExact);
        // A clean list must be read whole; with a bad value the op may stop early.
        lab.measure(check, op, c.planted.empty() ? Work::memory(4.0 * list.total()) : Work::none());
      });
  }
}

void checkAccumulate(Lab& lab) {
  for (const TensorList& list : tensorLists())
    lab.run("accumulate", list.label, kExact, [&](Check& check) {
      std::vector<Twin<float>> sums = inputs(lab, normals(lab, list.sizes)), values = inputs(lab, normals(lab, list.sizes));
      auto op = [&](Backend& b) { b.accumulate(spans(sums, b), constSpans(values, b)); };
      lab.both(op);
      for (size_t k = 0; k < sums.size(); ++k) lab.expect(check, indexed("sums", k), sums[k]);
      lab.measure(check, op, Work::memory(12.0 * list.total()));  // read sums and values, write sums
    });
}

void checkSumsOfSquares(Lab& lab) {
  for (const TensorList& list : tensorLists())
    lab.run("sumsOfSquares", list.label, kDoubleSum, [&](Check& check) {
      std::vector<Twin<float>> tensors = inputs(lab, normals(lab, list.sizes));
      const std::vector<double> want = lab.cpu.sumsOfSquares(constSpans(tensors, lab.cpu)),
                                got = lab.gpu.sumsOfSquares(constSpans(tensors, lab.gpu));
      if (got.size() != want.size())
        throw std::runtime_error(std::to_string(got.size()) + " sums for " + std::to_string(want.size()) + " tensors");
      // Each tensor's sum on its own scale: a small tensor's is not measured against a large one's.
      for (size_t k = 0; k < want.size(); ++k) compare(check, indexed("sums", k), got[k], want[k], check.tolerance);
      // Includes reading the sums back: the op returns them on the host.
      lab.measure(check, [&](Backend& b) { b.sumsOfSquares(constSpans(tensors, b)); }, Work::memory(4.0 * list.total()));
    });
}

void checkClipTotalNorm(Lab& lab) {
  std::vector<TensorList> lists = tensorLists();
  // The LSTM 2×650 on WikiText-2's parameters: the tied embedding, two layers, the decoder bias.
  lists.push_back({"LSTM 2x650, V 33278 parameters", {33278 * 650, 2600 * 650, 2600 * 650, 2600, 2600, 2600 * 650, 2600 * 650, 2600, 2600, 33278}});
  for (const TensorList& list : lists) {
    // Normal values: a norm near √(elements), far above 0.25, so every tensor is scaled; the
    // factor, from double sums added in another order, may round to a float one ulp apart.
    lab.run("clipTotalNorm", list.label + ", clipped to 0.25", kOneRounding, [&](Check& check) {
      std::vector<Twin<float>> tensors = inputs(lab, normals(lab, list.sizes));
      lab.both([&](Backend& b) { b.clipTotalNorm(spans(tensors, b), 0.25); });
      for (size_t k = 0; k < tensors.size(); ++k) lab.expect(check, indexed("tensor", k), tensors[k]);
    });
    // Under the bound nothing changes; timed here, where every run does the same work (the norm:
    // every element read once, the factor on the device, no wait).
    lab.run("clipTotalNorm", list.label + ", under the bound", kExact, [&](Check& check) {
      std::vector<Twin<float>> tensors = inputs(lab, normals(lab, list.sizes));
      auto op = [&](Backend& b) { b.clipTotalNorm(spans(tensors, b), 1e30); };
      lab.both(op);
      for (size_t k = 0; k < tensors.size(); ++k) lab.expect(check, indexed("tensor", k), tensors[k]);
      lab.measure(check, op, Work::memory(4.0 * list.total()));
    });
  }
}

}  // namespace accordion::lab
