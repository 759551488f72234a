// `--svg FILE`: the memory breakdown at the peak of the best plan of each strategy family, one
// stacked bar each, against the GPU's capacity and the usable capacity (capacity minus headroom).
// A self-contained SVG document (no scripts, no external styles), every text XML-escaped.
//
// The axis is scaled to what decides a plan: the capacity and the bars near it. A bar taller than
// the axis is broken at its top (two white slashes) with its total written above it, and the
// categories the break hides are named under it. Each bar is labelled under the axis with its plan
// (strategy, flavour, how it shards, HSDP's group size, micro-batch, checkpointing, offload); the
// capacity and usable lines are labelled to the right of the plot, clear of the bars; a legend
// names every colour. More than kChartBarsPerRow families wrap into rows of bars, each row with
// its own axis on the same scale; the document scales to the width of its window (viewBox, width
// 100%) up to its own size.
#pragma once

#include <string>
#include <vector>

#include "planner/estimate.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

// A text of the chart and the box it is estimated to cover, in SVG user units (y down).
struct ChartText {
  std::string text;
  double x = 0, y = 0;  // anchor point (baseline)
  double size = 11;
  bool bold = false;
  enum class Anchor { start, middle, end } anchor = Anchor::start;
  bool vertical = false;  // rotated -90 degrees about (x, y)
  std::string fill = "#000000";
  std::string id;  // the SVG element's id where one is given
  double left = 0, top = 0, right = 0, bottom = 0;
};

// One segment of a stacked bar: a category's bytes drawn between two heights.
struct ChartSegment {
  int category = 0;  // index into chart_categories()
  double gib = 0;
  double y_top = 0, y_bottom = 0;
};

// Most bars in one row of the chart.
constexpr int kChartBarsPerRow = 6;

// One row of bars: its plot and its capacity and usable lines (y down).
struct ChartRow {
  double plot_left = 0, plot_right = 0, plot_top = 0, base = 0;
  double capacity_y = 0, usable_y = 0;
};

struct ChartBar {
  int row = 0;  // index into ChartLayout::rows
  bool valid = true;
  bool fits = true;
  bool broken = false;  // taller than the axis: drawn to above its top and broken there
  double x = 0, width = 0;
  double peak_gib = 0;
  double y_top = 0;  // the drawn top
  std::string family;
  std::vector<ChartSegment> segments;
};

struct ChartLayout {
  double width = 0, height = 0;
  // The first row's plot and lines (rows[0]'s).
  double plot_left = 0, plot_right = 0, plot_top = 0, base = 0;
  double axis_top_gib = 0, step_gib = 0;
  double capacity_y = 0, usable_y = 0;
  std::vector<ChartRow> rows;
  std::vector<ChartBar> bars;
  std::vector<ChartText> texts;
};

// The bar categories, bottom to top: the simulator's categories with the head's activations (the
// logits and the loss's tensors) apart from the other activations.
struct ChartCategory {
  const char* label;
  const char* colour;
};
const std::vector<ChartCategory>& chart_categories();

// Width of a text in Helvetica/Arial/DejaVu Sans at `size`, estimated on the wide side.
double text_width(const std::string& text, double size, bool bold);

// Where everything goes; memory_svg draws exactly this.
ChartLayout chart_layout(const Scenario& sc, const std::vector<Evaluation>& best_per_family);

// Bars in the order given; a plan that does not fit gets a red dashed outline and "does not
// fit", a plan that is not runnable an empty slot saying so. Axis in GiB.
std::string memory_svg(const Scenario& sc, const std::vector<Evaluation>& best_per_family);

// The text with &, <, >, " and ' replaced by their XML entities.
std::string xml_escape(const std::string& text);

}  // namespace shardplan::planner
