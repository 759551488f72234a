#include "planner/svg_chart.hpp"
#include "planner/text.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;

namespace {

constexpr const char* kFont = "font-family=\"Helvetica, Arial, sans-serif\"";

// Geometry, in SVG user units.
constexpr double kLeft = 70, kPlotTop = 112, kPlotHeight = 320, kMargin = 16;
constexpr double kBreak = 14;  // how far a broken bar rises above the axis's top

// A round axis step (1, 2 or 5 × 10^k GiB) giving at most 8 intervals up to `top`.
double tick_step(double top) {
  const double raw = top / 8;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) return m * magnitude;
  return 10 * magnitude;
}

// Advance widths of DejaVu Sans (the widest of the usual sans-serif fonts) in em.
double char_width(unsigned char c) {
  if (c >= '0' && c <= '9') return 0.64;
  if (c >= 'A' && c <= 'Z') return c == 'M' || c == 'W' ? 0.9 : 0.78;
  switch (c) {
  case ' ':
    return 0.32;
  case 'f':
  case 't':
    return 0.4;
  case 'i':
  case 'j':
  case 'l':
    return 0.28;
  case 'r':
    return 0.42;
  case 'm':
    return 0.98;
  case 'w':
    return 0.82;
  case '.':
  case ',':
  case ':':
  case ';':
  case '\'':
  case '|':
    return 0.34;
  case '(':
  case ')':
  case '[':
  case ']':
  case '-':
  case '/':
    return 0.4;
  case '%':
    return 0.95;
  default:
    return c >= 0x80 ? 0.45 : 0.62;  // a UTF-8 byte: ×, · and the like take two
  }
}

std::string gib_text(double g) {
  return g >= 100 ? fmt::format("{:.0f} GiB", g) : fmt::format("{:.1f} GiB", g);
}

struct Svg {
  std::string out;
  template <class... A> void add(fmt::format_string<A...> f, A&&... a) {
    out += fmt::format(f, std::forward<A>(a)...);
    out += '\n';
  }
};

ChartText make_text(std::string text, double x, double y, double size, ChartText::Anchor anchor,
                    bool bold = false, std::string fill = "#000000") {
  ChartText t;
  t.text = std::move(text);
  t.x = x;
  t.y = y;
  t.size = size;
  t.anchor = anchor;
  t.bold = bold;
  t.fill = std::move(fill);
  const double w = text_width(t.text, size, bold);
  t.left = anchor == ChartText::Anchor::start    ? x
           : anchor == ChartText::Anchor::middle ? x - w / 2
                                                 : x - w;
  t.right = t.left + w;
  t.top = y - 0.8 * size;      // ascent
  t.bottom = y + 0.25 * size;  // descent
  return t;
}

// The plan's lines under its bar: what it is, how it shards, how it runs.
std::vector<std::string> plan_lines(const Scenario& sc, const Evaluation& e) {
  const int world = sc.cluster.gpus;
  std::string sharding;
  if (e.spec.strategy == "hsdp") {
    const int g = e.spec.group(world);
    sharding = fmt::format("shard group {} x {} replicas", g, std::max(1, world / std::max(g, 1)));
  } else if (!e.spec.shard_optimizer) {
    sharding = fmt::format("replicated on {} GPUs", world);
  } else {
    sharding = fmt::format("sharded over {} GPUs", e.spec.group(world));
  }
  return {fmt::format("{} ({})", e.spec.strategy, flavour_name(e.spec.flavour)), sharding,
          fmt::format("mb {}, ckpt {}", e.job.micro_batch, checkpointing_label(e.job)),
          fmt::format("offload {}", offload_name(e.spec.offload))};
}

// The bar's bytes in chart categories (chart_categories() order).
std::vector<double> chart_bytes(const StepResult& r) {
  auto at = [&](Category c) { return r.at_peak[static_cast<std::size_t>(c)]; };
  const double head =
      std::clamp(r.head_activations_at_peak, 0.0, std::max(at(Category::activations), 0.0));
  return {at(Category::parameters),
          at(Category::gradients),
          at(Category::optimizer_states),
          at(Category::activations) - head,
          head,
          at(Category::buffers),
          at(Category::overhead)};
}

}  // namespace

const std::vector<ChartCategory>& chart_categories() {
  static const std::vector<ChartCategory> c = {
      {"parameters", "#4e79a7"},
      {"gradients", "#f28e2b"},
      {"optimizer states", "#e15759"},
      {"activations (embeddings, blocks)", "#76b7b2"},
      {"logits and loss (head activations)", "#edc948"},
      {"buffers (gathered, buckets)", "#59a14f"},
      {"overhead (context, NCCL, fragmentation)", "#bab0ac"},
  };
  return c;
}

double text_width(const std::string& text, double size, bool bold) {
  double em = 0;
  for (unsigned char c : text) em += char_width(c);
  return em * size * (bold ? 1.12 : 1.0);
}

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&quot;";
      break;
    case '\'':
      out += "&apos;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

namespace {

using Anchor = ChartText::Anchor;

// The height of `g` GiB on a row's axis.
double y_of(const ChartLayout& L, const ChartRow& row, double g) {
  return row.base - g / L.axis_top_gib * kPlotHeight;
}

ChartText* add_text(ChartLayout& L, ChartText t) {
  L.texts.push_back(std::move(t));
  return &L.texts.back();
}

// The axis: up to the capacity and every bar within a quarter of it; taller bars are broken.
void set_axis(ChartLayout& L, double capacity, const std::vector<Evaluation>& best) {
  double relevant = capacity;
  for (const auto& e : best)
    if (e.result.valid && e.result.peak_bytes / kGiB <= 1.25 * capacity)
      relevant = std::max(relevant, e.result.peak_bytes / kGiB);
  L.step_gib = tick_step(relevant * 1.08);
  L.axis_top_gib = std::ceil(relevant * 1.08 / L.step_gib) * L.step_gib;
}

// A broken bar's categories that reach above the axis's top (cut by the break, or hidden above
// it), each with its whole size, as lines under the plan's: what the bar cannot show.
std::vector<std::string> cut_lines(const ChartLayout& L, const Evaluation& e) {
  std::vector<std::string> lines;
  if (!e.result.valid || e.result.peak_bytes / kGiB <= L.axis_top_gib) return lines;
  const auto bytes = chart_bytes(e.result);
  const auto& cats = chart_categories();
  double level = 0;
  for (std::size_t c = 0; c < bytes.size(); ++c) {
    const double g = bytes[c] / kGiB;
    level += std::max(g, 0.0);
    if (g <= 0 || level <= L.axis_top_gib) continue;
    if (lines.empty()) lines.emplace_back("above the axis:");
    const std::string label = cats[c].label;
    lines.push_back(fmt::format("{} {}", label.substr(0, label.find(" (")), gib_text(g)));
  }
  return lines;
}

// The width of a bar's slot: wide enough for every label under or above a bar.
double label_slot(const ChartLayout& L, const Scenario& sc, const std::vector<Evaluation>& best) {
  double slot = 100;
  for (const auto& e : best) {
    const auto lines = plan_lines(sc, e);
    for (std::size_t k = 0; k < lines.size(); ++k)
      slot = std::max(slot, text_width(lines[k], 11, k == 0) + 14);
    for (const auto& line : cut_lines(L, e))
      slot = std::max(slot, text_width(line, 11, false) + 14);
    slot = std::max(slot, text_width(gib_text(e.result.peak_bytes / kGiB), 11, true) + 14);
  }
  return slot;
}

// The title and the scenario.
void add_titles(ChartLayout& L, const Scenario& sc) {
  add_text(L, make_text("Memory per GPU at the peak: best plan of each family", kLeft, 26, 16,
                        Anchor::start, true));
  add_text(L, make_text(scenario_line(sc), kLeft, 48, 12, Anchor::start, false, "#333333"));
}

// A row's tick labels and its axis title.
void add_axis_labels(ChartLayout& L, const ChartRow& row) {
  for (double g = 0; g <= L.axis_top_gib + L.step_gib / 2; g += L.step_gib)
    add_text(L, make_text(fmt::format("{:g}", g), kLeft - 6, y_of(L, row, g) + 4, 11, Anchor::end));
  const double cy = row.plot_top + kPlotHeight / 2;
  ChartText t = make_text("GiB per GPU", 20, cy, 12, Anchor::middle);
  t.vertical = true;
  const double w = t.right - t.left;  // rotated: the width runs up the page
  t.left = 20 - 0.8 * 12;
  t.right = 20 + 0.25 * 12;
  t.top = cy - w / 2;
  t.bottom = cy + w / 2;
  add_text(L, t);
}

// The bar's segments in chart categories, bottom to top, cut at the broken bar's ceiling.
void stack_segments(const ChartLayout& L, const ChartRow& row, const StepResult& r, ChartBar& b) {
  const double ceiling = L.axis_top_gib + kBreak / kPlotHeight * L.axis_top_gib;
  b.broken = b.peak_gib > L.axis_top_gib;
  const auto bytes = chart_bytes(r);
  double level = 0;
  for (std::size_t c = 0; c < bytes.size(); ++c) {
    const double g = bytes[c] / kGiB;
    if (g <= 0) continue;
    const double lo = std::min(level, ceiling), hi = std::min(level + g, ceiling);
    level += g;
    if (hi <= lo) continue;
    b.segments.push_back({static_cast<int>(c), g, y_of(L, row, hi), y_of(L, row, lo)});
  }
  b.y_top = y_of(L, row, std::min(b.peak_gib, ceiling));
}

// One plan's bar in row `r` centred at cx, its plan's lines (and a broken bar's hidden
// categories) under the axis (returns the lowest text's bottom) and its total above it, clear of
// the capacity and usable lines.
double add_bar(ChartLayout& L, int r, const Scenario& sc, const Evaluation& e, double cx,
               double bar_width) {
  const ChartRow row = L.rows[static_cast<std::size_t>(r)];
  const auto& result = e.result;
  ChartBar b;
  b.row = r;
  b.valid = result.valid;
  b.fits = e.fits;
  b.width = bar_width;
  b.x = cx - bar_width / 2;
  const auto lines = plan_lines(sc, e);
  b.family = lines[0];
  double lowest = row.base;
  double y = row.base + 20;
  for (std::size_t k = 0; k < lines.size(); ++k, y += 14)
    lowest = std::max(lowest,
                      add_text(L, make_text(lines[k], cx, y, 11, Anchor::middle, k == 0))->bottom);
  for (const auto& line : cut_lines(L, e)) {
    lowest = std::max(
        lowest, add_text(L, make_text(line, cx, y, 11, Anchor::middle, false, "#b00020"))->bottom);
    y += 14;
  }
  if (!result.valid) {
    add_text(L, make_text("not runnable", cx, row.base - 8, 11, Anchor::middle, false, "#b00020"));
    L.bars.push_back(std::move(b));
    return lowest;
  }
  b.peak_gib = result.peak_bytes / kGiB;
  stack_segments(L, row, result, b);
  // The total, and "does not fit" above it, clear of the capacity and usable lines.
  const bool two = !e.fits;
  double baseline = b.y_top - 6;
  for (double ly :
       {std::max(row.usable_y, row.capacity_y), std::min(row.usable_y, row.capacity_y)}) {
    const double top = baseline - 9 - (two ? 13 : 0), bottom = baseline + 3;
    if (ly >= top - 2 && ly <= bottom + 2) baseline = ly - 6;
  }
  add_text(L, make_text(gib_text(b.peak_gib), cx, baseline, 11, Anchor::middle, true,
                        e.fits ? "#000000" : "#b00020"));
  if (two)
    add_text(L, make_text("does not fit", cx, baseline - 13, 11, Anchor::middle, false, "#b00020"));
  L.bars.push_back(std::move(b));
  return lowest;
}

// A row's capacity and usable lines' labels, right of its plot, one under the other (the first
// row's with ids); returns their right edge.
double add_capacity_labels(ChartLayout& L, const ChartRow& row, bool first, const Scenario& sc,
                           double capacity, double usable) {
  const double x = row.plot_right + 8;
  auto* cap = add_text(L, make_text(fmt::format("capacity {:.2f} GiB", capacity), x,
                                    row.capacity_y + 4, 11, Anchor::start));
  if (first) cap->id = "capacity-label";
  double right = cap->right;
  double uy = row.usable_y + 4;
  if (uy - (row.capacity_y + 4) < 13) uy = row.capacity_y + 4 + 13;
  auto* use = add_text(L, make_text(fmt::format("usable {:.2f} GiB", usable), x, uy, 11,
                                    Anchor::start, false, "#555555"));
  if (first) use->id = "usable-label";
  right = std::max(right, use->right);
  auto* head = add_text(L, make_text(fmt::format("({:g}% headroom)", sc.headroom * 100), x, uy + 13,
                                     11, Anchor::start, false, "#555555"));
  return std::max(right, head->right);
}

// The legend from lx beside the first row: the categories top to bottom as stacked, then the
// marks. Returns its right edge and its bottom.
std::pair<double, double> add_legend(ChartLayout& L, double lx) {
  double legend_right = lx;
  double ly = L.rows.front().plot_top;
  auto legend_text = [&](const std::string& s) {
    auto* t = add_text(L, make_text(s, lx + 18, ly + 10, 11, Anchor::start));
    legend_right = std::max(legend_right, t->right);
    ly += 18;
  };
  add_text(L,
           make_text("at the peak, bottom of a bar to top:", lx, ly - 8, 11, Anchor::start, true));
  legend_right = std::max(legend_right, L.texts.back().right);
  ly += 4;
  const auto& cats = chart_categories();
  for (auto c = cats.size(); c-- > 0;) legend_text(cats[c].label);
  ly += 10;
  legend_text("GPU capacity");
  legend_text("usable (capacity - headroom)");
  legend_text("does not fit");
  legend_text("taller than the axis: broken, total above");
  return {legend_right, ly};
}

// A row whose plot starts at `top`, its lines at the capacities.
ChartRow make_row(const ChartLayout& L, double top, double plot_width, double capacity,
                  double usable) {
  ChartRow row;
  row.plot_left = kLeft;
  row.plot_right = kLeft + plot_width;
  row.plot_top = top;
  row.base = top + kPlotHeight;
  row.capacity_y = y_of(L, row, capacity);
  row.usable_y = y_of(L, row, usable);
  return row;
}

}  // namespace

ChartLayout chart_layout(const Scenario& sc, const std::vector<Evaluation>& best) {
  ChartLayout L;
  const double capacity = sc.hardware.memory_bytes / kGiB;
  const double usable = sc.usable_bytes() / kGiB;
  set_axis(L, capacity, best);

  // Rows of at most kChartBarsPerRow bars, as even as they come; every row's slots as wide.
  const std::size_t n = best.size();
  const std::size_t rows = std::max<std::size_t>(1, (n + kChartBarsPerRow - 1) / kChartBarsPerRow);
  const std::size_t per_row = std::max<std::size_t>(1, (n + rows - 1) / rows);
  const double slot = label_slot(L, sc, best);
  const double plot_width = std::max(360.0, slot * static_cast<double>(per_row));
  const double pitch = plot_width / static_cast<double>(per_row);
  const double bar_width = std::min(70.0, pitch * 0.5);

  add_titles(L, sc);
  double lowest = 0, label_right = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    // A later row starts below the one before, with room for a broken bar's total and "does not
    // fit" above its plot.
    L.rows.push_back(make_row(L, r == 0 ? kPlotTop : lowest + 64, plot_width, capacity, usable));
    const ChartRow& row = L.rows.back();
    add_axis_labels(L, row);
    lowest = row.base;
    for (std::size_t i = r * per_row; i < std::min(n, (r + 1) * per_row); ++i) {
      const double cx = kLeft + pitch * (static_cast<double>(i - r * per_row) + 0.5);
      lowest = std::max(lowest, add_bar(L, static_cast<int>(r), sc, best[i], cx, bar_width));
    }
    label_right =
        std::max(label_right, add_capacity_labels(L, L.rows.back(), r == 0, sc, capacity, usable));
  }
  const ChartRow& first = L.rows.front();
  if (best.empty())
    add_text(L, make_text("no plans", kLeft + plot_width / 2, first.plot_top + kPlotHeight / 2, 13,
                          Anchor::middle));
  const auto [legend_right, legend_bottom] = add_legend(L, label_right + 24);

  L.plot_left = first.plot_left;
  L.plot_right = first.plot_right;
  L.plot_top = first.plot_top;
  L.base = first.base;
  L.capacity_y = first.capacity_y;
  L.usable_y = first.usable_y;
  L.width = std::ceil(std::max(legend_right + kMargin, L.texts[1].right + kMargin));
  L.width = std::max(L.width, std::ceil(L.texts[0].right + kMargin));
  L.height = std::ceil(std::max(lowest, legend_bottom) + kMargin);
  return L;
}

namespace {

// A row's grid and axes.
void write_axis(Svg& s, const ChartLayout& L, const ChartRow& row) {
  s.add("<g class=\"axis\">");
  for (double g = 0; g <= L.axis_top_gib + L.step_gib / 2; g += L.step_gib) {
    const double gy = row.base - g / L.axis_top_gib * (row.base - row.plot_top);
    s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e6e6e6\"/>",
          row.plot_left, gy, row.plot_right, gy);
  }
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\"/>",
        row.plot_left, row.plot_top, row.plot_left, row.base);
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\"/>",
        row.plot_left, row.base, row.plot_right, row.base);
  s.add("</g>");
}

void write_bar(Svg& s, const ChartLayout& L, const ChartBar& b) {
  const auto& cats = chart_categories();
  const ChartRow& row = L.rows[static_cast<std::size_t>(b.row)];
  s.add("<g class=\"bar\" data-fits=\"{}\" data-broken=\"{}\">", b.fits ? "true" : "false",
        b.broken ? "true" : "false");
  for (const auto& seg : b.segments)
    s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
          "fill=\"{}\"><title>{}: {} {:.2f} "
          "GiB</title></rect>",
          b.x, seg.y_top, b.width, seg.y_bottom - seg.y_top,
          cats[static_cast<std::size_t>(seg.category)].colour, xml_escape(b.family),
          cats[static_cast<std::size_t>(seg.category)].label, seg.gib);
  if (b.broken) {  // two white slashes across the bar just under the axis's top
    for (double d : {0.0, 6.0})
      s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ffffff\" "
            "stroke-width=\"3\"/>",
            b.x - 3, row.plot_top + 8 + d, b.x + b.width + 3, row.plot_top + d);
  }
  if (b.valid && !b.fits)
    s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
          "stroke=\"#b00020\" "
          "stroke-width=\"2.5\" stroke-dasharray=\"5 3\"/>",
          b.x - 2, b.y_top - 2, b.width + 4, row.base - b.y_top + 2);
  s.add("</g>");
}

// A row's capacity (solid) and usable capacity (dashed), over the bars; the first row's with ids.
void write_capacity_lines(Svg& s, const ChartRow& row, bool first) {
  s.add("<line {}x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\" "
        "stroke-width=\"1.5\"/>",
        first ? "id=\"capacity\" " : "", row.plot_left, row.capacity_y, row.plot_right,
        row.capacity_y);
  s.add("<line {}x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#555555\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>",
        first ? "id=\"usable\" " : "", row.plot_left, row.usable_y, row.plot_right, row.usable_y);
}

// Legend marks, beside the legend's texts (the texts place them): the categories' colours, then
// the capacity and usable lines, "does not fit" and the broken bar.
void write_legend_marks(Svg& s, const ChartLayout& L) {
  const auto& cats = chart_categories();
  const ChartText* first = nullptr;
  for (const auto& t : L.texts)
    if (t.text == cats.back().label) first = &t;
  if (!first) return;
  const double lx = first->x - 18;
  double ly = first->y - 10;
  for (auto c = cats.size(); c-- > 0; ly += 18)
    s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>", lx, ly,
          cats[c].colour);
  ly += 10;
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\" "
        "stroke-width=\"1.5\"/>",
        lx, ly + 6, lx + 12, ly + 6);
  ly += 18;
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#555555\" "
        "stroke-width=\"1.5\" "
        "stroke-dasharray=\"6 4\"/>",
        lx, ly + 6, lx + 12, ly + 6);
  ly += 18;
  s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"none\" "
        "stroke=\"#b00020\" "
        "stroke-width=\"2\" stroke-dasharray=\"3 2\"/>",
        lx, ly);
  ly += 18;
  s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"#999999\"/>", lx, ly);
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ffffff\" "
        "stroke-width=\"2\"/>",
        lx - 1, ly + 8, lx + 13, ly + 4);
}

void write_text(Svg& s, const ChartText& t) {
  const char* anchor = t.anchor == ChartText::Anchor::start    ? "start"
                       : t.anchor == ChartText::Anchor::middle ? "middle"
                                                               : "end";
  std::string attrs = fmt::format("x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{:g}\" text-anchor=\"{}\"",
                                  t.x, t.y, t.size, anchor);
  if (t.bold) attrs += " font-weight=\"bold\"";
  if (t.fill != "#000000") attrs += fmt::format(" fill=\"{}\"", t.fill);
  if (t.vertical) attrs += fmt::format(" transform=\"rotate(-90 {:.1f} {:.1f})\"", t.x, t.y);
  if (!t.id.empty()) attrs += fmt::format(" id=\"{}\"", t.id);
  s.add("<text {}>{}</text>", attrs, xml_escape(t.text));
}

}  // namespace

std::string memory_svg(const Scenario& sc, const std::vector<Evaluation>& best) {
  const ChartLayout L = chart_layout(sc, best);
  Svg s;
  // As wide as the window, up to its own size; the height follows the viewBox's proportions.
  s.add("<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {:.0f} {:.0f}\" width=\"100%\" "
        "style=\"max-width: {:.0f}px; height: auto\" {}>",
        L.width, L.height, L.width, kFont);
  s.add("<rect x=\"0\" y=\"0\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#ffffff\"/>", L.width,
        L.height);
  for (const auto& row : L.rows) write_axis(s, L, row);
  for (const auto& b : L.bars) write_bar(s, L, b);
  for (std::size_t r = 0; r < L.rows.size(); ++r) write_capacity_lines(s, L.rows[r], r == 0);
  write_legend_marks(s, L);
  s.add("<g id=\"labels\">");
  for (const auto& t : L.texts) write_text(s, t);
  s.add("</g>");
  s.add("</svg>");
  return s.out;
}

}  // namespace shardplan::planner
