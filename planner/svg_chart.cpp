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

// The height of `g` GiB on the chart's axis.
double y_of(const ChartLayout& L, double g) { return L.base - g / L.axis_top_gib * kPlotHeight; }

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

// The width of a bar's slot: wide enough for every label under or above a bar.
double label_slot(const Scenario& sc, const std::vector<Evaluation>& best) {
  double slot = 100;
  for (const auto& e : best) {
    const auto lines = plan_lines(sc, e);
    for (std::size_t k = 0; k < lines.size(); ++k)
      slot = std::max(slot, text_width(lines[k], 11, k == 0) + 14);
    slot = std::max(slot, text_width(gib_text(e.result.peak_bytes / kGiB), 11, true) + 14);
  }
  return slot;
}

// Title, the scenario, the axis's tick labels and its title.
void add_titles(ChartLayout& L, const Scenario& sc) {
  add_text(L, make_text("Memory per GPU at the peak: best plan of each family", kLeft, 26, 16,
                        Anchor::start, true));
  add_text(L, make_text(scenario_line(sc), kLeft, 48, 12, Anchor::start, false, "#333333"));
  for (double g = 0; g <= L.axis_top_gib + L.step_gib / 2; g += L.step_gib)
    add_text(L, make_text(fmt::format("{:g}", g), kLeft - 6, y_of(L, g) + 4, 11, Anchor::end));
  const double cy = L.plot_top + kPlotHeight / 2;
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
void stack_segments(const ChartLayout& L, const StepResult& r, ChartBar& b) {
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
    b.segments.push_back({static_cast<int>(c), g, y_of(L, hi), y_of(L, lo)});
  }
  b.y_top = y_of(L, std::min(b.peak_gib, ceiling));
}

// One plan's bar centred at cx, its plan's lines under the axis (returns the lowest text's bottom)
// and its total above it, clear of the capacity and usable lines.
double add_bar(ChartLayout& L, const Scenario& sc, const Evaluation& e, double cx,
               double bar_width) {
  const auto& r = e.result;
  ChartBar b;
  b.valid = r.valid;
  b.fits = e.fits;
  b.width = bar_width;
  b.x = cx - bar_width / 2;
  const auto lines = plan_lines(sc, e);
  b.family = lines[0];
  double lowest = L.base;
  for (std::size_t k = 0; k < lines.size(); ++k) {
    auto* t = add_text(L, make_text(lines[k], cx, L.base + 20 + 14 * static_cast<double>(k), 11,
                                    Anchor::middle, k == 0));
    lowest = std::max(lowest, t->bottom);
  }
  if (!r.valid) {
    add_text(L, make_text("not runnable", cx, L.base - 8, 11, Anchor::middle, false, "#b00020"));
    L.bars.push_back(std::move(b));
    return lowest;
  }
  b.peak_gib = r.peak_bytes / kGiB;
  stack_segments(L, r, b);
  // The total, and "does not fit" above it, clear of the capacity and usable lines.
  const bool two = !e.fits;
  double baseline = b.y_top - 6;
  for (double ly : {std::max(L.usable_y, L.capacity_y), std::min(L.usable_y, L.capacity_y)}) {
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

// The capacity and usable lines' labels, right of the plot, one under the other; returns their
// right edge.
double add_capacity_labels(ChartLayout& L, const Scenario& sc, double capacity, double usable) {
  const double x = L.plot_right + 8;
  auto* cap = add_text(L, make_text(fmt::format("capacity {:.2f} GiB", capacity), x,
                                    L.capacity_y + 4, 11, Anchor::start));
  cap->id = "capacity-label";
  double right = cap->right;
  double uy = L.usable_y + 4;
  if (uy - (L.capacity_y + 4) < 13) uy = L.capacity_y + 4 + 13;
  auto* use = add_text(L, make_text(fmt::format("usable {:.2f} GiB", usable), x, uy, 11,
                                    Anchor::start, false, "#555555"));
  use->id = "usable-label";
  right = std::max(right, use->right);
  auto* head = add_text(L, make_text(fmt::format("({:g}% headroom)", sc.headroom * 100), x, uy + 13,
                                     11, Anchor::start, false, "#555555"));
  return std::max(right, head->right);
}

// The legend from lx: the categories top to bottom as stacked, then the marks. Returns its right
// edge and its bottom.
std::pair<double, double> add_legend(ChartLayout& L, double lx) {
  double legend_right = lx;
  double ly = L.plot_top;
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

}  // namespace

ChartLayout chart_layout(const Scenario& sc, const std::vector<Evaluation>& best) {
  ChartLayout L;
  const double capacity = sc.hardware.memory_bytes / kGiB;
  const double usable = sc.usable_bytes() / kGiB;
  set_axis(L, capacity, best);

  const auto n = static_cast<double>(std::max<std::size_t>(best.size(), 1));
  const double plot_width = std::max(360.0, label_slot(sc, best) * n);
  const double slot = plot_width / n;
  const double bar_width = std::min(70.0, slot * 0.5);
  L.plot_left = kLeft;
  L.plot_right = kLeft + plot_width;
  L.plot_top = kPlotTop;
  L.base = kPlotTop + kPlotHeight;
  L.capacity_y = y_of(L, capacity);
  L.usable_y = y_of(L, usable);

  add_titles(L, sc);
  double lowest = L.base;
  for (std::size_t i = 0; i < best.size(); ++i) {
    const double cx = kLeft + slot * (static_cast<double>(i) + 0.5);
    lowest = std::max(lowest, add_bar(L, sc, best[i], cx, bar_width));
  }
  if (best.empty())
    add_text(L, make_text("no plans", kLeft + plot_width / 2, L.plot_top + kPlotHeight / 2, 13,
                          Anchor::middle));
  const double label_right = add_capacity_labels(L, sc, capacity, usable);
  const auto [legend_right, legend_bottom] = add_legend(L, label_right + 24);

  L.width = std::ceil(std::max(legend_right + kMargin, L.texts[1].right + kMargin));
  L.width = std::max(L.width, std::ceil(L.texts[0].right + kMargin));
  L.height = std::ceil(std::max(lowest, legend_bottom) + kMargin);
  return L;
}

namespace {

// Grid and axes.
void write_axis(Svg& s, const ChartLayout& L) {
  s.add("<g id=\"axis\">");
  for (double g = 0; g <= L.axis_top_gib + L.step_gib / 2; g += L.step_gib) {
    const double gy = L.base - g / L.axis_top_gib * (L.base - L.plot_top);
    s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e6e6e6\"/>",
          L.plot_left, gy, L.plot_right, gy);
  }
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\"/>",
        L.plot_left, L.plot_top, L.plot_left, L.base);
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\"/>",
        L.plot_left, L.base, L.plot_right, L.base);
  s.add("</g>");
}

void write_bar(Svg& s, const ChartLayout& L, const ChartBar& b) {
  const auto& cats = chart_categories();
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
            b.x - 3, L.plot_top + 8 + d, b.x + b.width + 3, L.plot_top + d);
  }
  if (b.valid && !b.fits)
    s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
          "stroke=\"#b00020\" "
          "stroke-width=\"2.5\" stroke-dasharray=\"5 3\"/>",
          b.x - 2, b.y_top - 2, b.width + 4, L.base - b.y_top + 2);
  s.add("</g>");
}

// Capacity (solid) and usable capacity (dashed), over the bars.
void write_capacity_lines(Svg& s, const ChartLayout& L) {
  s.add("<line id=\"capacity\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"#000000\" "
        "stroke-width=\"1.5\"/>",
        L.plot_left, L.capacity_y, L.plot_right, L.capacity_y);
  s.add("<line id=\"usable\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"#555555\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>",
        L.plot_left, L.usable_y, L.plot_right, L.usable_y);
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
  s.add("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 "
        "0 {:.0f} {:.0f}\" {}>",
        L.width, L.height, L.width, L.height, kFont);
  s.add("<rect x=\"0\" y=\"0\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#ffffff\"/>", L.width,
        L.height);
  write_axis(s, L);
  for (const auto& b : L.bars) write_bar(s, L, b);
  write_capacity_lines(s, L);
  write_legend_marks(s, L);
  s.add("<g id=\"labels\">");
  for (const auto& t : L.texts) write_text(s, t);
  s.add("</g>");
  s.add("</svg>");
  return s.out;
}

}  // namespace shardplan::planner
