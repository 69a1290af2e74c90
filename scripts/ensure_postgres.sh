#!/usr/bin/env bash
# Make sure PostgreSQL's server binaries (initdb, postgres) are on the machine, for
# the PostgreSQL meta store's tests (tests/test_meta_postgres.py start a throwaway
# server of their own on loopback; nothing is started here).
#
#   1. an existing /usr/lib/postgresql/<version>/bin/initdb: nothing to do;
#   2. with apt-get, as root (or with password-less sudo): install Debian's
#      `postgresql` package (an `apt-get update` first only if the install fails);
#   3. otherwise say how to install it; the tests then fail naming what is missing.
set -uo pipefail

log() { echo "ensure_postgres: $*" >&2; }

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
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
        log "installing Debian's postgresql package (for the meta store tests)"
        export DEBIAN_FRONTEND=noninteractive
        if "${apt_get[@]}" install -y -q postgresql </dev/null >&2 \
            || { "${apt_get[@]}" update -q </dev/null >&2 \
                 && "${apt_get[@]}" install -y -q postgresql </dev/null >&2; }; then
            exit 0
        fi
    fi
fi
log "PostgreSQL's server is not installed and could not be installed here;"
log "install it (Debian/Ubuntu: apt-get install postgresql) for tests/test_meta_postgres.py"
exit 0
