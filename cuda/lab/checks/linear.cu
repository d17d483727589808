// The kernel lab's checks: linear layers, GEMM and bias.
#include "lab/lab.h"

namespace accordion::lab {

void checkLinear(Lab& lab) {
  struct LinearCase {
    int64_t rows, in, out;
  };
  // Odd sizes, then batch 128: ResNet-18's 512→10, VGG's 512→512, and CIFAR-100 VGG's 512→4096,
  // 4096→4096 and 4096→100.
  const LinearCase cases[] = {{1, 1, 1}, {3, 7, 5}, {61, 997, 13}, {128, 512, 10}, {128, 512, 512}, {128, 512, 4096}, {128, 4096, 4096},
                              {128, 4096, 100}};
  for (const LinearCase& s : cases) {
    const std::string label = "(" + std::to_string(s.rows) + "," + std::to_string(s.in) + ") -> " + std::to_string(s.out);
    const double flops = 2.0 * s.rows * s.in * s.out;
    const float weightScale = 1.0f / std::sqrt(static_cast<float>(s.in));
    lab.run("linear.forward", label, kMatmul, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(s.rows * s.in)), weight = lab.input(lab.random.normal(s.out * s.in, 0, weightScale)),
                  bias = lab.input(lab.random.normal(s.out)), y = lab.empty<float>(s.rows * s.out);
      auto op = [&](Backend& b) { b.linearForward(x.on(b), weight.on(b), bias.on(b), y.on(b), s.rows, s.in, s.out); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::compute(flops));
    });
    lab.run("linear.backward", label, kMatmul, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(s.rows * s.in)), weight = lab.input(lab.random.normal(s.out * s.in, 0, weightScale)),
                  dy = lab.input(lab.random.normal(s.rows * s.out));
      Twin<float> dx = lab.empty<float>(s.rows * s.in), dWeight = lab.empty<float>(s.out * s.in), dBias = lab.empty<float>(s.out);
      auto op = [&](Backend& b) {
        b.linearBackward(x.on(b), weight.on(b), dy.on(b), dx.on(b), dWeight.on(b), dBias.on(b), s.rows, s.in, s.out);
      };
      lab.both(op, dx, dWeight, dBias);
      lab.expect(check, "dx", dx);
      lab.expect(check, "dWeight", dWeight);
      lab.expect(check, "dBias", dBias);
      lab.measure(check, op, Work::compute(2 * flops + s.rows * s.out));  // dW and dx, and db
    });
  }
}


void checkGemm(Lab& lab) {
  struct GemmCase {
    bool transA, transB;
    int64_t m, n, k;
    bool accumulate;
  };
  std::vector<GemmCase> cases;
  // Every transposition, overwriting and accumulating, at odd sizes.
  for (bool transA : {false, true})
    for (bool transB : {false, true})
      for (bool accumulate : {false, true}) {
        cases.push_back({transA, transB, 1, 1, 1, accumulate});
        cases.push_back({transA, transB, 3, 5, 7, accumulate});
        cases.push_back({transA, transB, 61, 13, 997, accumulate});
      }
  // The LSTM 2×650 on WikiText-2 (V 33,278, BPTT 35 × batch 20 = 700 rows): the input projections of
  // a window, the recurrence of a step, the tied decoder; then backward: the decoder's dx and dW, the
  // recurrence's dh, the weight gradients, the input gradient.
  const GemmCase lstm[] = {{false, true, 700, 2600, 650, true},   {false, true, 20, 2600, 650, true},
                           {false, true, 700, 33278, 650, true},  {false, false, 700, 650, 33278, false},
                           {true, false, 33278, 650, 700, false}, {false, false, 20, 650, 2600, false},
                           {true, false, 2600, 650, 700, false},  {false, false, 700, 650, 2600, false}};
  cases.insert(cases.end(), std::begin(lstm), std::end(lstm));
  // Every case in fp32, then the LSTM's on TF32 tensor cores (--tf32) and in bf16 (--precision bf16,
  // against the CPU's bf16: the same rounded operands, exact products, fp32 sums in another order).
  struct Mode {
    bool tf32, bf16;
    const char* label;
    double tolerance;
  };
  const std::vector<GemmCase> lstmCases(std::begin(lstm), std::end(lstm));
  for (const Mode mode : {Mode{false, false, "", kMatmul}, Mode{true, false, ", tf32", kTf32}, Mode{false, true, ", bf16", kMatmul}})
  for (const GemmCase& g : mode.tf32 || mode.bf16 ? lstmCases : cases) {
    lab.gpu.options.tf32 = mode.tf32;
    lab.cpu.options.compute = lab.gpu.options.compute = mode.bf16 ? Precision::Bf16 : Precision::Fp32;
    const std::string label = std::string(g.transA ? "T" : "N") + (g.transB ? "T" : "N") + " " + dims({g.m, g.n, g.k}) +
                              (g.accumulate ? " +C" : "") + mode.label;
    lab.run("gemm", label, mode.tolerance, [&](Check& check) {
      const float scale = 1.0f / std::sqrt(static_cast<float>(g.k));
      Twin<float> a = lab.input(lab.random.normal(g.m * g.k)), b = lab.input(lab.random.normal(g.k * g.n, 0, scale));
      Twin<float> c = g.accumulate ? lab.input(lab.random.normal(g.m * g.n)) : lab.empty<float>(g.m * g.n);
      auto op = [&](Backend& backend) {
        backend.gemm(g.transA, g.transB, g.m, g.n, g.k, a.on(backend), b.on(backend), c.on(backend), g.accumulate);
      };
      if (g.accumulate)
        lab.both(op);  // C is an input too: nothing to poison
      else
        lab.both(op, c);
      lab.expect(check, "C", c);
      lab.measure(check, op, Work::compute(2.0 * g.m * g.n * g.k));
    });
  }
  lab.gpu.options.tf32 = false;
  lab.cpu.options.compute = lab.gpu.options.compute = Precision::Fp32;
}

void checkBias(Lab& lab) {
  // Odd sizes, the LSTM's gate pre-activations (700, 2600) and its decoder's logits (700, 33278).
  struct BiasCase {
    int64_t rows, cols;
  };
  for (const BiasCase& size : {BiasCase{1, 1}, {3, 7}, {61, 997}, {700, 2600}, {700, 33278}}) {
    const int64_t rows = size.rows, cols = size.cols;
    lab.run("broadcastRows", dims({rows, cols}), kExact, [&](Check& check) {
      Twin<float> row = lab.input(lab.random.normal(cols)), y = lab.empty<float>(rows * cols);
      auto op = [&](Backend& b) { b.broadcastRows(row.on(b), y.on(b), rows, cols); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(4.0 * (rows * cols + cols)));  // read the row, write y
    });
    lab.run("columnSums", dims({rows, cols}), kColumnSums, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(rows * cols)), sums = lab.empty<float>(cols);
      auto op = [&](Backend& b) { b.columnSums(x.on(b), sums.on(b), rows, cols); };
      lab.both(op, sums);
      lab.expect(check, "sums", sums);
      lab.measure(check, op, Work::memory(4.0 * (rows * cols + cols)));  // read x, write the sums
    });
  }
  lab.run("columnSums", "(33278,650): rows beyond one slice", kColumnSums, [&](Check& check) {
    const int64_t rows = 33278, cols = 650;
    Twin<float> x = lab.input(lab.random.normal(rows * cols)), sums = lab.empty<float>(cols);
    auto op = [&](Backend& b) { b.columnSums(x.on(b), sums.on(b), rows, cols); };
    lab.both(op, sums);
    lab.expect(check, "sums", sums);
    lab.measure(check, op, Work::memory(4.0 * (rows * cols + cols)));
  });
}

}  // namespace accordion::lab
