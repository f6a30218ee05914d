#!/usr/bin/env bash
# The system tools the tests drive for real: headless Chromium and its driver (the console's
# browser test) and a Prometheus server (the metrics scrape test). Installs only what is missing;
# `apt-get update` only when an install fails without it. Needs root (CI and these machines are).
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
command -v prometheus >/dev/null || need+=(prometheus)
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
    echo "install_test_tools: missing ${need[*]}; install them first, as root:" >&2
    echo "    sudo bash scripts/install_test_tools.sh" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
opts=(-y -q -o DPkg::Lock::Timeout=300 --no-install-recommends)
if ! apt-get install "${opts[@]}" "${need[@]}" >/tmp/mtc-apt.log 2>&1; then
    apt-get update -q -o DPkg::Lock::Timeout=300 >>/tmp/mtc-apt.log 2>&1
    apt-get install "${opts[@]}" "${need[@]}" >>/tmp/mtc-apt.log 2>&1
fi
echo "install_test_tools: installed ${need[*]}"
