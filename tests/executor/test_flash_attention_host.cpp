// The host's tiled flash attention (kernels/flash_attention_host.hpp) against the eager kernels
// (kernels.hpp, which materialise the probabilities): the same outputs and gradients within the
// rounding of each type, and the memory the cost model counts for flash attention.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "costmodel/accounting.hpp"
#include "engine_fixture.hpp"
#include "executor/context_parallel.hpp"
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
  // The cost model's flash attention (costmodel/block_table.cpp, korthikanti_rows): the core keeps
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
  // As engine::peak memory is the cost model's (within 0.01%), with the host's flash attention
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
      CHECK(std::abs(error) < 1e-4);
    }
}

namespace {

// Rows `positions` of a [B, seq, heads·d] array (each sequence's), as rank r holds them.
std::vector<double> rows_at(const std::vector<double>& whole, std::int64_t batch, std::int64_t seq,
                            std::int64_t width, const std::vector<std::int32_t>& positions) {
  std::vector<double> out;
  for (std::int64_t b = 0; b < batch; ++b)
    for (const auto t : positions) {
      const auto* row = whole.data() + (b * seq + t) * width;
      out.insert(out.end(), row, row + width);
    }
  return out;
}

// Rank r's rows of `share` put back at their places of the whole [B, seq, width] array.
void put_rows(std::vector<double>& whole, const std::vector<double>& share, std::int64_t batch,
              std::int64_t seq, std::int64_t width, const std::vector<std::int32_t>& positions) {
  const auto local = static_cast<std::int64_t>(positions.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < local; ++i)
      std::copy_n(share.data() + (b * local + i) * width, width,
                  whole.data() + (b * seq + positions[static_cast<std::size_t>(i)]) * width);
}

}  // namespace

TEST_CASE("flash_attention_host::ring attention's blocks make the whole sequence's attention") {
  // Context parallelism over c = 3 ranks (context_parallel.hpp's load-balanced split: 6 chunks of
  // 24 tokens, rank r holding chunks r and 5 − r): each rank folds the keys of every rank into
  // its running softmax (forward_at, in the ring's order r, r − 1, r − 2) and adds each block's
  // gradients (backward_at with the whole attention's output and lse). Put back in place, the
  // outputs, lse and gradients are the whole sequence's flash attention, in double within the
  // bound derived above for reordered sums (1e-12).
  const Shape s{2, 144, 4, 2, 16};
  const int c = 3;
  const auto q = uniform(s.q(), 11), k = uniform(s.kv(), 12), v = uniform(s.kv(), 13);
  const auto dout = uniform(s.q(), 14);
  const std::int64_t qw = s.heads * s.d, kw = s.kv_heads * s.d, T = s.seq / c;
  std::vector<double> out(q.size()), lse(static_cast<std::size_t>(s.rows())), delta(lse.size());
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  flash_host::forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s.batch, s.seq, s.heads,
                      s.kv_heads, s.d);
  flash_host::backward(dq.data(), dk.data(), dv.data(), delta.data(), dout.data(), out.data(),
                       lse.data(), q.data(), k.data(), v.data(), s.batch, s.seq, s.heads,
                       s.kv_heads, s.d);

  std::vector<double> ring_out(q.size()), ring_dq(q.size()), ring_dk(k.size()), ring_dv(v.size());
  double lse_error = 0;
  for (int r = 0; r < c; ++r) {
    const auto mine = context_positions(s.seq, c, r);
    const auto q_r = rows_at(q, s.batch, s.seq, qw, mine);
    const auto dout_r = rows_at(dout, s.batch, s.seq, qw, mine);
    std::vector<double> out_r(q_r.size()), lse_r(static_cast<std::size_t>(s.batch * s.heads * T));
    for (int i = 0; i < c; ++i) {
      const auto theirs = context_positions(s.seq, c, (r - i + c) % c);
      const auto k_i = rows_at(k, s.batch, s.seq, kw, theirs);
      const auto v_i = rows_at(v, s.batch, s.seq, kw, theirs);
      flash_host::forward_at(out_r.data(), lse_r.data(), q_r.data(), k_i.data(), v_i.data(),
                             {mine.data(), T, theirs.data(), T}, i == 0, s.batch, s.heads,
                             s.kv_heads, s.d);
    }
    put_rows(ring_out, out_r, s.batch, s.seq, qw, mine);
    for (std::int64_t row = 0; row < s.batch * s.heads; ++row)
      for (std::int64_t i = 0; i < T; ++i)
        lse_error = std::max(
            lse_error,
            std::abs(
                lse_r[static_cast<std::size_t>(row * T + i)] -
                lse[static_cast<std::size_t>(row * s.seq + mine[static_cast<std::size_t>(i)])]));
    std::vector<double> dq_r(q_r.size()), delta_r(lse_r.size());
    for (int i = 0; i < c; ++i) {
      const int src = (r - i + c) % c;
      const auto theirs = context_positions(s.seq, c, src);
      const auto k_i = rows_at(k, s.batch, s.seq, kw, theirs);
      const auto v_i = rows_at(v, s.batch, s.seq, kw, theirs);
      std::vector<double> dk_i(k_i.size()), dv_i(v_i.size());
      flash_host::backward_at(dq_r.data(), dk_i.data(), dv_i.data(), delta_r.data(), dout_r.data(),
                              out_r.data(), lse_r.data(), q_r.data(), k_i.data(), v_i.data(),
                              {mine.data(), T, theirs.data(), T}, s.batch, s.heads, s.kv_heads,
                              s.d);
      // dK, dV of rank src's keys: the sum over the ranks whose queries see them.
      auto whole_dk = rows_at(ring_dk, s.batch, s.seq, kw, theirs);
      auto whole_dv = rows_at(ring_dv, s.batch, s.seq, kw, theirs);
      for (std::size_t e = 0; e < dk_i.size(); ++e) {
        whole_dk[e] += dk_i[e];
        whole_dv[e] += dv_i[e];
      }
      put_rows(ring_dk, whole_dk, s.batch, s.seq, kw, theirs);
      put_rows(ring_dv, whole_dv, s.batch, s.seq, kw, theirs);
    }
    put_rows(ring_dq, dq_r, s.batch, s.seq, qw, mine);
  }
  CHECK(lse_error < 1e-12);
  CHECK(rel_l2(ring_out, out) < 1e-12);
  CHECK(rel_l2(ring_dq, dq) < 1e-12);
  CHECK(rel_l2(ring_dk, dk) < 1e-12);
  CHECK(rel_l2(ring_dv, dv) < 1e-12);
}

TEST_CASE("flash_attention_host::a query block that sees no key keeps out 0 and lse -inf") {
  // Rank 0 of c = 2 first meets rank 1's keys (chunks 1 and 2) on the ring: its chunk-0 queries
  // (positions 0..15) see none of them.
  const Shape s{1, 64, 2, 1, 8};
  const auto mine = context_positions(s.seq, 2, 0), theirs = context_positions(s.seq, 2, 1);
  const std::int64_t T = 32;
  const auto q = uniform(T * s.heads * s.d, 21), k = uniform(T * s.kv_heads * s.d, 22);
  const auto v = uniform(T * s.kv_heads * s.d, 23);
  std::vector<double> out(q.size(), 7.0), lse(static_cast<std::size_t>(s.heads * T));
  flash_host::forward_at(out.data(), lse.data(), q.data(), k.data(), v.data(),
                         {mine.data(), T, theirs.data(), T}, true, 1, s.heads, s.kv_heads, s.d);
  for (std::int64_t h = 0; h < s.heads; ++h)
    for (std::int64_t i = 0; i < T; ++i) {
      const double l = lse[static_cast<std::size_t>(h * T + i)];
      if (i < 16)
        CHECK(l == -std::numeric_limits<double>::infinity());
      else
        CHECK(std::isfinite(l));  // chunk 3 (positions 48..63) sees chunks 1 and 2
    }
  for (std::int64_t i = 0; i < 16; ++i)
    CHECK(out[static_cast<std::size_t>(i * s.heads * s.d)] == 0.0);
}

TEST_CASE("context_parallel::rank r holds chunks r and 2c-1-r, what does not split is refused") {
  // Megatron-core's load-balanced split (context_parallel.hpp): 16 tokens over c = 2.
  CHECK(context_positions(16, 2, 0) == std::vector<std::int32_t>{0, 1, 2, 3, 12, 13, 14, 15});
  CHECK(context_positions(16, 2, 1) == std::vector<std::int32_t>{4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(context_positions(8, 1, 0) == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK_THROWS_AS(context_positions(18, 2, 0), std::invalid_argument);  // 18 % 4 != 0
  CHECK_THROWS_AS(context_positions(16, 2, 2), std::invalid_argument);  // no rank 2 of 2
  CHECK_THROWS_AS(context_positions(16, 0, 0), std::invalid_argument);
  // The shares of every rank cover each sequence once.
  const std::vector<std::int32_t> whole = {10, 11, 12, 13, 14, 15, 16, 17,
                                           20, 21, 22, 23, 24, 25, 26, 27};
  std::vector<std::int32_t> share(8);
  take_context_share(whole.data(), share.data(), 2, 8, 2, 1);
  CHECK(share == std::vector<std::int32_t>{12, 13, 14, 15, 22, 23, 24, 25});
}
