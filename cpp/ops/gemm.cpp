// General row-major GEMM: C (m, n) = op(A)·op(B) (+ C), in fp32 (ops/cpu_sgemm.h). In bf16
// (BackendOptions::compute) A and B are rounded to bf16 and the products summed in fp32: oneDNN's
// bf16 matmul where the CPU multiplies bf16 itself, else sgemm over the rounded values
// (ops/cpu_bf16.h). Inside a cast scope a parameter B is cast once and its copy kept
// (Backend::beginCastScope).
#include <map>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ops/cpu_backend.h"
#include "ops/cpu_bf16.h"
#include "ops/cpu_sgemm.h"
#include "ops/dnnl_context.h"

namespace accordion {

namespace {

using dnnl::memory;

struct Bf16Matmul {
  dnnl::matmul::primitive_desc desc;
  dnnl::matmul primitive;
};

// One bf16 matmul primitive per shape (creating one costs far more than running it).
Bf16Matmul& bf16Matmul(bool transA, bool transB, int64_t m, int64_t n, int64_t k, bool accumulate) {
  thread_local std::map<std::tuple<bool, bool, int64_t, int64_t, int64_t, bool>, Bf16Matmul> made;
  auto key = std::make_tuple(transA, transB, m, n, k, accumulate);
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  using tag = memory::format_tag;
  const memory::desc a({m, k}, memory::data_type::bf16, transA ? tag::ba : tag::ab), b({k, n}, memory::data_type::bf16, transB ? tag::ba : tag::ab),
      c({m, n}, memory::data_type::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    attr.set_post_ops(sum);
  }
  dnnl::matmul::primitive_desc desc(dnnl::matmul::desc(a, b, c), attr, cpuEngine());
  return made.emplace(key, Bf16Matmul{desc, dnnl::matmul(desc)}).first->second;
}

}  // namespace

template <class T>
const T* CpuBackend::castOperand(const float* b, int64_t count) {
  const auto cast = [](const float* x, T* y, int64_t n) {
    if constexpr (std::is_same_v<T, uint16_t>) encodeBf16(x, y, n);
    else roundToBf16(x, y, n);
  };
  if (auto* c = casts_.kept(b, count)) {
    std::vector<T>& copy = [c]() -> std::vector<T>& {
      if constexpr (std::is_same_v<T, uint16_t>) return c->copy.bf16;
      else return c->copy.rounded;
    }();
    if (!c->valid) {
      copy.resize(static_cast<size_t>(count));
      cast(b, copy.data(), count);
      c->valid = true;
    }
    return copy.data();
  }
  thread_local std::vector<T> scratch;
  scratch.resize(static_cast<size_t>(count));
  cast(b, scratch.data(), count);
  return scratch.data();
}

void CpuBackend::gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
                      bool accumulate) {
  const int64_t lda = transA ? m : k, ldb = transB ? k : n;
  const float beta = accumulate ? 1.0f : 0.0f;
  if (options.compute != Precision::Bf16) {
    sgemm(transA, transB, m, n, k, a, lda, b, ldb, beta, c);
    return;
  }
  if (cpuBf16Compute() == Bf16Compute::Native) {
    thread_local std::vector<uint16_t> a16;
    a16.resize(static_cast<size_t>(m * k));
    encodeBf16(a, a16.data(), m * k);
    const uint16_t* b16 = castOperand<uint16_t>(b, k * n);
    Bf16Matmul& product = bf16Matmul(transA, transB, m, n, k, accumulate);
    product.primitive.execute(cpuStream(), {{DNNL_ARG_SRC, memory(product.desc.src_desc(), cpuEngine(), a16.data())},
                                            {DNNL_ARG_WEIGHTS, memory(product.desc.weights_desc(), cpuEngine(), const_cast<uint16_t*>(b16))},
                                            {DNNL_ARG_DST, memory(product.desc.dst_desc(), cpuEngine(), c)}});
    return;
  }
  thread_local std::vector<float> a32;
  a32.resize(static_cast<size_t>(m * k));
  roundToBf16(a, a32.data(), m * k);
  sgemm(transA, transB, m, n, k, a32.data(), lda, castOperand<float>(b, k * n), ldb, beta, c);
}

}  // namespace accordion
