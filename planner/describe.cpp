#include "planner/describe.hpp"

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "documents/hardware.hpp"

#include "planner/text.hpp"

namespace shardplan::planner {

std::string describe_table(const documents::ModelSpec& m) {
  Text text;
  auto line = [&]<class... A>(fmt::format_string<A...> f, A&&... a) {
    text.line(f, std::forward<A>(a)...);
  };
  line("{} — {}", m.name, documents::architecture_name(m.architecture));
  if (m.architecture != documents::Architecture::uniform)
    line("hidden {}, {} blocks, {} heads ({} key/value) x {}, MLP {} ({}), vocab {}, {} embeddings",
         m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.intermediate,
         m.mlp == documents::MlpKind::swiglu ? "SwiGLU" : "GELU", m.vocab,
         m.tied_embeddings ? "tied" : "untied");
  const auto& e = m.moe;
  if (e.experts > 0)
    line("mixture of experts: {} routed experts of MLP {}, {} per token{}{}", e.experts,
         e.expert_intermediate, e.top_k, e.normalize_top_k ? " (weights renormalized)" : "",
         e.shared_intermediate > 0
             ? fmt::format(", a shared expert of MLP {}{}", e.shared_intermediate,
                           e.shared_gate ? " under a sigmoid gate" : "")
             : "");
  auto unit = [&](const char* title, const documents::UnitTensors& u, std::int64_t count) {
    line("");
    line("{}{}", title, count > 1 ? fmt::format(" (x {})", count) : "");
    for (const auto& t : u.tensors) {
      const auto shape = t.experts > 1 ? fmt::format("[{}, {}, {}]", t.experts, t.rows, t.cols)
                         : t.rows == 1 ? fmt::format("[{}]", t.cols)
                                       : fmt::format("[{}, {}]", t.rows, t.cols);
      line("  {:<34} {:>16} {:>16L}", t.name, shape, t.elements());
    }
    line("  {:<34} {:>16} {:>16L}", "unit total", "", u.params());
  };
  unit("embeddings", m.embedding, 1);
  unit("transformer block", m.block, m.layers);
  unit("head", m.head, 1);
  line("");
  line("{:<36} {:>16} {:>16L}", "total parameters", "", m.total_params());
  if (m.moe.experts > 0) line("{:<36} {:>16} {:>16L}", "active per token", "", m.active_params());
  return text.str;
}

void list_models(std::ostream& out) {
  for (const auto& n : documents::preset_model_names()) {
    const auto m = documents::load_model(n);
    out << fmt::format("{:<14} {:<20} {:>16L} params\n", n,
                       documents::architecture_name(m.architecture), m.total_params());
  }
}

void list_hardware(std::ostream& out) {
  const auto names = documents::preset_hardware_names();
  if (names.empty())
    throw core::InputError(
        "SHARDPLAN_DATA_DIR",
        fmt::format("no profiles (*.json) in {}/hardware_profiles", documents::data_dir()));
  for (const auto& n : names) {
    const auto h = documents::load_hardware(n);
    out << fmt::format("{:<18} {}\n", n, h.description);
  }
  // Where the list came from, so that a build tree's source folder is not taken for an install.
  const auto dir = documents::find_data_dir();
  const char* origin =
      dir.origin == documents::DataDirOrigin::environment ? "the folder SHARDPLAN_DATA_DIR names"
      : dir.origin == documents::DataDirOrigin::installed
          ? "installed beside the program"
          : "the source tree this build was configured from; an installed planner reads its "
            "share/shardplan, SHARDPLAN_DATA_DIR another folder";
  out << fmt::format("(profiles in {}/hardware_profiles: {}; a profile file's path works too)\n",
                     dir.path, origin);
}

}  // namespace shardplan::planner
