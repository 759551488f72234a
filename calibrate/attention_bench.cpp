#include "calibrate/attention_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/memory_source.hpp"
#include "kernels/scalar.hpp"

#if defined(SHARDPLAN_HAVE_NCCL)
#include <cuda_runtime_api.h>

#include "comm/cuda_check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_memory.hpp"
#endif

namespace shardplan::calibrate {

using documents::AttentionSample;
using documents::AttentionShape;

AttentionShape model_attention_shape(const documents::ModelSpec& m, std::int64_t tokens,
                                     std::int64_t seq) {
  return {tokens / seq, seq, m.heads, m.kv_heads, m.head_dim};
}

namespace {

// `count` elements of T in `memory`, freed on scope exit; filled with values in [-1, 1) (a
// normed activation's typical range, as the executor's q, k and v are) unless `zero`.
template <class T> class Buffer {
public:
  Buffer(kernels::MemorySource& memory, std::int64_t count, std::uint32_t seed, bool zero = false)
      : memory_(memory), bytes_(std::max<std::int64_t>(count, 1) * std::int64_t{sizeof(T)}) {
    data_ = static_cast<T*>(memory.allocate(bytes_, true));
    if (zero) return;
    std::vector<T> host(static_cast<std::size_t>(std::max<std::int64_t>(count, 1)));
    std::uint32_t x = seed;
    for (auto& e : host) {
      x = x * 1664525u + 1013904223u;  // Numerical Recipes' LCG, as elementwise_bench fills
      e = kernels::narrow<T>(static_cast<float>(x >> 8) / static_cast<float>(1 << 23) - 1.0f);
    }
    try {
      memory.write(data_, host.data(), bytes_);
    } catch (...) {
      memory.free(data_, bytes_);
      throw;
    }
  }
  ~Buffer() { memory_.free(data_, bytes_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* data() const { return data_; }

private:
  kernels::MemorySource& memory_;
  std::int64_t bytes_;
  T* data_ = nullptr;
};

struct Seconds {
  double forward = 0, backward = 0;
};

// The median forward and backward seconds of forward() then backward(), each bracketed by the
// backend's part timer.
template <class S, class Forward, class Backward>
Seconds median_seconds(kernels::Backend<S>& be, Forward forward, Backward backward,
                       double min_seconds) {
  using Part = typename kernels::Backend<S>::Part;
  auto run = [&] {
    be.begin(Part::forward);
    forward();
    be.end(Part::forward);
    be.begin(Part::backward);
    backward();
    be.end(Part::backward);
    be.synchronize();
    const auto s = be.take_seconds();
    return Seconds{s.forward, s.backward};
  };
  (void)be.take_seconds();      // nothing before counts
  const Seconds first = run();  // untimed: first touch
  const double once = std::max(first.forward + first.backward, 1e-9);
  const int runs = std::clamp(static_cast<int>(std::ceil(min_seconds / once)), 3, 50);
  std::vector<double> forwards, backwards;
  for (int i = 0; i < runs; ++i) {
    const Seconds s = run();
    forwards.push_back(s.forward);
    backwards.push_back(s.backward);
  }
  auto median = [](std::vector<double>& v) {
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    return *mid;
  };
  return {median(forwards), median(backwards)};
}

// Eager attention, then flash attention where the backend has it, with the executor's buffers:
// q, out [N, heads·d]; k, v [N, kv_heads·d]; eager's probs [B, heads, T, T] and the backward's
// scratch; flash's lse and delta [B, heads, T] in the accumulation type. The backward adds into
// dq, dk and dv (kernels/backend.hpp), as the executor's does into its zeroed gradients.
template <class S>
std::vector<AttentionSample> time_attention(kernels::Backend<S>& be, kernels::MemorySource& memory,
                                            documents::DType dtype, const AttentionShape& a,
                                            double min_seconds,
                                            const std::function<void()>& before_each) {
  using A = kernels::accum_t<S>;
  const std::int64_t B = a.batch, T = a.seq, N = B * T;
  const std::int64_t qw = a.heads * a.head_dim, kw = a.kv_heads * a.head_dim;
  Buffer<S> q(memory, N * qw, 1), k(memory, N * kw, 2), v(memory, N * kw, 3);
  Buffer<S> dout(memory, N * qw, 4), out(memory, N * qw, 0, true);
  Buffer<S> dq(memory, N * qw, 0, true), dk(memory, N * kw, 0, true), dv(memory, N * kw, 0, true);
  auto sample = [&](const char* impl, const Seconds& s) {
    return AttentionSample{impl,       dtype,      a.batch,   a.seq,     a.heads,
                           a.kv_heads, a.head_dim, s.forward, s.backward};
  };
  std::vector<AttentionSample> samples;
  {
    Buffer<S> probs(memory, B * a.heads * T * T, 0, true);
    Buffer<S> scratch(memory, be.attention_scratch_elements(B, T, a.heads), 0, true);
    if (before_each) before_each();
    const Seconds s = median_seconds(
        be,
        [&] {
          be.attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, T,
                               a.heads, a.kv_heads, a.head_dim);
        },
        [&] {
          be.attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(),
                                probs.data(), q.data(), k.data(), v.data(), B, T, a.heads,
                                a.kv_heads, a.head_dim);
        },
        min_seconds);
    samples.push_back(sample("eager", s));
  }
  if (be.supports_flash_attention(a.head_dim)) {
    Buffer<A> lse(memory, B * a.heads * T, 0, true), delta(memory, B * a.heads * T, 0, true);
    if (before_each) before_each();
    const Seconds s = median_seconds(
        be,
        [&] {
          be.flash_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T,
                                     a.heads, a.kv_heads, a.head_dim);
        },
        [&] {
          be.flash_attention_backward(dq.data(), dk.data(), dv.data(), delta.data(), dout.data(),
                                      out.data(), lse.data(), q.data(), k.data(), v.data(), B, T,
                                      a.heads, a.kv_heads, a.head_dim);
        },
        min_seconds);
    samples.push_back(sample("flash", s));
  }
  return samples;
}

}  // namespace

std::vector<AttentionSample> time_cpu_attention(const AttentionShape& shape, double min_seconds,
                                                const std::function<void()>& before_each) {
  kernels::HostMemory memory;
  kernels::HostBackend<float> backend;
  return time_attention(backend, memory, documents::DType::fp32, shape, min_seconds, before_each);
}

#if defined(SHARDPLAN_HAVE_NCCL)
std::vector<AttentionSample> time_cuda_attention(int device, const AttentionShape& shape,
                                                 double min_seconds,
                                                 const std::function<void()>& before_each) {
  SHARDPLAN_CUDA_CALL(cudaSetDevice, device);
  kernels::cuda::DeviceMemory memory;
  std::vector<AttentionSample> samples;
  {
    // TF32 as the executor's GPU backends (executor/cuda/device_run.cpp); bf16 GEMMs use the
    // tensor cores whatever it says. Made after the memory, gone before it: its stream is the
    // one the memory allocates on.
    kernels::cuda::CudaBackend<kernels::bf16> backend(memory, true);
    samples =
        time_attention(backend, memory, documents::DType::bf16, shape, min_seconds, before_each);
  }
  return samples;
}
#endif

}  // namespace shardplan::calibrate
