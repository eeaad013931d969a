#!/usr/bin/env bash
# Render a moespec report (self-contained HTML) to a PNG with headless Chromium.
#   scripts/render_report.sh REPORT.html [OUT.png] [WIDTHxHEIGHT]
# Defaults: OUT = REPORT with .png, size 1200x4000. Needs `chromium` (or $CHROMIUM) on PATH.
# The report references nothing outside itself, so networking, sync and updates are all off.
set -euo pipefail
if [[ $# -lt 1 || ! -f "$1" ]]; then
  echo "usage: $0 REPORT.html [OUT.png] [WIDTHxHEIGHT]" >&2
  exit 2
fi
html="$(realpath "$1")"
out="${2:-${html%.html}.png}"
size="${3:-1200x4000}"
browser="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
if [[ -z "$browser" ]]; then
  echo "no chromium found; install it (apt-get install chromium) or set CHROMIUM=/path/to/chrome" >&2
  exit 1
fi
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars \
  --screenshot="$(realpath -m "$out")" --window-size="${size/x/,}" "file://$html" >/dev/null 2>&1
[[ -s "$out" ]] || { echo "chromium wrote no screenshot to $out" >&2; exit 1; }
echo "$out"
