// A string built line by line with compile-time-checked formats (the renderers' one helper).
#pragma once

#include <string>
#include <utility>

#include <fmt/format.h>

namespace shardplan::planner {

inline constexpr double kMiB = 1024.0 * 1024.0;  // bytes, for the renderers' MiB and GiB
inline constexpr double kGiB = 1024.0 * kMiB;

struct Text {
  std::string str;
  template <class... A> void line(fmt::format_string<A...> f, A&&... a) {
    str += fmt::format(f, std::forward<A>(a)...);
    str += '\n';
  }
};

}  // namespace shardplan::planner
