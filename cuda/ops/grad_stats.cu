// Per-parameter statistics of the gradients: the NaN/Inf check before an update, and the epoch sums
// and squared norms behind Accordion's decisions. Each is one multi-tensor launch over the whole
// list (kernels.cuh), reading every element once:
//   findNonFinite  a memset, the scan (atomicMin of the tensor index), a one-thread conversion to
//                  the double the caller downloads; no wait.
//   accumulate     sums[i] += values[i] in place.
//   sumsOfSquares  Σ x² per chunk in double into scratch, then one block per tensor adds its chunks'
//                  partials in a fixed order (deterministic); the host waits for the result.
//   clipTotalNorm  the same sums, added in list order by one thread that finds the clip factor,
//                  then every tensor scaled by it: no wait.
#include <climits>

#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

struct ReadTensor {
  const float* data;
  int64_t size;
  int64_t packed;
};

struct ReadTensorWithPartials {
  const float* data;
  int64_t size;
  int64_t packed;
  int64_t firstChunk;  // its chunks' partial sums start here
};

struct ScaledTensor {
  float* data;
  int64_t size;
  int64_t packed;
};

struct SumTensor {
  float* sum;
  const float* value;
  int64_t size;
  int64_t packed;
};

__device__ __forceinline__ bool nonFinite(float v) { return !isfinite(v); }

// The lowest index of a tensor with a NaN or Inf, by atomicMin on the 8 bytes of *firstBad, which
// hold an index (ULLONG_MAX: none) until declareFirstBad() turns them into the double the caller
// reads.
__global__ void __launch_bounds__(kThreads) findFirstBad(const ReadTensor* tensors, const TensorChunk* chunks,
                                                         unsigned long long* firstBad) {
  const TensorChunk chunk = chunks[blockIdx.x];
  const ReadTensor t = tensors[chunk.tensor];
  bool bad = false;
  forEachInChunk(
      t.size, chunk.chunk, t.packed,
      [&](int64_t i) {
        const Pack<float, 4> v = loadPack<4>(t.data, i);
        bad = bad || nonFinite(v.v[0]) || nonFinite(v.v[1]) || nonFinite(v.v[2]) || nonFinite(v.v[3]);
      },
      [&](int64_t i) { bad = bad || nonFinite(t.data[i]); });
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicMin(firstBad, static_cast<unsigned long long>(chunk.tensor));
}

__global__ void declareFirstBad(double* firstBad) {
  const unsigned long long index = *reinterpret_cast<const unsigned long long*>(firstBad);
  *firstBad = index == ULLONG_MAX ? 0.0 : static_cast<double>(index + 1);
}

__global__ void __launch_bounds__(kThreads) accumulateKernel(const SumTensor* tensors, const TensorChunk* chunks) {
  const TensorChunk chunk = chunks[blockIdx.x];
  const SumTensor t = tensors[chunk.tensor];
  forEachInChunk(
      t.size, chunk.chunk, t.packed,
      [&](int64_t i) {
        Pack<float, 4> sum = loadPack<4>(t.sum, i);
        const Pack<float, 4> v = loadPack<4>(t.value, i);
#pragma unroll
        for (int l = 0; l < 4; ++l) sum.v[l] += v.v[l];
        storePack<4>(t.sum, i, sum);
      },
      [&](int64_t i) { t.sum[i] += t.value[i]; });
}

struct AddDoubles {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// Σ x² of each chunk, in double, into partials[chunk].
__global__ void __launch_bounds__(kThreads) chunkSquares(const ReadTensorWithPartials* tensors, const TensorChunk* chunks,
                                                         double* partials) {
  const TensorChunk chunk = chunks[blockIdx.x];
  const ReadTensorWithPartials t = tensors[chunk.tensor];
  double sum = 0.0;
  forEachInChunk(
      t.size, chunk.chunk, t.packed,
      [&](int64_t i) {
        const Pack<float, 4> v = loadPack<4>(t.data, i);
#pragma unroll
        for (int l = 0; l < 4; ++l) sum += static_cast<double>(v.v[l]) * v.v[l];
      },
      [&](int64_t i) { sum += static_cast<double>(t.data[i]) * t.data[i]; });
  sum = blockReduce(sum, AddDoubles{}, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// One block per tensor: the sum of its chunks' partials, in a fixed order.
__global__ void __launch_bounds__(kThreads) tensorSquares(const ReadTensorWithPartials* tensors, const double* partials, double* sums) {
  const ReadTensorWithPartials t = tensors[blockIdx.x];
  const int64_t chunks = (t.size + kChunkElements - 1) / kChunkElements;
  double sum = 0.0;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) sum += partials[t.firstChunk + c];
  sum = blockReduce(sum, AddDoubles{}, 0.0);
  if (threadIdx.x == 0) sums[blockIdx.x] = sum;
}

// clip_grad_norm_'s factor: maxNorm / (norm + 1e-6) where the norm (√ of the tensors' sums, added
// in list order) is above maxNorm, else 1 (a NaN norm included).
__global__ void clipFactor(const double* sums, int64_t count, double maxNorm, float* factor) {
  double total = 0.0;
  for (int64_t k = 0; k < count; ++k) total += sums[k];
  const double norm = sqrt(total);
  *factor = norm > maxNorm ? static_cast<float>(maxNorm / (norm + 1e-6)) : 1.0f;
}

__global__ void __launch_bounds__(kThreads) scaleByFactor(const ScaledTensor* tensors, const TensorChunk* chunks, const float* factor) {
  const float f = *factor;
  if (f == 1.0f) return;
  const TensorChunk chunk = chunks[blockIdx.x];
  const ScaledTensor t = tensors[chunk.tensor];
  forEachInChunk(
      t.size, chunk.chunk, t.packed,
      [&](int64_t i) {
        Pack<float, 4> v = loadPack<4>(t.data, i);
#pragma unroll
        for (int l = 0; l < 4; ++l) v.v[l] *= f;
        storePack<4>(t.data, i, v);
      },
      [&](int64_t i) { t.data[i] *= f; });
}

// Enqueues Σ x² of each tensor into device doubles, returned (nullptr when the tensors hold no
// element), with one spare double after them; `scratch` holds them and the chunks' partials.
double* squaresOnDevice(CudaBackend& backend, const std::vector<ConstSpan>& tensors, std::shared_ptr<void>& scratch) {
  std::vector<ReadTensorWithPartials> table;
  table.reserve(tensors.size());
  int64_t chunks = 0;
  for (const ConstSpan& t : tensors) {
    table.push_back({t.data, t.size, packable(t.data), chunks});
    chunks += (t.size + kChunkElements - 1) / kChunkElements;
  }
  if (chunks == 0) return nullptr;
  scratch = backend.allocate(static_cast<size_t>(chunks + static_cast<int64_t>(tensors.size()) + 1) * sizeof(double));
  auto* partials = static_cast<double*>(scratch.get());
  double* sums = partials + chunks;
  const ReadTensorWithPartials* deviceTensors = launchMultiTensor(backend, "sumsOfSquares", chunkSquares, table, partials);
  tensorSquares<<<static_cast<unsigned>(tensors.size()), kThreads, 0, backend.stream()>>>(deviceTensors, partials, sums);
  checkLaunch("sumsOfSquares");
  return sums;
}

}  // namespace

void CudaBackend::findNonFinite(const std::vector<ConstSpan>& tensors, double* firstBad) {
  std::vector<ReadTensor> table;
  table.reserve(tensors.size());
  for (const ConstSpan& t : tensors) table.push_back({t.data, t.size, packable(t.data)});
  check(cudaMemsetAsync(firstBad, 0xFF, sizeof(double), stream()), "cudaMemsetAsync");
  launchMultiTensor(*this, "findNonFinite", findFirstBad, table, reinterpret_cast<unsigned long long*>(firstBad));
  declareFirstBad<<<1, 1, 0, stream()>>>(firstBad);
  checkLaunch("findNonFinite");
}

void CudaBackend::accumulate(const std::vector<Span>& sums, const std::vector<ConstSpan>& values) {
  if (sums.size() != values.size()) throw invalidArgument("accumulate: " + std::to_string(sums.size()) + " sums for " +
                                                          std::to_string(values.size()) + " tensors");
  std::vector<SumTensor> table;
  table.reserve(sums.size());
  for (size_t k = 0; k < sums.size(); ++k) {
    if (sums[k].size != values[k].size)
      throw invalidArgument("accumulate: tensor " + std::to_string(k) + " has " + std::to_string(values[k].size) + " elements, its sum " +
                            std::to_string(sums[k].size));
    table.push_back({sums[k].data, values[k].data, sums[k].size, packable(sums[k].data) && packable(values[k].data)});
  }
  launchMultiTensor(*this, "accumulate", accumulateKernel, table);
}

std::vector<double> CudaBackend::sumsOfSquares(const std::vector<ConstSpan>& tensors) {
  std::vector<double> result(tensors.size(), 0.0);
  std::shared_ptr<void> scratch;
  const double* sums = squaresOnDevice(*this, tensors, scratch);
  if (!sums) return result;
  download(result.data(), sums, result.size() * sizeof(double));
  synchronize();
  return result;
}

void CudaBackend::clipTotalNorm(const std::vector<Span>& tensors, double maxNorm) {
  std::vector<ConstSpan> read;
  std::vector<ScaledTensor> table;
  for (const Span& t : tensors) {
    read.push_back({t.data, t.size});
    table.push_back({t.data, t.size, packable(t.data)});
  }
  std::shared_ptr<void> scratch;  // freed in stream order: the kernels below still read it
  double* sums = squaresOnDevice(*this, read, scratch);
  if (!sums) return;
  auto* factor = reinterpret_cast<float*>(sums + tensors.size());
  clipFactor<<<1, 1, 0, stream()>>>(sums, static_cast<int64_t>(tensors.size()), maxNorm, factor);
  checkLaunch("clipFactor");
  launchMultiTensor(*this, "clipTotalNorm", scaleByFactor, table, static_cast<const float*>(factor));
}

}  // namespace accordion::cuda
