#!/bin/sh
# Install headless Chromium and its WebDriver (Debian packages) for the browser test, only when
# they are missing. CI runs `make test` as root on a clean machine: there this must install them,
# and a failure stops the test run. Elsewhere, without root, it says what to do and goes on (the
# browser test then fails in CI or is skipped outside CI, naming this script).
set -eu
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    echo "installing chromium and chromium-driver (Debian packages) for the browser test"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q chromium chromium-driver
    exit 0
fi
echo "warning: /usr/bin/chromium or /usr/bin/chromedriver is missing and this user cannot install" \
     "them; run 'sudo apt-get install chromium chromium-driver' for the browser test" >&2
if [ "${CI:-}" = "true" ]; then
    exit 1
fi
