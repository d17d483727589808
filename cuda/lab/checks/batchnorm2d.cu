// The kernel lab's checks: batch norm.
#include "lab/lab.h"

namespace accordion::lab {

// Activations with a mean and spread of their own per channel, as after a convolution, so the batch
// statistics are of order one rather than noise around zero.
std::vector<float> channelActivations(RandomInputs& random, const Dims& d) {
  std::vector<float> x = random.normal(d.numel());
  const std::vector<float> mean = random.normal(d.c), spread = random.positive(d.c);
  const int64_t plane = d.h * d.w;
  for (int64_t i = 0; i < d.numel(); ++i) {
    const size_t c = static_cast<size_t>(i / plane % d.c);
    x[static_cast<size_t>(i)] = mean[c] + spread[c] * x[static_cast<size_t>(i)];
  }
  return x;
}

struct ChannelStatistics {
  std::vector<float> mean, var;  // var biased, as batch norm normalises with
};

// The batch statistics of an NCHW tensor, in double (two passes).
ChannelStatistics statisticsOf(const std::vector<float>& x, const Dims& d) {
  const int64_t plane = d.h * d.w;
  const double count = static_cast<double>(d.n * plane);
  std::vector<double> sum(static_cast<size_t>(d.c)), squares(static_cast<size_t>(d.c));
  for (int64_t i = 0; i < d.numel(); ++i) sum[static_cast<size_t>(i / plane % d.c)] += x[static_cast<size_t>(i)];
  for (int64_t i = 0; i < d.numel(); ++i) {
    const size_t c = static_cast<size_t>(i / plane % d.c);
    const double centred = x[static_cast<size_t>(i)] - sum[c] / count;
    squares[c] += centred * centred;
  }
  ChannelStatistics stats;
  for (size_t c = 0; c < sum.size(); ++c) {
    stats.mean.push_back(static_cast<float>(sum[c] / count));
    stats.var.push_back(static_cast<float>(squares[c] / count));
  }
  return stats;
}

// Gradients that depend on x̂ (half a per-channel multiple of it, plus half a per-channel offset,
// plus noise), so that mean(dy) and mean(dy·x̂), the terms through the batch statistics, are of
// order one: a backward that dropped or botched them fails by far more than the tolerance, as it
// would not against pure noise, where they are ~1/√(N·H·W).
std::vector<float> correlatedGradient(RandomInputs& random, const std::vector<float>& x, const Dims& d, const ChannelStatistics& stats,
                                      float eps) {
  std::vector<float> dy = random.normal(d.numel());
  const std::vector<float> slope = random.normal(d.c, 0, 0.5f), offset = random.normal(d.c, 0, 0.5f);
  const int64_t plane = d.h * d.w;
  for (int64_t i = 0; i < d.numel(); ++i) {
    const size_t c = static_cast<size_t>(i / plane % d.c), at = static_cast<size_t>(i);
    const float normalised = (x[at] - stats.mean[c]) / std::sqrt(stats.var[c] + eps);
    dy[at] += slope[c] * normalised + offset[c];
  }
  return dy;
}

// Batch norm in float64 on the host, NCHW: the reference of the training forward and of the
// backward (kBatchNorm), whatever the CPU's thread count. Channels are computed in parallel, each
// in a fixed order.
struct BatchNormForward {
  std::vector<float> y, batchMean, batchVar, runningMean, runningVar;
};

BatchNormForward batchNormForwardReference(const std::vector<float>& x, const Dims& d, const std::vector<float>& gamma,
                                           const std::vector<float>& beta, std::vector<float> runningMean,
                                           std::vector<float> runningVar, const BatchNormSpec& spec) {
  const int64_t plane = d.h * d.w, count = d.n * plane;
  const double momentum = spec.momentum, unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  BatchNormForward out{std::vector<float>(x.size()), std::vector<float>(static_cast<size_t>(d.c)),
                       std::vector<float>(static_cast<size_t>(d.c)), std::move(runningMean), std::move(runningVar)};
  parallelFor(d.c, [&](int64_t c) {
    auto at = [&](int64_t n, int64_t p) { return static_cast<size_t>((n * d.c + c) * plane + p); };
    double sum = 0;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < plane; ++p) sum += x[at(n, p)];
    const double mean = sum / static_cast<double>(count);
    double squares = 0;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < plane; ++p) squares += (x[at(n, p)] - mean) * (x[at(n, p)] - mean);
    const double var = squares / static_cast<double>(count), scale = gamma[c] / std::sqrt(var + spec.eps);
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < plane; ++p) out.y[at(n, p)] = static_cast<float>((x[at(n, p)] - mean) * scale + beta[c]);
    const size_t k = static_cast<size_t>(c);
    out.batchMean[k] = static_cast<float>(mean);
    out.batchVar[k] = static_cast<float>(var);
    out.runningMean[k] = static_cast<float>((1 - momentum) * out.runningMean[k] + momentum * mean);
    out.runningVar[k] = static_cast<float>((1 - momentum) * out.runningVar[k] + momentum * var * unbias);
  });
  return out;
}

struct BatchNormBackward {
  std::vector<float> dx, dGamma, dBeta;
};

// dβ = Σdy, dγ = Σdy·x̂ with x̂ = (x − mean)/√(var + eps); dx = γ/√(var + eps)·(dy − dβ/M − x̂·dγ/M)
// when mean and var are the batch's statistics (M values per channel), γ/√(var + eps)·dy when they
// are constants.
BatchNormBackward batchNormBackwardReference(const std::vector<float>& x, const std::vector<float>& dy, const Dims& d,
                                             const std::vector<float>& gamma, const std::vector<float>& mean,
                                             const std::vector<float>& var, float eps, bool batchStatistics) {
  const int64_t plane = d.h * d.w;
  const double count = static_cast<double>(d.n * plane);
  BatchNormBackward out{std::vector<float>(x.size()), std::vector<float>(static_cast<size_t>(d.c)),
                        std::vector<float>(static_cast<size_t>(d.c))};
  parallelFor(d.c, [&](int64_t c) {
    auto at = [&](int64_t n, int64_t p) { return static_cast<size_t>((n * d.c + c) * plane + p); };
    const size_t k = static_cast<size_t>(c);
    const double invStd = 1 / std::sqrt(static_cast<double>(var[k]) + eps), mu = mean[k];
    double sumDy = 0, sumDyXhat = 0;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < plane; ++p) {
        sumDy += dy[at(n, p)];
        sumDyXhat += dy[at(n, p)] * (x[at(n, p)] - mu) * invStd;
      }
    const double scale = gamma[k] * invStd;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < plane; ++p) {
        const double g = dy[at(n, p)], xHat = (x[at(n, p)] - mu) * invStd;
        out.dx[at(n, p)] = static_cast<float>(batchStatistics ? scale * (g - sumDy / count - xHat * sumDyXhat / count) : scale * g);
      }
    out.dGamma[k] = static_cast<float>(sumDyXhat);
    out.dBeta[k] = static_cast<float>(sumDy);
  });
  return out;
}

// The references of a batch norm with its ReLU fused (BatchNormSpec::relu), training: y = max(0, the
// float64 forward), and the backward of dy through the ReLU as the op's own forward output `got`
// decided it (a value within rounding of zero may fall on either side), with the batch statistics.
struct FusedReluReference {
  std::vector<float> y;
  BatchNormBackward backward;
};

FusedReluReference fusedReluReference(const std::vector<float>& x, const std::vector<float>& dy, const std::vector<float>& got,
                                      const Dims& d, const std::vector<float>& gamma, const std::vector<float>& beta,
                                      const std::vector<float>& runningMean, const std::vector<float>& runningVar,
                                      const BatchNormSpec& spec) {
  const BatchNormForward forward = batchNormForwardReference(x, d, gamma, beta, runningMean, runningVar, spec);
  std::vector<float> y = forward.y, masked = dy;
  for (size_t i = 0; i < y.size(); ++i) {
    y[i] = std::max(y[i], 0.0f);
    if (!(got[i] > 0.0f)) masked[i] = 0.0f;
  }
  return {y, batchNormBackwardReference(x, masked, d, gamma, forward.batchMean, forward.batchVar, spec.eps, true)};
}

void checkBatchNorm2d(Lab& lab) {
  // Odd shapes (a single value per channel and image, a batch of one), every batch norm of
  // ResNet-18 and VGG-19 at batch 128, and 256 MiB for bandwidth.
  const Dims shapes[] = {{1, 3, 5, 5},     {3, 7, 1, 1},    {3, 5, 7, 9},    {128, 64, 32, 32}, {128, 128, 16, 16},
                         {128, 256, 8, 8}, {128, 512, 4, 4}, {128, 512, 2, 2}, {256, 64, 64, 64}};
  for (const Dims& d : shapes) {
    const BatchNormSpec spec{d.n, d.c, d.h, d.w};
    const double bytes = 4.0 * d.numel();  // of one x-sized tensor
    auto makeOp = [&] { return TwinOp<BatchNorm2dOp>{lab.cpu.batchNorm2d(spec), lab.gpu.batchNorm2d(spec)}; };
    auto gammaOf = [&] { return lab.input(lab.random.normal(d.c, 1, 0.2f)); };
    auto betaOf = [&] { return lab.input(lab.random.normal(d.c, 0, 0.5f)); };

    // Against the float64 reference: the GPU op alone runs.
    lab.run("batchNorm2d.forwardTraining", d.label(), kBatchNorm, [&](Check& check) {
      std::unique_ptr<BatchNorm2dOp> bn = lab.gpu.batchNorm2d(spec);
      const std::vector<float> xHost = channelActivations(lab.random, d), gammaHost = lab.random.normal(d.c, 1, 0.2f),
                               betaHost = lab.random.normal(d.c, 0, 0.5f), runningMeanHost = lab.random.normal(d.c),
                               runningVarHost = lab.random.positive(d.c);
      Twin<float> x = lab.input(xHost, d), gamma = lab.input(gammaHost), beta = lab.input(betaHost);
      Twin<float> runningMean = lab.input(runningMeanHost), runningVar = lab.input(runningVarHost);
      Twin<float> y = lab.activation(d), batchMean = lab.empty<float>(d.c), batchVar = lab.empty<float>(d.c);
      auto op = [&](Backend& b) {
        bn->forwardTraining(x.on(b), gamma.on(b), beta.on(b), y.on(b), batchMean.on(b), batchVar.on(b), runningMean.on(b),
                            runningVar.on(b));
      };
      lab.onGpu(op, y, batchMean, batchVar);
      const BatchNormForward want = batchNormForwardReference(xHost, d, gammaHost, betaHost, runningMeanHost, runningVarHost, spec);
      compare(check, "y", lab.fromGpu(y), want.y, check.tolerance);
      compare(check, "batchMean", lab.fromGpu(batchMean), want.batchMean, check.tolerance);
      compare(check, "batchVar", lab.fromGpu(batchVar), want.batchVar, check.tolerance);
      compare(check, "runningMean", lab.fromGpu(runningMean), want.runningMean, check.tolerance);
      compare(check, "runningVar", lab.fromGpu(runningVar), want.runningVar, check.tolerance);
      lab.measure(check, op, Work::memory(3 * bytes));  // read x for the statistics and again to normalise, write y
    });
    lab.run("batchNorm2d.forwardInference", d.label(), kFewRoundings, [&](Check& check) {
      TwinOp<BatchNorm2dOp> bn = makeOp();
      Twin<float> x = lab.input(channelActivations(lab.random, d), d), gamma = gammaOf(), beta = betaOf();
      Twin<float> mean = lab.input(lab.random.normal(d.c)), var = lab.input(lab.random.positive(d.c)), y = lab.activation(d);
      auto op = [&](Backend& b) { bn.on(b).forwardInference(x.on(b), gamma.on(b), beta.on(b), mean.on(b), var.on(b), y.on(b)); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(2 * bytes));  // read x, write y
    });
    for (bool batchStatistics : {true, false})
      lab.run("batchNorm2d.backward", d.label() + (batchStatistics ? ", batch statistics" : ", fixed statistics"), kBatchNorm,
              [&](Check& check) {
                std::unique_ptr<BatchNorm2dOp> bn = lab.gpu.batchNorm2d(spec);
                const std::vector<float> xHost = channelActivations(lab.random, d);
                // The forward's statistics of this x, or running ones that are constants here.
                const ChannelStatistics stats =
                    batchStatistics ? statisticsOf(xHost, d) : ChannelStatistics{lab.random.normal(d.c), lab.random.positive(d.c)};
                const std::vector<float> gammaHost = lab.random.normal(d.c, 1, 0.2f), betaHost = lab.random.normal(d.c, 0, 0.5f),
                                         dyHost = correlatedGradient(lab.random, xHost, d, stats, spec.eps);
                Twin<float> x = lab.input(xHost, d), gamma = lab.input(gammaHost), beta = lab.input(betaHost),
                            mean = lab.input(stats.mean), var = lab.input(stats.var), dy = lab.input(dyHost, d);
                Twin<float> dx = lab.activation(d), dGamma = lab.empty<float>(d.c), dBeta = lab.empty<float>(d.c);
                auto op = [&](Backend& b) {
                  bn->backward(x.on(b), dy.on(b), gamma.on(b), beta.on(b), mean.on(b), var.on(b), batchStatistics, dx.on(b),
                               dGamma.on(b), dBeta.on(b));
                };
                lab.onGpu(op, dx, dGamma, dBeta);
                const BatchNormBackward want =
                    batchNormBackwardReference(xHost, dyHost, d, gammaHost, stats.mean, stats.var, spec.eps, batchStatistics);
                compare(check, "dx", lab.fromGpu(dx), want.dx, check.tolerance);
                compare(check, "dGamma", lab.fromGpu(dGamma), want.dGamma, check.tolerance);
                compare(check, "dBeta", lab.fromGpu(dBeta), want.dBeta, check.tolerance);
                // With batch statistics: read x and dy for Σdy and Σdy·x̂, then again to write dx (5
                // passes). With fixed ones, the sums and dx fit one pass (3).
                lab.measure(check, op, Work::memory((batchStatistics ? 5 : 3) * bytes));
              });
    // With the ReLU after it fused, as the models build it: a training forward and its backward.
    lab.run("batchNorm2d.relu", d.label(), kBatchNorm, [&](Check& check) {
      BatchNormSpec fused = spec;
      fused.relu = true;
      std::unique_ptr<BatchNorm2dOp> bn = lab.gpu.batchNorm2d(fused);
      const std::vector<float> xHost = channelActivations(lab.random, d), gammaHost = lab.random.normal(d.c, 1, 0.2f),
                               betaHost = lab.random.normal(d.c, 0, 0.5f), runningMeanHost = lab.random.normal(d.c),
                               runningVarHost = lab.random.positive(d.c), dyHost = lab.random.normal(d.numel());
      Twin<float> x = lab.input(xHost, d), gamma = lab.input(gammaHost), beta = lab.input(betaHost), dy = lab.input(dyHost, d);
      Twin<float> runningMean = lab.input(runningMeanHost), runningVar = lab.input(runningVarHost);
      Twin<float> y = lab.activation(d), batchMean = lab.empty<float>(d.c), batchVar = lab.empty<float>(d.c);
      Twin<float> dx = lab.activation(d), dGamma = lab.empty<float>(d.c), dBeta = lab.empty<float>(d.c);
      auto op = [&](Backend& b) {
        bn->forwardTraining(x.on(b), gamma.on(b), beta.on(b), y.on(b), batchMean.on(b), batchVar.on(b), runningMean.on(b),
                            runningVar.on(b));
        bn->backward(x.on(b), dy.on(b), gamma.on(b), beta.on(b), batchMean.on(b), batchVar.on(b), true, dx.on(b), dGamma.on(b),
                     dBeta.on(b));
      };
      lab.onGpu(op, y, dx, dGamma, dBeta);
      const std::vector<float> gotY = lab.fromGpu(y);
      const FusedReluReference want =
          fusedReluReference(xHost, dyHost, gotY, d, gammaHost, betaHost, runningMeanHost, runningVarHost, spec);
      compare(check, "y", gotY, want.y, check.tolerance);
      compare(check, "dx", lab.fromGpu(dx), want.backward.dx, check.tolerance);
      compare(check, "dGamma", lab.fromGpu(dGamma), want.backward.dGamma, check.tolerance);
      compare(check, "dBeta", lab.fromGpu(dBeta), want.backward.dBeta, check.tolerance);
      lab.measure(check, op, Work::memory(8 * bytes));  // the forward's 3 passes and the backward's 5
    });
  }
}

// The float64 batch-norm reference against the CPU's batch norm (oneDNN) on small shapes, where the
// CPU's float sums are exact to a few roundings: a wrong formula (a sign, the unbiased running
// variance, a missing term) fails by far more than kBatchNorm. Needs no device.
std::vector<std::string> batchNormReferenceSelfCheck() {
  std::vector<std::string> problems;
  CpuBackend cpu;
  RandomInputs random(20240531);
  for (const Dims& d : {Dims{3, 5, 7, 9}, Dims{8, 16, 12, 12}, Dims{1, 3, 1, 1}}) {
    const BatchNormSpec spec{d.n, d.c, d.h, d.w};
    std::unique_ptr<BatchNorm2dOp> bn = cpu.batchNorm2d(spec);
    auto channelsLast = [&](const std::vector<float>& nchw) {
      Array<float> a(d.numel(), cpu);
      nchwToNhwc(nchw.data(), a.data(), d.n, d.c, d.h, d.w);
      return a;
    };
    auto channelsFirst = [&](const Array<float>& nhwc) {
      std::vector<float> out(static_cast<size_t>(d.numel()));
      nhwcToNchw(nhwc.data(), out.data(), d.n, d.c, d.h, d.w);
      return out;
    };
    auto vectorOf = [](const Array<float>& a) { return std::vector<float>(a.data(), a.data() + a.size()); };
    auto arrayOf = [&](const std::vector<float>& v) {
      Array<float> a(static_cast<int64_t>(v.size()), cpu);
      std::copy(v.begin(), v.end(), a.data());
      return a;
    };
    const std::vector<float> x = channelActivations(random, d), gamma = random.normal(d.c, 1, 0.2f), beta = random.normal(d.c, 0, 0.5f),
                             runningMean = random.normal(d.c), runningVar = random.positive(d.c);
    Check forward;
    {
      Array<float> xs = channelsLast(x), y(d.numel(), cpu), g = arrayOf(gamma), b = arrayOf(beta), mean(d.c, cpu), var(d.c, cpu),
                   rm = arrayOf(runningMean), rv = arrayOf(runningVar);
      bn->forwardTraining(xs.data(), g.data(), b.data(), y.data(), mean.data(), var.data(), rm.data(), rv.data());
      const BatchNormForward want = batchNormForwardReference(x, d, gamma, beta, runningMean, runningVar, spec);
      compare(forward, "y", channelsFirst(y), want.y, kBatchNorm);
      compare(forward, "batchMean", vectorOf(mean), want.batchMean, kBatchNorm);
      compare(forward, "batchVar", vectorOf(var), want.batchVar, kBatchNorm);
      compare(forward, "runningMean", vectorOf(rm), want.runningMean, kBatchNorm);
      compare(forward, "runningVar", vectorOf(rv), want.runningVar, kBatchNorm);
    }
    for (const std::string& f : forward.failures) problems.push_back("batch-norm forward reference " + d.label() + ": " + f);
    for (bool batchStatistics : {true, false}) {
      const ChannelStatistics stats = batchStatistics ? statisticsOf(x, d) : ChannelStatistics{random.normal(d.c), random.positive(d.c)};
      const std::vector<float> dy = correlatedGradient(random, x, d, stats, spec.eps);
      Array<float> xs = channelsLast(x), dys = channelsLast(dy), g = arrayOf(gamma), b = arrayOf(beta), mean = arrayOf(stats.mean),
                   var = arrayOf(stats.var), dx(d.numel(), cpu), dGamma(d.c, cpu), dBeta(d.c, cpu);
      bn->backward(xs.data(), dys.data(), g.data(), b.data(), mean.data(), var.data(), batchStatistics, dx.data(), dGamma.data(),
                   dBeta.data());
      const BatchNormBackward want = batchNormBackwardReference(x, dy, d, gamma, stats.mean, stats.var, spec.eps, batchStatistics);
      Check backward;
      compare(backward, "dx", channelsFirst(dx), want.dx, kBatchNorm);
      compare(backward, "dGamma", vectorOf(dGamma), want.dGamma, kBatchNorm);
      compare(backward, "dBeta", vectorOf(dBeta), want.dBeta, kBatchNorm);
      for (const std::string& f : backward.failures)
        problems.push_back("batch-norm backward reference " + d.label() + (batchStatistics ? " (batch statistics): " : " (fixed): ") + f);
    }
    {
      // The fused ReLU's references against the CPU's fused batch norm.
      BatchNormSpec fused = spec;
      fused.relu = true;
      std::unique_ptr<BatchNorm2dOp> op = cpu.batchNorm2d(fused);
      const std::vector<float> dy = random.normal(d.numel());
      Array<float> xs = channelsLast(x), dys = channelsLast(dy), y(d.numel(), cpu), g = arrayOf(gamma), b = arrayOf(beta),
                   mean(d.c, cpu), var(d.c, cpu), rm = arrayOf(runningMean), rv = arrayOf(runningVar), dx(d.numel(), cpu),
                   dGamma(d.c, cpu), dBeta(d.c, cpu);
      op->forwardTraining(xs.data(), g.data(), b.data(), y.data(), mean.data(), var.data(), rm.data(), rv.data());
      op->backward(xs.data(), dys.data(), g.data(), b.data(), mean.data(), var.data(), true, dx.data(), dGamma.data(), dBeta.data());
      const std::vector<float> gotY = channelsFirst(y);
      const FusedReluReference want = fusedReluReference(x, dy, gotY, d, gamma, beta, runningMean, runningVar, spec);
      Check relu;
      compare(relu, "y", gotY, want.y, kBatchNorm);
      compare(relu, "dx", channelsFirst(dx), want.backward.dx, kBatchNorm);
      compare(relu, "dGamma", vectorOf(dGamma), want.backward.dGamma, kBatchNorm);
      compare(relu, "dBeta", vectorOf(dBeta), want.backward.dBeta, kBatchNorm);
      for (const std::string& f : relu.failures) problems.push_back("batch-norm with its ReLU, reference " + d.label() + ": " + f);
    }
  }
  return problems;
}

// --device-info: one kernel on cuda:0 (under compute-sanitizer, whether it accepts the device),
// then the device as one line of JSON.

}  // namespace accordion::lab
