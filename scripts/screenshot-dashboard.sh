#!/bin/sh
# Render the default dashboard and save the top of it as docs/dashboard.png (the README's picture).
# Needs the venv (`make demo`) and headless Chromium (scripts/ensure-chromium.sh).
set -eu
cd "$(dirname "$0")/.."
mkdir -p dashboards && .venv/bin/simtrain compare default --out dashboards/default.html > /dev/null
profile=$(mktemp -d)
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$profile" --hide-scrollbars \
    --window-size=1300,1500 --virtual-time-budget=5000 --screenshot=docs/dashboard.png \
    "file://$PWD/dashboards/default.html" 2> /dev/null
rm -rf "$profile"
ls -l docs/dashboard.png
