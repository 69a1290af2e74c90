#!/usr/bin/env bash
# Make sure headless Chromium and its WebDriver (chromedriver) are on the machine, for
# the browser tests of `sparkfill ui` (tests/test_ui.py start the browser themselves;
# nothing is started here).
#
#   1. chromium and chromedriver on PATH: nothing to do;
#   2. with apt-get, as root (or with password-less sudo): install Debian's `chromium`
#      and `chromium-driver` packages (an `apt-get update` first only if the install
#      fails);
#   3. otherwise say how to install them; the browser tests then fail naming what is
#      missing.
set -uo pipefail

log() { echo "ensure_chromium: $*" >&2; }

if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if command -v apt-get >/dev/null; then
    apt_get=(apt-get)
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            apt_get=(sudo -n apt-get)
        else
            apt_get=()
        fi
    fi
    if [ ${#apt_get[@]} -gt 0 ]; then
        log "installing Debian's chromium and chromium-driver packages (for the UI's browser tests)"
        export DEBIAN_FRONTEND=noninteractive
        if "${apt_get[@]}" install -y -q chromium chromium-driver </dev/null >&2 \
            || { "${apt_get[@]}" update -q </dev/null >&2 \
                 && "${apt_get[@]}" install -y -q chromium chromium-driver </dev/null >&2; }; then
            exit 0
        fi
    fi
fi
log "Chromium or its driver is not installed and could not be installed here;"
log "install them (Debian/Ubuntu: apt-get install chromium chromium-driver) for tests/test_ui.py"
exit 0
