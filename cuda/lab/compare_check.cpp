// The kernel lab's comparison checked on the CPU alone (no CUDA, no GPU): the cases of
// comparisonSelfCheck() in compare.h, among them outputs left unwritten and NaN errors.
//
//   c++ -std=c++17 -O1 -o compare_check cuda/lab/compare_check.cpp && ./compare_check
//
// Exit status: 0 when the comparison gives every verdict it should, 1 otherwise (test/lab.test.js).
#include <cstdio>

#include "compare.h"

int main() {
  const std::vector<std::string> problems = accordion::lab::comparisonSelfCheck();
  for (const std::string& p : problems) std::printf("FAILED %s\n", p.c_str());
  if (!problems.empty()) return 1;
  std::printf("the lab's comparison fails unwritten, NaN and Inf outputs and keeps NaN errors\n");
  return 0;
}
