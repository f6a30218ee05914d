#!/usr/bin/env bash
# The official Pub/Sub and Firestore emulators, on free 127.0.0.1 ports, stopped by PID.
#
#   scripts/emulators.sh start            start both (no-op if the recorded ones still run)
#   scripts/emulators.sh stop             stop exactly the PIDs recorded by start
#   scripts/emulators.sh status           exit 0 if both recorded emulators answer
#   scripts/emulators.sh env              print the environment clients need (export lines)
#   scripts/emulators.sh check            exit 0 if the emulators are installed (3 if not)
#   scripts/emulators.sh workflows-venv   create .venv-wf with workflows-emulator (pinned)
#
# Environment:
#   MTC_EMULATORS_DIR   where PIDs, logs and emulators.env go   (default: var/emulators)
#   GOOGLE_CLOUD_PROJECT  project id the clients use             (default: mtc-local)
#
# The emulators come from the Debian packages google-cloud-cli-pubsub-emulator and
# google-cloud-cli-firestore-emulator (and Java 17); they cannot be installed from a
# registry, so a machine without them gets a clear message and exit status 3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${MTC_EMULATORS_DIR:-$ROOT/var/emulators}"
PROJECT="${GOOGLE_CLOUD_PROJECT:-mtc-local}"
SDK="${MTC_GCLOUD_SDK:-/usr/lib/google-cloud-sdk}"
PUBSUB_BIN="$SDK/platform/pubsub-emulator/bin/cloud-pubsub-emulator"
FIRESTORE_JAR="$SDK/platform/cloud-firestore-emulator/cloud-firestore-emulator.jar"
READY_TIMEOUT_S="${MTC_EMULATORS_READY_TIMEOUT_S:-60}"

die() { echo "emulators: $*" >&2; exit 1; }

check() {
    local missing=()
    command -v java >/dev/null 2>&1 || missing+=("java (Java 17: apt-get install openjdk-17-jre-headless)")
    [[ -x "$PUBSUB_BIN" ]] || missing+=("$PUBSUB_BIN (Debian package google-cloud-cli-pubsub-emulator)")
    [[ -f "$FIRESTORE_JAR" ]] || missing+=("$FIRESTORE_JAR (Debian package google-cloud-cli-firestore-emulator)")
    if ((${#missing[@]})); then
        echo "emulators: not installed on this machine; missing:" >&2
        printf '  - %s\n' "${missing[@]}" >&2
        echo "emulators: they ship with the Google Cloud CLI Debian packages, not with a registry" >&2
        return 3
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

alive() {  # alive PIDFILE: the recorded process still runs
    [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

answers() {  # answers HOST:PORT: the emulator's HTTP root says Ok
    python3 - "$1" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://{sys.argv[1]}/", timeout=1) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

wait_ready() {  # wait_ready NAME HOST:PORT PIDFILE
    local deadline=$((SECONDS + READY_TIMEOUT_S))
    until answers "$2"; do
        alive "$3" || { echo "emulators: $1 exited; its log:" >&2; tail -20 "$DIR/$1.log" >&2; return 1; }
        ((SECONDS < deadline)) || { echo "emulators: $1 not ready after ${READY_TIMEOUT_S}s" >&2; return 1; }
        sleep 0.2
    done
}

write_env() {
    cat >"$DIR/emulators.env" <<EOF
export PUBSUB_EMULATOR_HOST=$(cat "$DIR/pubsub.addr")
export FIRESTORE_EMULATOR_HOST=$(cat "$DIR/firestore.addr")
export GOOGLE_CLOUD_PROJECT=$PROJECT
EOF
}

start() {
    check || exit 3
    mkdir -p "$DIR"
    if alive "$DIR/pubsub.pid" && alive "$DIR/firestore.pid"; then
        write_env
        echo "emulators: already running (pubsub pid $(cat "$DIR/pubsub.pid"), firestore pid $(cat "$DIR/firestore.pid"))"
        return 0
    fi
    stop >/dev/null 2>&1 || true
    local ps_port fs_port
    ps_port="$(free_port)"
    fs_port="$(free_port)"
    # The Pub/Sub wrapper script execs java, so $! is the JVM.
    nohup "$PUBSUB_BIN" --host=127.0.0.1 --port="$ps_port" >"$DIR/pubsub.log" 2>&1 </dev/null &
    echo $! >"$DIR/pubsub.pid"
    echo "127.0.0.1:$ps_port" >"$DIR/pubsub.addr"
    # Firestore: run java directly (killing its wrapper script would leave the JVM running).
    nohup java -cp "$FIRESTORE_JAR" com.google.cloud.datastore.emulator.firestore.CloudFirestore \
        start --host=127.0.0.1 --port="$fs_port" >"$DIR/firestore.log" 2>&1 </dev/null &
    echo $! >"$DIR/firestore.pid"
    echo "127.0.0.1:$fs_port" >"$DIR/firestore.addr"
    if ! wait_ready pubsub "127.0.0.1:$ps_port" "$DIR/pubsub.pid" \
        || ! wait_ready firestore "127.0.0.1:$fs_port" "$DIR/firestore.pid"; then
        stop
        exit 1
    fi
    write_env
    echo "emulators: pubsub 127.0.0.1:$ps_port (pid $(cat "$DIR/pubsub.pid")), firestore 127.0.0.1:$fs_port (pid $(cat "$DIR/firestore.pid"))"
    echo "emulators: environment in $DIR/emulators.env"
}

stop_one() {  # stop_one NAME: TERM the recorded PID, KILL it after 5 s
    local pidfile="$DIR/$1.pid" pid
    [[ -f "$pidfile" ]] || return 0
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
        echo "emulators: stopped $1 (pid $pid)"
    fi
    rm -f "$pidfile" "$DIR/$1.addr"
}

stop() {
    stop_one pubsub
    stop_one firestore
    rm -f "$DIR/emulators.env"
}

status() {
    local ok=0 name
    for name in pubsub firestore; do
        if alive "$DIR/$name.pid" && answers "$(cat "$DIR/$name.addr")"; then
            echo "$name: running at $(cat "$DIR/$name.addr") (pid $(cat "$DIR/$name.pid"))"
        else
            echo "$name: not running"
            ok=1
        fi
    done
    return $ok
}

workflows_venv() {
    # workflows-emulator pins fastapi/starlette versions that conflict with functions-framework,
    # so it lives in its own virtual environment and runs as a CLI.
    local venv="${MTC_WORKFLOWS_VENV:-$ROOT/.venv-wf}"
    local reqs="$ROOT/workflows/emulator-requirements.txt"
    if [[ -x "$venv/bin/workflows-emulator" ]] && cmp -s "$reqs" "$venv/.requirements" 2>/dev/null; then
        echo "$venv/bin/workflows-emulator"
        return 0
    fi
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$reqs" >&2
    cp "$reqs" "$venv/.requirements"
    echo "$venv/bin/workflows-emulator"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) [[ -f "$DIR/emulators.env" ]] && cat "$DIR/emulators.env" || die "not started (no $DIR/emulators.env)" ;;
    check) check ;;
    workflows-venv) workflows_venv ;;
    *) echo "usage: $0 start|stop|status|env|check|workflows-venv" >&2; exit 2 ;;
esac
