#!/usr/bin/env bash
# Makes sure Playwright can drive a Chromium: Playwright's own build first (the normal path),
# else a system Chromium, installed from Debian's packages together with the fonts real
# documents need when apt is available; and LibreOffice for Office files. Idempotent; prints
# what it chose.
set -u
py="${1:-.venv/bin/python}"

fonts_missing() {
  command -v fc-list >/dev/null 2>&1 || return 0
  for family in "DejaVu Sans" "Liberation Serif" "Noto Sans CJK" "Noto Color Emoji"; do
    fc-list | grep -q "$family" || return 0
  done
  return 1
}

apt_install() {
  command -v apt-get >/dev/null 2>&1 || return 1
  local sudo=""
  [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo="sudo -n"; } || return 1
  echo "install-browser: installing $* with apt-get"
  $sudo apt-get update -qq >/dev/null &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# The suite's multi-host tests build network namespaces with iproute2 (they need root).
if [ "$(id -u)" = 0 ] && ! command -v ip >/dev/null 2>&1; then
  apt_install iproute2 || echo "install-browser: could not install iproute2; the multi-host tests will fail"
fi
# bench.dbcost (part of the suite's benchmark run) starts a PostgreSQL of its own with
# pg_stat_statements, which the wheel's server lacks: Debian's server package has it.
if [ "$(id -u)" = 0 ] && ! ls /usr/lib/postgresql/*/lib/pg_stat_statements.so >/dev/null 2>&1; then
  apt_install postgresql || echo "install-browser: could not install postgresql; bench.dbcost will fail"
fi
# Office files (the office source) are converted by LibreOffice's headless packages, driven
# over UNO by the system Python (python3-uno is built for /usr/bin/python3).
if ! [ -x /usr/lib/libreoffice/program/soffice.bin ] || ! /usr/bin/python3 -c "import uno" 2>/dev/null; then
  apt_install libreoffice-writer-nogui libreoffice-calc-nogui libreoffice-impress-nogui python3-uno ||
    echo "install-browser: could not install LibreOffice; office jobs will fail"
fi
fonts="fonts-dejavu-core fonts-liberation fonts-noto-core fonts-noto-cjk fonts-noto-color-emoji fontconfig"

if timeout 300 "$py" -m playwright install chromium >/dev/null 2>&1; then
  echo "install-browser: using Playwright's own Chromium"
  fonts_missing && { apt_install $fonts || echo "install-browser: could not install fonts; CJK or emoji text may not render"; }
  exit 0
fi

echo "install-browser: Playwright's browser download is not available here; using a system Chromium"
# Debian's headless shell first (what Pressroom prefers: the same PDFs for about half the CPU),
# and the full chromium beside it (the fallback, and what the dashboard tests drive).
if ! command -v chromium-headless-shell >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1 ||
  fonts_missing; then
  apt_install chromium-headless-shell chromium $fonts || true
fi
found=""
for name in "${PRESSROOM_CHROMIUM:-}" chromium-headless-shell chromium chromium-browser google-chrome; do
  [ -n "$name" ] && command -v "$name" >/dev/null 2>&1 && found=$(command -v "$name") && break
done
if [ -z "$found" ]; then
  echo "install-browser: no Chromium found; install one and set PRESSROOM_CHROMIUM=/path/to/chrome" >&2
  exit 1
fi
echo "install-browser: using $found"
