// Embedding: rows of a table gathered by token id, and the gradient added back.
//
// Backward is deterministic without float atomics: the host (which has the ids) groups the
// positions by token, in increasing position order, and one block per distinct token adds its
// positions' rows in that order, each thread owning columns of the token's row: the same additions
// in the same order as the CPU.
#include <algorithm>
#include <numeric>
#include <vector>

#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

__global__ void gatherRows(const float* __restrict__ table, const int32_t* __restrict__ ids, float* __restrict__ y, int64_t rows,
                           int64_t width) {
  const int64_t n = rows * width, stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / width, column = i - r * width;
    y[i] = table[int64_t{ids[r]} * width + column];
  }
}

// groups: tokens[distinct], starts[distinct + 1], positions[rows], one after the other.
__global__ void addTokenRows(const float* __restrict__ dy, const int32_t* __restrict__ groups, int64_t distinct,
                             float* __restrict__ dTable, int64_t width) {
  const int32_t* tokens = groups;
  const int32_t* starts = groups + distinct;
  const int32_t* positions = starts + distinct + 1;
  const int64_t token = tokens[blockIdx.x];
  const int32_t begin = starts[blockIdx.x], end = starts[blockIdx.x + 1];
  for (int64_t column = threadIdx.x; column < width; column += blockDim.x) {
    float sum = dTable[token * width + column];
    for (int32_t p = begin; p < end; ++p) sum += dy[int64_t{positions[p]} * width + column];
    dTable[token * width + column] = sum;
  }
}

}  // namespace

void CudaBackend::embeddingForward(const float* table, const int32_t* ids, float* y, int64_t rows, int64_t width) {
  if (rows <= 0 || width <= 0) return;
  gatherRows<<<blocksFor(rows * width), kThreads, 0, stream()>>>(table, ids, y, rows, width);
  checkLaunch("embeddingForward");
}

void CudaBackend::embeddingBackward(const float* dy, const int32_t* hostIds, float* dTable, int64_t rows, int64_t width) {
  if (rows <= 0 || width <= 0) return;
  if (rows > INT32_MAX) throw invalidArgument("embeddingBackward: " + std::to_string(rows) + " rows exceed the int32 positions");
  std::vector<int32_t> order(static_cast<size_t>(rows));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return hostIds[a] < hostIds[b]; });
  std::vector<int32_t> tokens, starts;
  for (int32_t i = 0; i < static_cast<int32_t>(rows); ++i)
    if (i == 0 || hostIds[order[i]] != hostIds[order[i - 1]]) {
      tokens.push_back(hostIds[order[i]]);
      starts.push_back(i);
    }
  starts.push_back(static_cast<int32_t>(rows));
  const int64_t distinct = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> groups;
  groups.reserve(tokens.size() + starts.size() + order.size());
  groups.insert(groups.end(), tokens.begin(), tokens.end());
  groups.insert(groups.end(), starts.begin(), starts.end());
  groups.insert(groups.end(), order.begin(), order.end());
  int32_t* deviceGroups = scratch<int32_t>(embeddingGroups_, embeddingGroupsBytes_, static_cast<int64_t>(groups.size()));
  upload(deviceGroups, groups.data(), groups.size() * sizeof(int32_t));
  addTokenRows<<<static_cast<unsigned>(distinct), kThreads, 0, stream()>>>(dy, deviceGroups, distinct, dTable, width);
  checkLaunch("embeddingBackward");
}

}  // namespace accordion::cuda
