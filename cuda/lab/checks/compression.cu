// The kernel lab's checks: gradient compression (ops/compression_kernels.h).
#include "lab/lab.h"

namespace accordion::lab {

// PowerSGD's matrices (rows, cols, rank), and lists of them: odd shapes, and the weights of CIFAR
// ResNet-18 viewed as (out, in·kh·kw) at the ranks Accordion switches between.
struct MatrixShape {
  int64_t rows, cols, rank;
};

struct MatrixList {
  std::string label;
  std::vector<MatrixShape> shapes;
};

std::vector<MatrixShape> resnet18Matrices(int64_t rank) {
  std::vector<std::pair<int64_t, int64_t>> views = {{64, 27}};
  int64_t in = 64;
  for (int64_t planes : {64, 128, 256, 512})
    for (int block = 0; block < 2; ++block) {
      views.push_back({planes, in * 9});
      views.push_back({planes, planes * 9});
      if (in != planes) views.push_back({planes, in});
      in = planes;
    }
  views.push_back({10, 512});
  std::vector<MatrixShape> shapes;
  for (auto [rows, cols] : views) shapes.push_back({rows, cols, std::min({rows, cols, rank})});
  return shapes;
}

std::vector<MatrixList> matrixLists() {
  std::vector<MatrixList> lists = {{"(1,7) r1, (3,5) (5,3) (33,65) r2", {{1, 7, 1}, {3, 5, 2}, {5, 3, 2}, {33, 65, 2}}}};
  for (int64_t rank : {1, 2, 4}) lists.push_back({"ResNet-18 weights, rank " + std::to_string(rank), resnet18Matrices(rank)});
  return lists;
}

template <typename T>
void poisonAll(Lab& lab, std::vector<Twin<T>>& list) {
  for (Twin<T>& t : list) lab.poison(t);
}

void expectAll(Lab& lab, Check& check, const char* name, std::vector<Twin<float>>& list, double tolerance) {
  for (size_t k = 0; k < list.size(); ++k) lab.expect(check, indexed(name, k), list[k], tolerance);
}

// Every buffer of a PowerSGD step, random, on both backends.
struct PowerSgdTwins {
  std::vector<MatrixShape> shapes;
  std::vector<Twin<float>> grad, memory, q, p, qt;

  PowerSgdTwins(Lab& lab, const std::vector<MatrixShape>& list) : shapes(list) {
    for (const MatrixShape& s : shapes) {
      grad.push_back(lab.input(lab.random.normal(s.rows * s.cols)));
      memory.push_back(lab.input(lab.random.normal(s.rows * s.cols)));
      q.push_back(lab.input(lab.random.normal(s.cols * s.rank)));
      p.push_back(lab.input(lab.random.normal(s.rows * s.rank)));
      qt.push_back(lab.input(lab.random.normal(s.rank * s.cols)));
    }
  }
  std::vector<PowerSgdMatrix> on(const Backend& b) {
    std::vector<PowerSgdMatrix> out;
    for (size_t k = 0; k < shapes.size(); ++k)
      out.push_back({grad[k].on(b), memory[k].on(b), q[k].on(b), p[k].on(b), qt[k].on(b), shapes[k].rows, shapes[k].cols, shapes[k].rank});
    return out;
  }
  double elements() const {
    double n = 0;
    for (const MatrixShape& s : shapes) n += static_cast<double>(s.rows * s.cols);
    return n;
  }
};

void checkPowerSgd(Lab& lab) {
  constexpr float kEps = 1e-8f;
  for (const MatrixList& list : matrixLists()) {
    // M = g + e, then P = M·Q: Qᵀ is the CPU's scratch, not an output.
    lab.run("powerSgd.project", list.label, kMatmul, [&](Check& check) {
      PowerSgdTwins t(lab, list.shapes);
      auto op = [&](Backend& b) { b.compression().powerSgdProject(t.on(b)); };
      poisonAll(lab, t.p);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "M", t.memory, kExact);
      expectAll(lab, check, "P", t.p, kMatmul);
      lab.measure(check, op, Work::memory(16.0 * t.elements()));  // read g and e, write M, read M
    });
    // Orthogonalise P, then Qᵀ = P̂ᵀ·M.
    lab.run("powerSgd.projectBack", list.label, kMatmul, [&](Check& check) {
      PowerSgdTwins t(lab, list.shapes);
      auto op = [&](Backend& b) { b.compression().powerSgdProjectBack(t.on(b), kEps); };
      poisonAll(lab, t.qt);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "P̂", t.p, kFewRoundings);
      expectAll(lab, check, "Qᵀ", t.qt, kMatmul);
      // Timed launches orthogonalise an already orthonormal P: the same work.
      lab.measure(check, op, Work::memory(4.0 * t.elements()));  // read M
    });
    // Qᵀ·(1/W), Q = (Qᵀ)ᵀ, out = P̂·Qᵀ, e = M − out.
    lab.run("powerSgd.decompress", list.label, kFewRoundings, [&](Check& check) {
      PowerSgdTwins t(lab, list.shapes);
      auto op = [&](Backend& b) { b.compression().powerSgdDecompress(t.on(b), 0.25f); };
      poisonAll(lab, t.grad);
      poisonAll(lab, t.q);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "Qᵀ", t.qt, kExact);
      expectAll(lab, check, "Q", t.q, kExact);
      expectAll(lab, check, "out", t.grad, kFewRoundings);
      expectAll(lab, check, "e", t.memory, kFewRoundings);
      lab.measure(check, op, Work::memory(12.0 * t.elements()));  // read M, write M and out
    });
  }
}

int64_t topKCountOf(double ratio, int64_t n) { return std::max<int64_t>(1, static_cast<int64_t>(std::floor(ratio * static_cast<double>(n)))); }

void checkTopK(Lab& lab) {
  struct Case {
    std::string label;
    std::vector<int64_t> sizes;
    double ratio;
    bool ties;  // magnitudes on a coarse grid: many equal keys around the threshold
  };
  std::vector<Case> cases;
  for (const TensorList& list : tensorLists())
    for (double ratio : {0.01, 0.1}) cases.push_back({list.label + ", K=" + formatted("%g", ratio), list.sizes, ratio, false});
  cases.push_back({"sizes 1,3,997,4,65537, K=0.3, ties", {1, 3, 997, 4, 65537}, 0.3, true});
  cases.push_back({"ResNet-18 parameters, K=0.1, ties", resnet18ParameterSizes(), 0.1, true});
  for (const Case& c : cases) {
    // a = g + e; the winners' indices and values in index order; e = a − sparse(a). Exact: one add
    // per element, then the same selection.
    lab.run("topK.select", c.label, kExact, [&](Check& check) {
      std::vector<std::vector<float>> grads = normals(lab, c.sizes), memories = normals(lab, c.sizes);
      if (c.ties)
        for (auto& host : grads)
          for (float& v : host) v = std::round(v * 2.0f) / 2.0f;
      if (c.ties)
        for (auto& host : memories) std::fill(host.begin(), host.end(), 0.0f);
      std::vector<Twin<float>> grad = inputs(lab, grads), memory = inputs(lab, memories), send;
      for (int64_t n : c.sizes) send.push_back(lab.empty<float>(2 * topKCountOf(c.ratio, n)));
      auto op = [&](Backend& b) {
        std::vector<TopKTensor> tensors;
        int64_t offset = 0;
        for (size_t k = 0; k < grad.size(); ++k) {
          const int64_t count = topKCountOf(c.ratio, c.sizes[k]);
          tensors.push_back({grad[k].on(b), memory[k].on(b), send[k].on(b), c.sizes[k], count, offset});
          offset += 2 * count;
        }
        b.compression().topKSelect(tensors);
      };
      poisonAll(lab, send);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "send", send, kExact);
      expectAll(lab, check, "e", memory, kExact);
      double total = 0;
      for (int64_t n : c.sizes) total += static_cast<double>(n);
      // Against one pass that reads g and e and writes e: the selection's further passes show as a
      // lower fraction of the copy bandwidth.
      lab.measure(check, op, Work::memory(12.0 * total));
    });
  }
  // The average of 4 workers' pairs: grad = ¼·Σ_w scatter(pairs_w), workers added in rank order.
  for (const TensorList& list : tensorLists())
    lab.run("topK.combine", list.label + ", 4 workers, K=0.1", kOneRounding, [&](Check& check) {
      constexpr int kWorkers = 4;
      std::vector<int64_t> counts, offsets;
      int64_t perWorker = 0;
      for (int64_t n : list.sizes) {
        counts.push_back(topKCountOf(0.1, n));
        offsets.push_back(perWorker);
        perWorker += 2 * counts.back();
      }
      std::vector<float> gathered(static_cast<size_t>(kWorkers * perWorker));
      std::mt19937_64 engine(lab.random.index(int64_t{1} << 40));
      for (int w = 0; w < kWorkers; ++w)
        for (size_t k = 0; k < list.sizes.size(); ++k) {
          // Distinct indices in ascending order, as a worker's selection sends them.
          std::vector<int32_t> all(static_cast<size_t>(list.sizes[k]));
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), engine);
          std::vector<int32_t> chosen(all.begin(), all.begin() + counts[k]);
          std::sort(chosen.begin(), chosen.end());
          const std::vector<float> values = lab.random.normal(counts[k]);
          float* block = gathered.data() + w * perWorker + offsets[k];
          std::memcpy(block, chosen.data(), chosen.size() * sizeof(float));
          std::memcpy(block + counts[k], values.data(), values.size() * sizeof(float));
        }
      Twin<float> pairs = lab.input(gathered);
      std::vector<Twin<float>> grad;
      for (int64_t n : list.sizes) grad.push_back(lab.empty<float>(n));
      auto op = [&](Backend& b) {
        std::vector<TopKTensor> tensors;
        for (size_t k = 0; k < grad.size(); ++k) tensors.push_back({grad[k].on(b), nullptr, nullptr, list.sizes[k], counts[k], offsets[k]});
        b.compression().topKCombine(tensors, pairs.on(b), kWorkers, perWorker, 0.25f);
      };
      poisonAll(lab, grad);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "grad", grad, kOneRounding);
      lab.measure(check, op, Work::memory(4.0 * static_cast<double>(list.total()) + 4.0 * kWorkers * perWorker));
    });
}

void checkDenseExchange(Lab& lab) {
  for (const TensorList& list : tensorLists()) {
    lab.run("dense.pack", list.label, kExact, [&](Check& check) {
      std::vector<Twin<float>> tensors = inputs(lab, normals(lab, list.sizes));
      Twin<float> buffer = lab.empty<float>(list.total());
      auto op = [&](Backend& b) { b.compression().pack(spans(tensors, b), buffer.on(b)); };
      lab.both(op, buffer);
      lab.expect(check, "buffer", buffer);
      lab.measure(check, op, Work::memory(8.0 * list.total()));
    });
    lab.run("dense.unpack", list.label + ", scale 1/4", kExact, [&](Check& check) {
      Twin<float> buffer = lab.input(lab.random.normal(list.total()));
      std::vector<Twin<float>> tensors;
      for (int64_t n : list.sizes) tensors.push_back(lab.empty<float>(n));
      auto op = [&](Backend& b) { b.compression().unpack(buffer.on(b), spans(tensors, b), 0.25f); };
      poisonAll(lab, tensors);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "tensor", tensors, kExact);
      lab.measure(check, op, Work::memory(8.0 * list.total()));
    });
  }
}

}  // namespace accordion::lab
