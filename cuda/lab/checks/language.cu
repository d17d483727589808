// The kernel lab's checks: the language model's ops.
#include "lab/lab.h"

namespace accordion::lab {

void checkEmbedding(Lab& lab) {
  struct EmbeddingCase {
    int64_t rows, width, entries;
  };
  // Odd sizes (with repeated ids), a window of WikiText-2 for the LSTM 2×650, and the same window over
  // 10 tokens only (long runs of one token: few blocks, each adding many rows).
  const EmbeddingCase cases[] = {{1, 1, 2}, {7, 5, 3}, {61, 997, 40}, {700, 650, 33278}, {700, 650, 10}};
  for (const EmbeddingCase& e : cases) {
    const std::string label = dims({e.rows, e.width}) + " of " + std::to_string(e.entries);
    const std::vector<int32_t> ids = lab.random.labels(e.rows, static_cast<int32_t>(e.entries));
    lab.run("embedding.forward", label, kExact, [&](Check& check) {
      Twin<float> table = lab.input(lab.random.normal(e.entries * e.width)), y = lab.empty<float>(e.rows * e.width);
      Twin<int32_t> deviceIds = lab.input(ids);
      auto op = [&](Backend& b) { b.embeddingForward(table.on(b), deviceIds.on(b), y.on(b), e.rows, e.width); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(8.0 * e.rows * e.width + 4.0 * e.rows));  // read rows and ids, write y
    });
    // The same additions in the same order on both devices: exact. dTable is read and written, so
    // it starts from random values rather than poison.
    lab.run("embedding.backward", label, kExact, [&](Check& check) {
      Twin<float> dy = lab.input(lab.random.normal(e.rows * e.width)), dTable = lab.input(lab.random.normal(e.entries * e.width));
      auto op = [&](Backend& b) { b.embeddingBackward(dy.on(b), ids.data(), dTable.on(b), e.rows, e.width); };
      lab.both(op);
      lab.expect(check, "dTable", dTable);
      // Includes grouping the ids on the host and uploading them: the op's own work.
      lab.measure(check, op, Work::memory(12.0 * e.rows * e.width));  // read dy, read and write the rows
    });
  }
}

void checkLstmCell(Lab& lab) {
  // Odd sizes, one step of the LSTM 2×650 at batch 20, and a larger batch for bandwidth.
  struct CellCase {
    int64_t batch, hidden;
  };
  for (const CellCase& size : {CellCase{1, 1}, {3, 5}, {7, 33}, {20, 650}, {256, 1500}}) {
    const int64_t batch = size.batch, hidden = size.hidden, n = batch * hidden;
    // Forward: exp and tanh of the CPU's libm against CUDA's, and FMAs on the GPU.
    lab.run("lstmCell.forward", dims({batch, hidden}), kFewRoundings, [&](Check& check) {
      Twin<float> gates = lab.input(lab.random.normal(4 * n, 0, 2)), cPrev = lab.input(lab.random.normal(n));
      Twin<float> c = lab.empty<float>(n), tanhC = lab.empty<float>(n), h = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.lstmCellForward(gates.on(b), cPrev.on(b), c.on(b), tanhC.on(b), h.on(b), batch, hidden); };
      lab.both(op, c, tanhC, h);  // the gates are read and written: not poisoned
      lab.expect(check, "gates", gates);
      lab.expect(check, "c", c);
      lab.expect(check, "tanhC", tanhC);
      lab.expect(check, "h", h);
      lab.measure(check, op, Work::memory(4.0 * (8 * n + 4 * n)));  // gates read and written, cPrev; c, tanhC, h
    });
    lab.run("lstmCell.backward", dims({batch, hidden}), kFewRoundings, [&](Check& check) {
      // Activations as forward keeps them: σ in (0, 1), tanh in (−1, 1).
      std::vector<float> activations = lab.random.normal(4 * n);
      for (int64_t r = 0; r < batch; ++r)
        for (int64_t j = 0; j < 4 * hidden; ++j) {
          float& a = activations[r * 4 * hidden + j];
          a = j / hidden == 2 ? std::tanh(a) : 1.0f / (1.0f + std::exp(-a));
        }
      std::vector<float> tanhCells = lab.random.normal(n);
      for (float& t : tanhCells) t = std::tanh(t);
      Twin<float> gates = lab.input(activations), tanhC = lab.input(tanhCells), cPrev = lab.input(lab.random.normal(n));
      Twin<float> dhOut = lab.input(lab.random.normal(n)), dhNext = lab.input(lab.random.normal(n)), dcNext = lab.input(lab.random.normal(n));
      Twin<float> dGates = lab.empty<float>(4 * n);
      auto op = [&](Backend& b) {
        b.lstmCellBackward(gates.on(b), tanhC.on(b), cPrev.on(b), dhOut.on(b), dhNext.on(b), dcNext.on(b), dGates.on(b), batch, hidden);
      };
      lab.both(op, dGates);  // dcNext is read and written: not poisoned
      lab.expect(check, "dGates", dGates);
      lab.expect(check, "dcNext", dcNext);
      lab.measure(check, op, Work::memory(4.0 * (4 * n + 5 * n + 4 * n + n)));  // gates and 5 states read; dGates, dcNext written
    });
  }
}

void checkSoftmaxCrossEntropy(Lab& lab) {
  struct LossCase {
    int64_t rows, classes;
  };
  // Odd sizes, CIFAR-10 and CIFAR-100 at batch 128, and a word-level vocabulary (WikiText-2's 33,278
  // words over 35×20 tokens, 93 MB of logits) for a row longer than a block, beyond L2.
  const LossCase cases[] = {{1, 2}, {3, 7}, {61, 997}, {128, 10}, {128, 100}, {700, 33278}};
  for (const LossCase& s : cases) {
    const int64_t n = s.rows * s.classes;
    lab.run("softmaxCrossEntropy", "(" + std::to_string(s.rows) + "," + std::to_string(s.classes) + ")", kFewRoundings, [&](Check& check) {
      Twin<float> logits = lab.input(lab.random.normal(n, 0, 2)), grad = lab.empty<float>(n);
      Twin<int32_t> labels = lab.input(lab.random.labels(s.rows, static_cast<int32_t>(s.classes)));
      Twin<double> stats = lab.empty<double>(2);
      auto op = [&](Backend& b) { b.softmaxCrossEntropy(logits.on(b), labels.on(b), s.rows, s.classes, grad.on(b), stats.on(b)); };
      lab.both(op, grad, stats);
      lab.expect(check, "gradLogits", grad);
      const std::vector<double> got = lab.fromGpu(stats), want = lab.fromCpu(stats);
      compare(check, "stats[0] (mean loss)", got[0], want[0], check.tolerance);
      // Arg-maxima of the same floats: no rounding, so exact (ties, the first wins, are vanishingly rare).
      compare(check, "stats[1] (rows predicted right)", got[1], want[1], kExact);
      lab.measure(check, op, Work::memory(8.0 * n + 4.0 * s.rows));  // read logits and labels, write the gradient
    });
  }
}

}  // namespace accordion::lab
