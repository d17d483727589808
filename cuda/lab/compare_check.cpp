// The kernel lab's comparison checked on the CPU alone (no CUDA, no GPU): the cases of
// comparisonSelfCheck() in compare.h, among them outputs left unwritten and NaN errors.
//
//   c++ -std=c++17 -O1 -o compare_check cuda/lab/compare_check.cpp && ./compare_check
//   ./compare_check --rows      prints rows as kernel_check writes them to gpu-check.jsonl
//
// Exit status: 0 when the comparison gives every verdict it should, 1 otherwise (test/native/lab.test.js).
#include <cstdio>
#include <cstring>

#include "compare.h"

namespace {

// A passing check with timings and a convolution's choices, a failing one whose error is NaN and
// whose message needs escaping, and a skipped one.
void printRows() {
  using accordion::lab::Check;
  Check timed;
  timed.op = "conv2d.forward";
  timed.shape = "(128,64,32,32) 64->64 k3 s1 p1";
  timed.tolerance = 1e-4;
  accordion::lab::compare(timed, "y", std::vector<float>{1.0f, 2.0f}, std::vector<float>{1.0f, 2.0f}, 1e-4);
  timed.medianUs = 412.5;
  timed.gflopPerS = 18250;
  timed.note = "forward IMPLICIT_PRECOMP_GEMM (FMA, 0.412 ms, 0 B scratch)";
  Check failed;
  failed.op = "batchNorm2d.backward";
  failed.shape = "(3,5,7,9), \"batch\" statistics";
  failed.tolerance = 1e-4;
  failed.record(accordion::lab::kNaN, 1e-4, "dx[3]: got nan, want 0.5\n\tsecond line");
  Check skipped;
  skipped.op = "relu.forward";
  skipped.shape = "n=67108864";
  skipped.skipped = "67108864 elements, beyond --max-elements 4194304";
  for (const Check* c : {&timed, &failed, &skipped}) std::printf("%s\n", accordion::lab::checkRow(*c, "lab", "conv2d").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--rows") == 0) {
    printRows();
    return 0;
  }
  const std::vector<std::string> problems = accordion::lab::comparisonSelfCheck();
  for (const std::string& p : problems) std::printf("FAILED %s\n", p.c_str());
  if (!problems.empty()) return 1;
  std::printf("the lab's comparison fails unwritten, NaN and Inf outputs and keeps NaN errors\n");
  return 0;
}
