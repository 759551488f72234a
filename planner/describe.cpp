#include "planner/describe.hpp"

#include <fmt/format.h>

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
  auto unit = [&](const char* title, const documents::UnitTensors& u, std::int64_t count) {
    line("");
    line("{}{}", title, count > 1 ? fmt::format(" (x {})", count) : "");
    for (const auto& t : u.tensors) {
      const auto shape =
          t.rows == 1 ? fmt::format("[{}]", t.cols) : fmt::format("[{}, {}]", t.rows, t.cols);
      line("  {:<34} {:>16} {:>16L}", t.name, shape, t.elements());
    }
    line("  {:<34} {:>16} {:>16L}", "unit total", "", u.params());
  };
  unit("embeddings", m.embedding, 1);
  unit("transformer block", m.block, m.layers);
  unit("head", m.head, 1);
  line("");
  line("{:<36} {:>16} {:>16L}", "total parameters", "", m.total_params());
  return text.str;
}

}  // namespace shardplan::planner
