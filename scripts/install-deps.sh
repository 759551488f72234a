#!/usr/bin/env bash
# Installs the system packages the build needs, only those missing (Debian/Ubuntu, as root), and
# any packages named as arguments (the sanitizer build's clang).
set -euo pipefail
packages=(cmake ninja-build g++ libeigen3-dev nlohmann-json3-dev libcli11-dev libfmt-dev
          doctest-dev libopenmpi-dev openmpi-bin libbenchmark-dev "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
