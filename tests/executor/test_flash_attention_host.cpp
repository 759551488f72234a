// The host's tiled flash attention (kernels/flash_attention_host.hpp) against the eager kernels
// (kernels.hpp, which materialise the probabilities): the same outputs and gradients within the
// rounding of each type, and the memory the cost model counts for flash attention.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "costmodel/accounting.hpp"
#include "engine_fixture.hpp"
#include "executor/gpt_model.hpp"
#include "executor/param_init.hpp"
#include "kernels/backend.hpp"
#include "kernels/flash_attention_host.hpp"
#include "kernels/kernels.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;

namespace {

// A shape whose sequence is not a multiple of the blocks (64 + 64 + 22 rows and keys: full,
// diagonal and ragged tiles), with grouped-query heads (4 query heads read 2 kv heads).
struct Shape {
  std::int64_t batch = 2, seq = 150, heads = 4, kv_heads = 2, d = 16;
  std::int64_t q() const { return batch * seq * heads * d; }
  std::int64_t kv() const { return batch * seq * kv_heads * d; }
  std::int64_t rows() const { return batch * heads * seq; }
};

// Uniform in [−2, 2): scores q·k/√d of spread ~2, so the softmax is neither flat nor one-hot.
std::vector<double> uniform(std::int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

template <class S> std::vector<S> as(const std::vector<double>& v) {
  std::vector<S> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = narrow<S>(static_cast<accum_t<S>>(v[i]));
  return out;
}
template <class S> std::vector<double> to_double(const std::vector<S>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(widen(v[i]));
  return out;
}

double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

struct Result {
  std::vector<double> out, dq, dk, dv;
};

// Inputs rounded to S once, so that both paths see the same values; the reference is the eager
// kernels in double over those values.
template <class S>
Result run(bool flash, const Shape& s, const std::vector<double>& q, const std::vector<double>& k,
           const std::vector<double>& v, const std::vector<double>& dout) {
  using A = accum_t<S>;
  auto qs = as<S>(q), ks = as<S>(k), vs = as<S>(v), douts = as<S>(dout);
  std::vector<S> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  if (flash) {
    std::vector<A> lse(static_cast<std::size_t>(s.rows())), delta(lse.size());
    flash_host::forward(out.data(), lse.data(), qs.data(), ks.data(), vs.data(), s.batch, s.seq,
                        s.heads, s.kv_heads, s.d);
    flash_host::backward(dq.data(), dk.data(), dv.data(), delta.data(), douts.data(), out.data(),
                         lse.data(), qs.data(), ks.data(), vs.data(), s.batch, s.seq, s.heads,
                         s.kv_heads, s.d);
  } else {
    std::vector<S> probs(static_cast<std::size_t>(s.rows() * s.seq));
    std::vector<S> scratch(static_cast<std::size_t>(s.seq * s.seq));
    kernels::attention_forward(out.data(), probs.data(), qs.data(), ks.data(), vs.data(), s.batch,
                               s.seq, s.heads, s.kv_heads, s.d);
    kernels::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), douts.data(),
                                probs.data(), qs.data(), ks.data(), vs.data(), s.batch, s.seq,
                                s.heads, s.kv_heads, s.d);
  }
  return {to_double(out), to_double(dq), to_double(dk), to_double(dv)};
}

template <class S> void check_against_eager(const char* type, double tolerance) {
  const std::string name = type;
  CAPTURE(name);
  const Shape s;
  // Reference inputs already representable in S (rounded through it).
  const auto q = to_double(as<S>(uniform(s.q(), 1))), k = to_double(as<S>(uniform(s.kv(), 2)));
  const auto v = to_double(as<S>(uniform(s.kv(), 3))), dout = to_double(as<S>(uniform(s.q(), 4)));
  const auto want = run<double>(false, s, q, k, v, dout);
  const auto got = run<S>(true, s, q, k, v, dout);
  const double errors[] = {rel_l2(got.out, want.out), rel_l2(got.dq, want.dq),
                           rel_l2(got.dk, want.dk), rel_l2(got.dv, want.dv)};
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    MESSAGE(std::string(type) << " " << std::string(names[i]) << ": relative L2 error " << errors[i]
                              << ", tolerance " << tolerance);
    CHECK(errors[i] < tolerance);
  }
}

}  // namespace

// Tolerances (relative L2 norm against the eager kernels in double over the same inputs):
// - double: the same sums in another order and exp/log at full precision; each result is a sum of
//   at most T + d = 166 rounded terms, error ≤ 166·2⁻⁵³ ≈ 1.8e-14 relative (Higham 2002, §3.1,
//   γ_n); 1e-12 leaves room for the softmax's cancellation in dS = P ∘ (dP − D).
// - float: the same bound with u = 2⁻²⁴: 166·6e-8 ≈ 1e-5; 2e-5.
// - bf16, f16: inputs are exact in both paths; the flash path rounds each output once (u = 2⁻⁸,
//   2⁻¹¹) and each kv gradient once per query head of its group (2 here): ≤ 2u + the fp32
//   accumulation's 1e-5.
TEST_CASE("flash_attention_host::outputs and gradients match eager attention") {
  check_against_eager<double>("double", 1e-12);
  check_against_eager<float>("float", 2e-5);
  check_against_eager<bf16>("bf16", 2 * 0x1p-8 + 1e-5);
  check_against_eager<f16>("f16", 2 * 0x1p-11 + 1e-5);
}

TEST_CASE("flash_attention_host::the log-sum-exp is each score row's") {
  // lse[b, h, t] = log Σ_{j ≤ t} exp(q_t·k_j/√d), in double against a direct sum.
  const Shape s{1, 70, 2, 1, 8};
  const auto q = uniform(s.q(), 5), k = uniform(s.kv(), 6), v = uniform(s.kv(), 7);
  std::vector<double> out(q.size()), lse(static_cast<std::size_t>(s.rows()));
  flash_host::forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s.batch, s.seq, s.heads,
                      s.kv_heads, s.d);
  double worst = 0;
  for (std::int64_t h = 0; h < s.heads; ++h)
    for (std::int64_t t = 0; t < s.seq; ++t) {
      double sum = 0;
      for (std::int64_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (std::int64_t e = 0; e < s.d; ++e)
          dot += q[static_cast<std::size_t>((t * s.heads + h) * s.d + e)] *
                 k[static_cast<std::size_t>(j * s.d + e)];
        sum += std::exp(dot / std::sqrt(8.0));
      }
      worst =
          std::max(worst, std::abs(lse[static_cast<std::size_t>(h * s.seq + t)] - std::log(sum)));
    }
  CHECK(worst < 1e-12);  // the same sum in blocks, double (as above)
}

TEST_CASE("flash_attention_host::a block keeps 4·a·T bytes of log-sum-exp instead of the scores") {
  // The cost model's flash attention (costmodel/accounting.cpp megatron_block): the core keeps
  // 4·a·T bytes (fp32 logsumexp per head and token) instead of e·a·s·T (the probabilities). The
  // model on the host backend allocates exactly that difference.
  const auto spec = testing::tiny_llama();
  const BatchShape shape{2, 40};
  const auto a = spec.heads, T = shape.tokens(), s = shape.seq;
  auto saved = [&](bool flash) {
    TrackedAllocator allocator;
    ModelOptions options;
    options.flash_attention = flash;
    GptModel<float> model(spec, allocator, options);
    std::vector<float> values(static_cast<std::size_t>(model.layout().unit_size_of(1)));
    init_unit_params<float>(model.layout(), 1, 3, 0, values);
    auto params = allocator.allocate<float>(MemoryCategory::parameters,
                                            static_cast<std::int64_t>(values.size()));
    std::copy(values.begin(), values.end(), params.data());
    auto x = allocator.allocate<float>(MemoryCategory::activations, T * spec.hidden);
    const auto before = allocator.in_use_bytes(MemoryCategory::activations);
    auto f = model.forward_block(params.span(), std::move(x), shape, Checkpointing::none);
    const auto kept = allocator.in_use_bytes(MemoryCategory::activations) - before;
    CHECK(kept == block_saved_bytes(model.layout(), shape, Checkpointing::none, flash, 4));
    return kept;
  };
  const std::int64_t eager = saved(false), flash = saved(true);
  CHECK(eager - flash == 4 * a * s * T - 4 * a * T);
  documents::TrainingJob job;
  job.seq_len = shape.seq;
  job.micro_batch = shape.batch;
  job.precision = documents::Precision::fp32;
  job.recipe = documents::Recipe::executor;
  job.attention = documents::AttentionImpl::eager;
  const costmodel::Forward fp32{4, 4, false};
  const double eager_model = costmodel::block_activations(spec, job, fp32, false).saved;
  job.attention = documents::AttentionImpl::flash;
  const double flash_model = costmodel::block_activations(spec, job, fp32, false).saved;
  CHECK(eager_model - flash_model == static_cast<double>(eager - flash));
}

TEST_CASE("flash_attention_host::the engine's peak with flash attention is the cost model's") {
  // As engine::peak memory is the cost model's (fp32 within 3%), with the host's flash attention
  // and a sequence long enough that eager's scores would be a visible part of the peak.
  const auto model = testing::small_llama();
  for (int world : {1, 2})
    for (const char* strategy : {"ddp", "zero3"}) {
      const auto flavour =
          std::string(strategy) == "ddp" ? documents::Flavour::ddp : documents::Flavour::deepspeed;
      auto options =
          testing::test_options(model, testing::test_spec(strategy, flavour, world, 1 << 16));
      options.micro_batch = {2, 96};
      options.model_options.flash_attention = true;
      const auto predicted = testing::predict(options, world, testing::cpu_profile(world));
      REQUIRE(predicted.valid);
      const auto run = testing::rehearse_engine(options, 0, world, 2);
      const double error = (predicted.peak_bytes - static_cast<double>(run.peak_bytes)) /
                           static_cast<double>(run.peak_bytes);
      MESSAGE(world << " ranks, " << std::string(strategy) << ", flash: predicted "
                    << predicted.peak_bytes << " B, measured " << run.peak_bytes << " B, error "
                    << 100 * error << "%");
      CHECK(std::abs(error) < 0.03);
    }
}
