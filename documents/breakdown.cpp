#include "documents/breakdown.hpp"

namespace shardplan::documents {

const char* category_name(Category c) {
  switch (c) {
  case Category::parameters:
    return "parameters";
  case Category::gradients:
    return "gradients";
  case Category::optimizer_states:
    return "optimizer_states";
  case Category::activations:
    return "activations";
  case Category::buffers:
    return "buffers";
  case Category::overhead:
    return "overhead";
  }
  return "?";
}

double total(const Breakdown& b) {
  double t = 0;
  for (double x : b) t += x;
  return t;
}

}  // namespace shardplan::documents
