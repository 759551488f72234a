#include "planner/svg_chart.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>

namespace shardplan::planner {

using namespace costmodel;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// One fixed colour per category, in Category order (parameters, gradients, optimizer states,
// activations, buffers, overhead), so charts of different jobs read the same.
constexpr std::array<const char*, kCategories> kColours = {"#4e79a7", "#f28e2b", "#e15759",
                                                           "#76b7b2", "#59a14f", "#bab0ac"};
constexpr std::array<const char*, kCategories> kLabels = {
    "parameters",
    "gradients",
    "optimizer states",
    "activations",
    "buffers (gathered, buckets)",
    "overhead (context, NCCL, fragmentation)"};
constexpr const char* kFont = "font-family=\"Helvetica, Arial, sans-serif\"";

// Geometry, in SVG user units.
constexpr double kLeft = 80, kTop = 70, kPlotHeight = 300, kBottom = 80, kLegendWidth = 280;

// A round axis step (1, 2 or 5 × 10^k GiB) giving at most 8 intervals up to `top`.
double tick_step(double top) {
  const double raw = top / 8;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) return m * magnitude;
  return 10 * magnitude;
}

struct Svg {
  std::string out;
  template <class... A> void add(fmt::format_string<A...> f, A&&... a) {
    out += fmt::format(f, std::forward<A>(a)...);
    out += '\n';
  }
};

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
    case '&': out += "&amp;"; break;
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '"': out += "&quot;"; break;
    case '\'': out += "&apos;"; break;
    default: out += c;
    }
  }
  return out;
}

namespace {

// The chart's geometry: the GiB axis up to `top`, one slot per bar.
struct Layout {
  double top, step, plot_width, slot, bar_width, width, height, base;
  double y(double g) const { return base - g / top * kPlotHeight; }
};

Layout layout_for(const Scenario& sc, const std::vector<Evaluation>& best) {
  const double capacity = sc.hardware.memory_bytes / kGiB;
  double highest = capacity;
  for (const auto& e : best)
    if (e.result.valid) highest = std::max(highest, e.result.peak_bytes / kGiB);
  Layout l{};
  l.step = tick_step(highest * 1.05);
  l.top = std::ceil(highest * 1.05 / l.step) * l.step;
  const auto n = static_cast<double>(std::max<std::size_t>(best.size(), 1));
  l.plot_width = std::max(360.0, 135.0 * n);
  l.slot = l.plot_width / n;
  l.bar_width = std::min(64.0, l.slot * 0.55);
  l.width = kLeft + l.plot_width + 30 + kLegendWidth;
  l.height = kTop + kPlotHeight + kBottom;
  l.base = kTop + kPlotHeight;
  return l;
}

// The opening tag, the background, the title and the scenario line.
void add_header(Svg& s, const Layout& l, const Scenario& sc) {
  s.add(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 "
      "{:.0f} {:.0f}\" {}>",
      l.width, l.height, l.width, l.height, kFont);
  s.add("<rect x=\"0\" y=\"0\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#ffffff\"/>", l.width,
        l.height);
  s.add("<text x=\"{:.1f}\" y=\"24\" font-size=\"16\" font-weight=\"bold\">Memory per GPU at the "
        "peak: best plan of each family</text>",
        kLeft);
  s.add("<text x=\"{:.1f}\" y=\"44\" font-size=\"12\" fill=\"#333333\">{}</text>", kLeft,
        xml_escape(scenario_line(sc)));
}

// Axis, grid and tick labels.
void add_axis(Svg& s, const Layout& l) {
  s.add("<g id=\"axis\" font-size=\"11\">");
  for (double g = 0; g <= l.top + l.step / 2; g += l.step) {
    s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e0e0e0\"/>",
          kLeft, l.y(g), kLeft + l.plot_width, l.y(g));
    s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>", kLeft - 6, l.y(g) + 4,
          g);
  }
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\"/>", kLeft,
        kTop, kLeft, l.base);
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\"/>", kLeft,
        l.base, kLeft + l.plot_width, l.base);
  s.add("<text x=\"18\" y=\"{:.1f}\" transform=\"rotate(-90 18 {:.1f})\" text-anchor=\"middle\" "
        "font-size=\"12\">GiB per GPU</text>",
        kTop + kPlotHeight / 2, kTop + kPlotHeight / 2);
  s.add("</g>");
}

// The stacked categories of one runnable plan at the peak, and its peak in words.
void add_stack(Svg& s, const Layout& l, const Evaluation& e, double cx, const std::string& family) {
  const auto& r = e.result;
  const double x0 = cx - l.bar_width / 2;
  double level = 0;
  for (int c = 0; c < kCategories; ++c) {
    const double g = r.at_peak[static_cast<std::size_t>(c)] / kGiB;
    if (g <= 0) continue;
    s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">"
          "<title>{}: {} {:.2f} GiB</title></rect>",
          x0, l.y(level + g), l.bar_width, l.y(level) - l.y(level + g),
          kColours[static_cast<std::size_t>(c)], xml_escape(family),
          kLabels[static_cast<std::size_t>(c)], g);
    level += g;
  }
  const double peak = r.peak_bytes / kGiB;
  if (e.fits) {
    s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\">{:.1f} "
          "GiB</text>",
          cx, l.y(peak) - 6, peak);
  } else {
    // Not fitting: a red dashed outline around the whole bar and the overshoot in words.
    s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
          "stroke=\"#b00020\" stroke-width=\"2.5\" stroke-dasharray=\"5 3\"/>",
          x0 - 2, l.y(peak) - 2, l.bar_width + 4, l.y(0) - l.y(peak) + 2);
    s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\" "
          "fill=\"#b00020\" font-weight=\"bold\">{:.1f} GiB: does not fit</text>",
          cx, l.y(peak) - 8, peak);
  }
}

// Bar i: the plan's stack (or why it cannot run) and its three label lines.
void add_bar(Svg& s, const Layout& l, const Evaluation& e, std::size_t i) {
  const double cx = kLeft + l.slot * (static_cast<double>(i) + 0.5);
  const std::string family = fmt::format("{} ({})", e.spec.strategy, flavour_name(e.spec.flavour));
  s.add("<g class=\"bar\" data-fits=\"{}\">", e.fits ? "true" : "false");
  if (!e.result.valid)
    s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\" "
          "fill=\"#b00020\">not runnable<title>{}</title></text>",
          cx, l.base - 8, xml_escape(e.result.reason));
  else
    add_stack(s, l, e, cx, family);
  const std::string lines[] = {
      family,
      fmt::format("mb {}, ckpt {}", e.job.micro_batch, checkpointing_label(e.job)),
      fmt::format("offload {}", offload_name(e.spec.offload)),
  };
  for (std::size_t k = 0; k < 3; ++k)
    s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\"{}>{}</text>",
          cx, l.base + 18 + 14 * static_cast<double>(k), k == 0 ? " font-weight=\"bold\"" : "",
          xml_escape(lines[k]));
  s.add("</g>");
}

// Capacity (solid) and usable capacity (dashed), drawn over the bars.
void add_capacity_lines(Svg& s, const Layout& l, const Scenario& sc) {
  const double capacity = sc.hardware.memory_bytes / kGiB;
  const double usable = sc.usable_bytes() / kGiB;
  s.add("<line id=\"capacity\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"#000000\" stroke-width=\"1.5\"/>",
        kLeft, l.y(capacity), kLeft + l.plot_width, l.y(capacity));
  s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"11\">capacity {:.2f} "
        "GiB</text>",
        kLeft + l.plot_width - 4, l.y(capacity) - 5, capacity);
  s.add("<line id=\"usable\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>",
        kLeft, l.y(usable), kLeft + l.plot_width, l.y(usable));
  s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"11\" "
        "fill=\"#555555\">usable "
        "{:.2f} GiB ({:g}% headroom)</text>",
        kLeft + l.plot_width - 4, l.y(usable) + 14, usable, sc.headroom * 100);
}

void add_legend(Svg& s, const Layout& l) {
  const double lx = kLeft + l.plot_width + 30;
  s.add("<g id=\"legend\" font-size=\"11\">");
  for (int c = kCategories - 1, row = 0; c >= 0; --c, ++row) {  // top to bottom as stacked
    const double ly = kTop + 18.0 * row;
    s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>", lx, ly,
          kColours[static_cast<std::size_t>(c)]);
    s.add("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>", lx + 18, ly + 10,
          xml_escape(kLabels[static_cast<std::size_t>(c)]));
  }
  const double ly = kTop + 18.0 * kCategories + 10;
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\" "
        "stroke-width=\"1.5\"/>",
        lx, ly + 6, lx + 12, ly + 6);
  s.add("<text x=\"{:.1f}\" y=\"{:.1f}\">GPU capacity</text>", lx + 18, ly + 10);
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#555555\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>",
        lx, ly + 24, lx + 12, ly + 24);
  s.add("<text x=\"{:.1f}\" y=\"{:.1f}\">usable (capacity - headroom)</text>", lx + 18, ly + 28);
  s.add(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"none\" stroke=\"#b00020\" "
      "stroke-width=\"2\" stroke-dasharray=\"3 2\"/>",
      lx, ly + 36);
  s.add("<text x=\"{:.1f}\" y=\"{:.1f}\">does not fit</text>", lx + 18, ly + 46);
  s.add("</g>");
}

}  // namespace

std::string memory_svg(const Scenario& sc, const std::vector<Evaluation>& best) {
  const Layout l = layout_for(sc, best);
  Svg s;
  add_header(s, l, sc);
  add_axis(s, l);
  if (best.empty())
    s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"13\">no plans</text>",
          kLeft + l.plot_width / 2, kTop + kPlotHeight / 2);
  for (std::size_t i = 0; i < best.size(); ++i)
    add_bar(s, l, best[i], i);
  add_capacity_lines(s, l, sc);
  add_legend(s, l);
  s.add("</svg>");
  return s.out;
}

}  // namespace shardplan::planner
