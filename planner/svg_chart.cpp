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

std::string memory_svg(const Scenario& sc, const std::vector<Evaluation>& best) {
  const double capacity = sc.hardware.memory_bytes / kGiB;
  const double usable = sc.usable_bytes() / kGiB;
  double highest = capacity;
  for (const auto& e : best)
    if (e.result.valid) highest = std::max(highest, e.result.peak_bytes / kGiB);
  const double step = tick_step(highest * 1.05);
  const double top = std::ceil(highest * 1.05 / step) * step;

  const auto n = static_cast<double>(std::max<std::size_t>(best.size(), 1));
  const double plot_width = std::max(360.0, 135.0 * n);
  const double slot = plot_width / n;
  const double bar_width = std::min(64.0, slot * 0.55);
  const double width = kLeft + plot_width + 30 + kLegendWidth;
  const double height = kTop + kPlotHeight + kBottom;
  const double base = kTop + kPlotHeight;
  auto y = [&](double g) { return base - g / top * kPlotHeight; };

  Svg s;
  s.add(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 "
      "{:.0f} {:.0f}\" {}>",
      width, height, width, height, kFont);
  s.add("<rect x=\"0\" y=\"0\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#ffffff\"/>", width,
        height);
  s.add("<text x=\"{:.1f}\" y=\"24\" font-size=\"16\" font-weight=\"bold\">Memory per GPU at the "
        "peak: best plan of each family</text>",
        kLeft);
  s.add("<text x=\"{:.1f}\" y=\"44\" font-size=\"12\" fill=\"#333333\">{}</text>", kLeft,
        xml_escape(scenario_line(sc)));

  // Axis, grid and tick labels.
  s.add("<g id=\"axis\" font-size=\"11\">");
  for (double g = 0; g <= top + step / 2; g += step) {
    s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e0e0e0\"/>",
          kLeft, y(g), kLeft + plot_width, y(g));
    s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>", kLeft - 6, y(g) + 4,
          g);
  }
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\"/>", kLeft,
        kTop, kLeft, base);
  s.add("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\"/>", kLeft,
        base, kLeft + plot_width, base);
  s.add("<text x=\"18\" y=\"{:.1f}\" transform=\"rotate(-90 18 {:.1f})\" text-anchor=\"middle\" "
        "font-size=\"12\">GiB per GPU</text>",
        kTop + kPlotHeight / 2, kTop + kPlotHeight / 2);
  s.add("</g>");

  // Bars.
  if (best.empty())
    s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"13\">no plans</text>",
          kLeft + plot_width / 2, kTop + kPlotHeight / 2);
  for (std::size_t i = 0; i < best.size(); ++i) {
    const auto& e = best[i];
    const auto& r = e.result;
    const double cx = kLeft + slot * (static_cast<double>(i) + 0.5);
    const double x0 = cx - bar_width / 2;
    const std::string family =
        fmt::format("{} ({})", e.spec.strategy, flavour_name(e.spec.flavour));
    s.add("<g class=\"bar\" data-fits=\"{}\">", e.fits ? "true" : "false");
    if (!r.valid) {
      s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\" "
            "fill=\"#b00020\">not runnable<title>{}</title></text>",
            cx, base - 8, xml_escape(r.reason));
    } else {
      double level = 0;
      for (int c = 0; c < kCategories; ++c) {
        const double g = r.at_peak[static_cast<std::size_t>(c)] / kGiB;
        if (g <= 0) continue;
        s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">"
              "<title>{}: {} {:.2f} GiB</title></rect>",
              x0, y(level + g), bar_width, y(level) - y(level + g),
              kColours[static_cast<std::size_t>(c)], xml_escape(family),
              kLabels[static_cast<std::size_t>(c)], g);
        level += g;
      }
      const double peak = r.peak_bytes / kGiB;
      if (e.fits) {
        s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\">{:.1f} "
              "GiB</text>",
              cx, y(peak) - 6, peak);
      } else {
        // Not fitting: a red dashed outline around the whole bar and the overshoot in words.
        s.add("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
              "stroke=\"#b00020\" stroke-width=\"2.5\" stroke-dasharray=\"5 3\"/>",
              x0 - 2, y(peak) - 2, bar_width + 4, y(0) - y(peak) + 2);
        s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\" "
              "fill=\"#b00020\" font-weight=\"bold\">{:.1f} GiB: does not fit</text>",
              cx, y(peak) - 8, peak);
      }
    }
    const std::string lines[] = {
        family,
        fmt::format("mb {}, ckpt {}", e.job.micro_batch, checkpointing_label(e.job)),
        fmt::format("offload {}", offload_name(e.spec.offload)),
    };
    for (std::size_t k = 0; k < 3; ++k)
      s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\"{}>{}</text>",
            cx, base + 18 + 14 * static_cast<double>(k), k == 0 ? " font-weight=\"bold\"" : "",
            xml_escape(lines[k]));
    s.add("</g>");
  }

  // Capacity (solid) and usable capacity (dashed), drawn over the bars.
  s.add("<line id=\"capacity\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"#000000\" stroke-width=\"1.5\"/>",
        kLeft, y(capacity), kLeft + plot_width, y(capacity));
  s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"11\">capacity {:.2f} "
        "GiB</text>",
        kLeft + plot_width - 4, y(capacity) - 5, capacity);
  s.add("<line id=\"usable\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>",
        kLeft, y(usable), kLeft + plot_width, y(usable));
  s.add("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"11\" "
        "fill=\"#555555\">usable "
        "{:.2f} GiB ({:g}% headroom)</text>",
        kLeft + plot_width - 4, y(usable) + 14, usable, sc.headroom * 100);

  // Legend.
  const double lx = kLeft + plot_width + 30;
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
  s.add("</svg>");
  return s.out;
}

}  // namespace shardplan::planner
