#!/usr/bin/env bash
# Renders `planner recommend --svg` in headless Chromium: a screenshot of each chart, and the
# layout as the browser lays it out (every <text>'s getBoundingClientRect) checked for labels that
# overlap one another, cross the capacity or usable line, or leave the canvas.
# Usage: chart_in_browser.sh PLANNER WORK_DIR. Exits 77 (skipped) where no Chromium is installed
# (Debian: apt-get install chromium, or scripts/install-deps.sh chromium).
set -euo pipefail
planner=$1
work=$2
browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
if [[ -z "$browser" ]]; then
  echo "SKIPPED: no chromium on PATH; install it (Debian: apt-get install chromium) to render the chart"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
run_browser() {
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --user-data-dir="$work/profile" "$@" 2>"$work/browser.log"
}

status=0
# The default job (8 GPUs: DDP's bar over the capacity, two HSDP groupings) and 64 GPUs over 8 nodes.
for chart in default:"" gpus64:"--gpus 64"; do
  name=${chart%%:*}
  # shellcheck disable=SC2086
  "$planner" recommend ${chart#*:} --svg "$work/$name.svg" >"$work/$name.txt"
  # The window the chart's own size (its viewBox; the document scales to its window up to it).
  size=$(sed -n 's/^<svg [^>]*viewBox="0 0 \([0-9]*\) \([0-9]*\)".*/\1,\2/p' "$work/$name.svg")
  run_browser --window-size="$size" --screenshot="$work/$name.png" "file://$work/$name.svg" >/dev/null
  [[ -s "$work/$name.png" ]] || { echo "$name: no screenshot"; status=1; }
  {
    echo '<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{margin:0}</style></head><body>'
    cat "$work/$name.svg"
    cat <<'JS'
<pre id="layout"></pre>
<script>
const svg = document.querySelector('svg');
const canvas = svg.getBoundingClientRect();
const texts = [...svg.querySelectorAll('text')];
const boxes = texts.map(t => t.getBoundingClientRect());
const lines = ['capacity', 'usable'].map(id => [id, document.getElementById(id).getBoundingClientRect()]);
const out = [`texts ${texts.length}`];
const eps = 0.5;
const cross = (a, b) => a.left < b.right - eps && b.left < a.right - eps && a.top < b.bottom - eps && b.top < a.bottom - eps;
texts.forEach((t, i) => {
  const a = boxes[i];
  if (a.width === 0 || a.height === 0) out.push(`PROBLEM empty: "${t.textContent}"`);
  if (a.left < canvas.left - eps || a.top < canvas.top - eps || a.right > canvas.right + eps || a.bottom > canvas.bottom + eps)
    out.push(`PROBLEM outside the canvas: "${t.textContent}"`);
  for (const [id, l] of lines)
    if (a.left < l.right && l.left < a.right && a.top < l.bottom && l.top < a.bottom)
      out.push(`PROBLEM crosses the ${id} line: "${t.textContent}"`);
  for (let k = i + 1; k < texts.length; ++k)
    if (cross(a, boxes[k])) out.push(`PROBLEM overlap: "${t.textContent}" and "${texts[k].textContent}"`);
});
document.getElementById('layout').textContent = out.join('\n');
</script></body></html>
JS
  } >"$work/$name.html"
  run_browser --dump-dom "file://$work/$name.html" >"$work/$name.dom.html"
  layout=$(awk '/<pre id="layout">/ { p = 1 } p { print } p && /<\/pre>/ { exit }' "$work/$name.dom.html")
  echo "$name: $(grep -o 'texts [0-9]*' <<<"$layout" || echo 'no layout')"
  if ! grep -q 'texts [1-9]' <<<"$layout"; then
    echo "$name: the page's script did not run (see $work/browser.log)"; status=1
  fi
  if grep -q PROBLEM <<<"$layout"; then
    grep PROBLEM <<<"$layout" | sed "s/^/$name: /"; status=1
  fi
  echo "$name: screenshot $work/$name.png"
done
exit $status
