// TopK on the GPU: the `count` largest magnitudes of a = g + e per tensor, for every tensor of a step
// at once, in linear time, and the average of every worker's (index, value) pairs.
//
// Radix select on the 31 magnitude bits (for non-negative floats the IEEE bits order like the
// values): three passes histogram one digit (bits 30–20, 19–9, 8–0) of the keys that match the digits
// chosen so far; after each, one block per tensor picks the digit holding the count-th largest key.
// The threshold key is then exact, with `need` = how many keys equal to it are kept (the lowest
// indices). The gather counts winners per chunk, turns the counts into offsets per tensor, and writes
// each chunk's winners at its offset in index order through a block scan: the same output, bit for
// bit, as the CPU's selectTopK.
#include <cub/block/block_scan.cuh>

#include <string>

#include "ops/cuda_compression_kernels.h"
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

constexpr int kDigitBits = 11, kBins = 1 << kDigitBits;
// The passes: shift and width of each digit of the 31-bit key.
constexpr int kPasses = 3;
constexpr int kShifts[kPasses] = {20, 9, 0};
constexpr int kWidths[kPasses] = {11, 11, 9};

struct TopKEntry {
  float* grad;
  float* memory;  // a = g + e after the first pass
  float* send;    // (2·count): indices (int32 bits), then values
  int64_t size, count;
  int64_t firstChunk;  // of this tensor's chunks among all chunks of the step
  int64_t packed;
};

// The digits chosen so far: keys k with (k & mask) == prefix are still candidates, and `need` of
// them are kept.
struct SelectState {
  uint32_t prefix, mask;
  int64_t need;
};

// Winners of a chunk, or before it: greater than the threshold, and equal to it.
struct Counts {
  int32_t greater, equal;
  __device__ Counts operator+(const Counts& o) const { return {greater + o.greater, equal + o.equal}; }
};

struct AddCounts {
  __device__ Counts operator()(const Counts& a, const Counts& b) const { return a + b; }
};

__device__ __forceinline__ uint32_t magnitudeKey(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

__global__ void initStates(const TopKEntry* tensors, int count, SelectState* states) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < count) states[t] = {0u, 0u, tensors[t].count};
}

// One digit's histogram of the candidate keys of each tensor, per chunk in shared memory, then added
// into the tensor's global bins. The first pass also forms a = g + e (kept in e).
template <bool kFeedback>
__global__ void __launch_bounds__(kThreads) histogramKernel(const TopKEntry* tensors, const TensorChunk* chunks, const SelectState* states,
                                                            uint32_t* histograms, int shift, uint32_t digitMask) {
  __shared__ uint32_t bins[kBins];
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) bins[b] = 0;
  __syncthreads();
  const TensorChunk chunk = chunks[blockIdx.x];
  const TopKEntry t = tensors[chunk.tensor];
  const SelectState state = states[chunk.tensor];
  auto count = [&](float a) {
    const uint32_t key = magnitudeKey(a);
    if ((key & state.mask) == state.prefix) atomicAdd(&bins[(key >> shift) & digitMask], 1u);
  };
  forEachInChunk(
      t.size, chunk.chunk, t.packed,
      [&](int64_t p) {
        Pack<float, 4> a = loadPack<4>(static_cast<const float*>(t.memory), p);
        if (kFeedback) {
          const Pack<float, 4> g = loadPack<4>(static_cast<const float*>(t.grad), p);
#pragma unroll
          for (int l = 0; l < 4; ++l) a.v[l] += g.v[l];
          storePack<4>(t.memory, p, a);
        }
#pragma unroll
        for (int l = 0; l < 4; ++l) count(a.v[l]);
      },
      [&](int64_t i) {
        float a = t.memory[i];
        if (kFeedback) {
          a += t.grad[i];
          t.memory[i] = a;
        }
        count(a);
      });
  __syncthreads();
  uint32_t* global = histograms + int64_t{chunk.tensor} * kBins;
  for (int b = threadIdx.x; b < kBins; b += blockDim.x)
    if (bins[b]) atomicAdd(&global[b], bins[b]);
}

// One block per tensor: the digit (from the top) whose bin holds the need-th largest candidate; the
// keys in higher bins are all kept. Clears the tensor's bins for the next pass.
__global__ void __launch_bounds__(kThreads) chooseDigit(SelectState* states, uint32_t* histograms, int shift, int width) {
  constexpr int kPerThread = kBins / kThreads;
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage scanStorage;
  uint32_t* bins = histograms + int64_t{blockIdx.x} * kBins;
  SelectState& state = states[blockIdx.x];
  const int used = 1 << width;
  // Thread t holds bins used−1−(t·kPerThread) downwards: a scan in thread order runs from the top.
  int64_t local[kPerThread];
  int64_t sum = 0;
#pragma unroll
  for (int s = 0; s < kPerThread; ++s) {
    const int b = used - 1 - (threadIdx.x * kPerThread + s);
    local[s] = b >= 0 ? bins[b] : 0;
    sum += local[s];
  }
  int64_t above = 0;
  Scan(scanStorage).ExclusiveSum(sum, above);
  const int64_t need = state.need;
  __syncthreads();  // every thread has read `state` before one of them updates it
  if (above < need && above + sum >= need) {
    for (int s = 0; s < kPerThread; ++s) {
      if (above + local[s] >= need) {
        const uint32_t digit = static_cast<uint32_t>(used - 1 - (threadIdx.x * kPerThread + s));
        state.prefix |= digit << shift;
        state.mask |= static_cast<uint32_t>(used - 1) << shift;
        state.need = need - above;
        break;
      }
      above += local[s];
    }
  }
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) bins[b] = 0;
}

// Winners per chunk: keys above the threshold, and keys equal to it.
__global__ void __launch_bounds__(kThreads) countWinners(const TopKEntry* tensors, const TensorChunk* chunks, const SelectState* states,
                                                         Counts* counts) {
  const TensorChunk chunk = chunks[blockIdx.x];
  const TopKEntry t = tensors[chunk.tensor];
  const uint32_t threshold = states[chunk.tensor].prefix;
  Counts mine{0, 0};
  forEachInChunk(
      t.size, chunk.chunk, false, [](int64_t) {},
      [&](int64_t i) {
        const uint32_t key = magnitudeKey(t.memory[i]);
        mine.greater += key > threshold;
        mine.equal += key == threshold;
      });
  mine = blockReduce(mine, AddCounts{}, Counts{0, 0});
  if (threadIdx.x == 0) counts[t.firstChunk + chunk.chunk] = mine;
}

// One block per tensor: the counts of its chunks, in chunk order, become exclusive prefix sums.
__global__ void __launch_bounds__(kThreads) chunkOffsets(const TopKEntry* tensors, Counts* counts) {
  using Scan = cub::BlockScan<Counts, kThreads>;
  __shared__ typename Scan::TempStorage scanStorage;
  const TopKEntry t = tensors[blockIdx.x];
  const int64_t chunkCount = (t.size + kChunkElements - 1) / kChunkElements;
  Counts carry{0, 0};
  for (int64_t base = 0; base < chunkCount; base += kThreads) {
    const int64_t c = base + threadIdx.x;
    const Counts mine = c < chunkCount ? counts[t.firstChunk + c] : Counts{0, 0};
    Counts before, total;
    Scan(scanStorage).ExclusiveScan(mine, before, Counts{0, 0}, AddCounts{}, total);
    __syncthreads();  // the scan's storage is reused by the next tile
    if (c < chunkCount) counts[t.firstChunk + c] = carry + before;
    carry = carry + total;
  }
}

// Each chunk's winners in index order at its offset: indices and values into `send`, zero into e.
__global__ void __launch_bounds__(kThreads) gatherWinners(const TopKEntry* tensors, const TensorChunk* chunks, const SelectState* states,
                                                          const Counts* offsets) {
  using Scan = cub::BlockScan<Counts, kThreads>;
  __shared__ typename Scan::TempStorage scanStorage;
  const TensorChunk chunk = chunks[blockIdx.x];
  const TopKEntry t = tensors[chunk.tensor];
  const SelectState state = states[chunk.tensor];
  const int64_t equalToTake = state.need;
  Counts carry = offsets[t.firstChunk + chunk.chunk];
  const int64_t begin = int64_t{chunk.chunk} * kChunkElements;
  const int64_t end = min(t.size, begin + kChunkElements);
  for (int64_t base = begin; base < end; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const float a = i < end ? t.memory[i] : 0.0f;
    const uint32_t key = i < end ? magnitudeKey(a) : 0u;
    const Counts mine{i < end && key > state.prefix, i < end && key == state.prefix};
    Counts before, total;
    Scan(scanStorage).ExclusiveScan(mine, before, Counts{0, 0}, AddCounts{}, total);
    __syncthreads();
    const int64_t greaterBefore = carry.greater + before.greater, equalBefore = carry.equal + before.equal;
    if (mine.greater || (mine.equal && equalBefore < equalToTake)) {
      const int64_t out = greaterBefore + min(equalBefore, equalToTake);
      t.send[out] = __int_as_float(static_cast<int32_t>(i));  // indices travel as raw bits
      t.send[t.count + out] = a;
      t.memory[i] = 0.0f;  // e = a − sparse(a)
    }
    carry = carry + total;
  }
}

struct ZeroEntry {
  float* data;
  int64_t size;
  int64_t packed;
};

__global__ void __launch_bounds__(kThreads) zeroKernel(const ZeroEntry* tensors, const TensorChunk* chunks) {
  const TensorChunk chunk = chunks[blockIdx.x];
  const ZeroEntry t = tensors[chunk.tensor];
  forEachInChunk(
      t.size, chunk.chunk, t.packed, [&](int64_t p) { storePack<4>(t.data, p, Pack<float, 4>{{0.0f, 0.0f, 0.0f, 0.0f}}); },
      [&](int64_t i) { t.data[i] = 0.0f; });
}

// One worker's pairs added into the gradients: its indices are distinct within a tensor, so no two
// threads of the launch touch one element.
struct ScatterEntry {
  float* grad;
  int64_t offset;  // of the tensor's pairs in a worker's block
  int64_t size;    // count
};

__global__ void __launch_bounds__(kThreads) scatterKernel(const ScatterEntry* tensors, const TensorChunk* chunks, const float* block,
                                                          float scale) {
  const TensorChunk chunk = chunks[blockIdx.x];
  const ScatterEntry t = tensors[chunk.tensor];
  const float* indices = block + t.offset;
  const float* values = indices + t.size;
  forEachInChunk(
      t.size, chunk.chunk, false, [](int64_t) {},
      [&](int64_t j) { t.grad[__float_as_int(indices[j])] += values[j] * scale; });
}

}  // namespace

void CudaCompressionKernels::topKSelect(const std::vector<TopKTensor>& tensors) {
  if (tensors.empty()) return;
  std::vector<TopKEntry> table;
  int64_t chunkCount = 0;
  for (const TopKTensor& t : tensors) {
    if (t.size > INT32_MAX) throw invalidArgument("TopK: a tensor of " + std::to_string(t.size) + " elements exceeds the int32 indices");
    table.push_back({t.grad, t.memory, t.send, t.size, t.count, chunkCount, packable(t.grad) && packable(t.memory)});
    chunkCount += (t.size + kChunkElements - 1) / kChunkElements;
  }
  const int count = static_cast<int>(tensors.size());
  // Scratch: the bins of every tensor, then the states, then the per-chunk counts.
  const size_t binBytes = static_cast<size_t>(count) * kBins * sizeof(uint32_t);
  const size_t stateBytes = static_cast<size_t>(count) * sizeof(SelectState);
  auto* scratch = backend_.scratch<char>(topKScratch_, topKScratchBytes_, binBytes + stateBytes + chunkCount * sizeof(Counts));
  auto* bins = reinterpret_cast<uint32_t*>(scratch);
  auto* states = reinterpret_cast<SelectState*>(scratch + binBytes);
  auto* counts = reinterpret_cast<Counts*>(scratch + binBytes + stateBytes);
  check(cudaMemsetAsync(bins, 0, binBytes, backend_.stream()), "cudaMemsetAsync");

  const cudaStream_t stream = backend_.stream();
  const TopKEntry* deviceTable = nullptr;
  for (int pass = 0; pass < kPasses; ++pass) {
    const uint32_t digitMask = (1u << kWidths[pass]) - 1;
    if (pass == 0) {
      deviceTable = static_cast<const TopKEntry*>(backend_.deviceTable(table.data(), table.size() * sizeof(TopKEntry)));
      initStates<<<(count + kThreads - 1) / kThreads, kThreads, 0, stream>>>(deviceTable, count, states);
      checkLaunch("TopK selection");
      launchMultiTensor(backend_, "TopK selection", histogramKernel<true>, table, static_cast<const SelectState*>(states), bins,
                        kShifts[pass], digitMask);
    } else {
      launchMultiTensor(backend_, "TopK selection", histogramKernel<false>, table, static_cast<const SelectState*>(states), bins,
                        kShifts[pass], digitMask);
    }
    chooseDigit<<<count, kThreads, 0, stream>>>(states, bins, kShifts[pass], kWidths[pass]);
    checkLaunch("TopK selection");
  }
  launchMultiTensor(backend_, "TopK selection", countWinners, table, static_cast<const SelectState*>(states), counts);
  chunkOffsets<<<count, kThreads, 0, stream>>>(deviceTable, counts);
  checkLaunch("TopK selection");
  launchMultiTensor(backend_, "TopK selection", gatherWinners, table, static_cast<const SelectState*>(states),
                    static_cast<const Counts*>(counts));
}

void CudaCompressionKernels::topKCombine(const std::vector<TopKTensor>& tensors, const float* gathered, int world, int64_t perWorker,
                                         float scale) {
  std::vector<ZeroEntry> grads;
  std::vector<ScatterEntry> pairs;
  for (const TopKTensor& t : tensors) {
    grads.push_back({t.grad, t.size, packable(t.grad)});
    pairs.push_back({t.grad, t.offset, t.count});
  }
  launchMultiTensor(backend_, "TopK average", zeroKernel, grads);
  for (int w = 0; w < world; ++w) launchMultiTensor(backend_, "TopK average", scatterKernel, pairs, gathered + w * perWorker, scale);
}

}  // namespace accordion::cuda
