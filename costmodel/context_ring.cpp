#include "costmodel/context_ring.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/recipe.hpp"

namespace shardplan::costmodel {

using documents::compute_dtype;
using documents::dtype_bytes;
using documents::ModelSpec;
using documents::recipe_traits;
using documents::RingCode;
using documents::TrainingJob;

RingAttention ring_attention(const ModelSpec& m, const TrainingJob& j, int c, int t,
                             documents::CpRotate rotate) {
  RingAttention r;
  if (c <= 1) return r;
  const double e = dtype_bytes(compute_dtype(j.precision));
  const double T = static_cast<double>(j.seq_len) * static_cast<double>(j.micro_batch);
  const double kv = static_cast<double>(m.kv_width()) / t;
  const double q = static_cast<double>(m.q_width()) / t;
  const double a = static_cast<double>(m.heads) / t;
  const double chunk = 2 * e * T * kv;  // this rank's keys and values
  const double others = (c - 1) * chunk;
  // Whose ring the recipe runs (RecipeTraits::ring).
  switch (recipe_traits(j.recipe).ring) {
  case RingCode::torch_all_gather: {
    // The concatenated input and the gathered output; rotated, the chunk in use, its copy sent
    // and the one arriving (the last step sends none).
    const bool rotated = rotate == documents::CpRotate::all_to_all;
    const double gather = rotated ? (c > 2 ? 3 : 2) * chunk : chunk + c * chunk;
    r.keys_passed = rotated;
    r.forward_bytes = gather + 4 * T * (q + a);
    r.backward_bytes = gather + 4 * T * (q + 2 * kv) + 2 * 8 * T * kv;
    r.forward_sent = r.forward_gathered_sent = others;
    r.backward_gathered_sent = others;
    r.backward_sent = others + c * 8 * T * kv;
    break;
  }
  case RingCode::executor:
    r.forward_sent = r.forward_gathered_sent = others;
    r.backward_gathered_sent = others;
    r.backward_sent = 2 * others + chunk;
    r.overlapped = false;
    break;
  case RingCode::te_p2p:
    r.forward_bytes = 2 * chunk;
    r.backward_bytes = 4 * chunk;
    r.forward_sent = r.forward_gathered_sent = others;
    r.backward_gathered_sent = others;
    r.backward_sent = 2 * others;
    break;
  case RingCode::none:  // a layout the recipe does not run (documents::layout_problems)
    break;
  }
  return r;
}

}  // namespace shardplan::costmodel
