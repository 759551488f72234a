// A string built line by line with compile-time-checked formats (the renderers' one helper).
#pragma once

#include <string>
#include <utility>

#include <fmt/format.h>

namespace shardplan::planner {

struct Text {
  std::string str;
  template <class... A> void line(fmt::format_string<A...> f, A&&... a) {
    str += fmt::format(f, std::forward<A>(a)...);
    str += '\n';
  }
};

}  // namespace shardplan::planner
