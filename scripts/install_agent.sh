#!/usr/bin/env bash
# Install the mtc node agent on this node as a systemd service (docs/agent.md). Idempotent:
# a second run with the same arguments changes nothing and says so; a changed config or unit
# restarts the agent.
#
#   scripts/install_agent.sh --transport pubsub --project my-proj [--node-id ID] [--dry-run]
#   scripts/install_agent.sh --transport api --api-url http://10.0.0.2:8080 \
#       --cluster projects/p/locations/l/modelDevelopmentClusters/c1 --token-file ./token
#
# Options:
#   --transport pubsub|api   how reports leave the node (default pubsub)
#   --project P              Pub/Sub project (default: the VM's own, from its credentials)
#   --topic T                Pub/Sub topic (default mtc-node)
#   --api-url URL --cluster NAME --token-file FILE   the embedded default's API and a token
#                            (mint it with `mtc token create --role node-agent --name N`;
#                            copied to /etc/mtc/agent.token, mode 0600, passed to the
#                            service as a systemd credential)
#   --node-id ID             default: this host's name
#   --node-type T            selects the speed-check baseline
#   --package SPEC           what pip installs (default "mtc[agent]"; a path: "/src/mtc[agent]")
#   --prefix DIR             venv location (default /opt/mtc-agent)
#   --root DIR               install under DIR instead of / (packaging, tests); implies --no-start
#   --no-pip                 leave the venv alone (neither create it nor install into it)
#   --no-start               write files only; do not call systemctl
#   --dry-run                print what would be done, change nothing
#
# The "agent" extra (declared in pyproject.toml) holds only what the agent imports: no
# matplotlib, no simpy. Identity: with --transport pubsub nothing is written but the
# config; the agent uses the machine's Application Default Credentials (the VM's service
# account, which needs roles/pubsub.publisher on the topic). No key file is ever installed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRANSPORT=pubsub PROJECT="" TOPIC=mtc-node API_URL="" CLUSTER="" TOKEN_SRC=""
NODE_ID="$(hostname)" NODE_TYPE="" PACKAGE="mtc[agent]" PREFIX=/opt/mtc-agent ROOT=""
DRY=0 PIP=1 START=1
UNIT=mtc-node-agent.service

die() { echo "install_agent: $*" >&2; exit 2; }
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }

while (($#)); do
    case "$1" in
        --transport) need "$@"; TRANSPORT="$2"; shift 2 ;;
        --project) need "$@"; PROJECT="$2"; shift 2 ;;
        --topic) need "$@"; TOPIC="$2"; shift 2 ;;
        --api-url) need "$@"; API_URL="$2"; shift 2 ;;
        --cluster) need "$@"; CLUSTER="$2"; shift 2 ;;
        --token-file) need "$@"; TOKEN_SRC="$2"; shift 2 ;;
        --node-id) need "$@"; NODE_ID="$2"; shift 2 ;;
        --node-type) need "$@"; NODE_TYPE="$2"; shift 2 ;;
        --package) need "$@"; PACKAGE="$2"; shift 2 ;;
        --prefix) need "$@"; PREFIX="$2"; shift 2 ;;
        --root) need "$@"; ROOT="$2"; START=0; shift 2 ;;
        --no-pip) PIP=0; shift ;;
        --no-start) START=0; shift ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

case "$TRANSPORT" in
    pubsub) ;;
    api) [[ -n "$API_URL" && -n "$CLUSTER" && -n "$TOKEN_SRC" ]] ||
            die "--transport api needs --api-url, --cluster and --token-file" ;;
    *) die "--transport must be pubsub or api, not '$TRANSPORT'" ;;
esac
[[ "$NODE_ID" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "--node-id '$NODE_ID' is not a node name"
[[ -z "$TOKEN_SRC" || -f "$TOKEN_SRC" ]] || die "--token-file $TOKEN_SRC does not exist"

ETC="$ROOT/etc/mtc"
UNIT_DIR="$ROOT/etc/systemd/system"
VENV="$ROOT$PREFIX/venv"
STATE=/var/lib/mtc-agent  # the unit's StateDirectory
CHANGED=0

run() {  # run CMD...: print it; run it unless --dry-run
    printf '+'; printf ' %q' "$@"; printf '\n'
    ((DRY)) || "$@"
}

put() {  # put MODE DEST: stdin to DEST atomically, only when its content differs
    local mode="$1" dest="$2" tmp
    tmp="$(mktemp)"
    cat >"$tmp"
    if [[ -f "$dest" ]] && cmp -s "$tmp" "$dest" &&
       [[ "$(stat -c %a "$dest")" == "${mode#0}" ]]; then
        echo "= $dest unchanged"
        rm -f "$tmp"
        return
    fi
    CHANGED=1
    if ((DRY)); then
        echo "+ write $dest (mode $mode)"
        sed 's/^/|   /' "$tmp"
        rm -f "$tmp"
        return
    fi
    mkdir -p "$(dirname "$dest")"
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$dest"
    echo "+ wrote $dest (mode $mode)"
}

# 1. the venv and the package (pip is idempotent: an installed version is kept)
if ((PIP)); then
    if [[ ! -x "$VENV/bin/python" ]]; then
        run python3 -m venv "$VENV"
        CHANGED=1
    fi
    run "$VENV/bin/pip" install --quiet --upgrade-strategy only-if-needed "$PACKAGE"
fi

# 2. the config (no secret in it: 0644)
python3 - "$TRANSPORT" "$PROJECT" "$TOPIC" "$API_URL" "$CLUSTER" "$NODE_ID" "$NODE_TYPE" \
    "$STATE" <<'EOF' | put 0644 "$ETC/agent.json"
import json, sys
transport, project, topic, api_url, cluster, node_id, node_type, state = sys.argv[1:]
delivery = {"transport": transport, "spool_path": f"{state}/spool.sqlite3"}
if transport == "pubsub":
    delivery.update({"project": project, "topic": topic} if project else {"topic": topic})
else:
    delivery.update({"api_url": api_url, "cluster": cluster,
                     "token_file": "/run/credentials/mtc-node-agent.service/token"})
config = {"node_id": node_id, "xid_cursor_path": f"{state}/xid.cursor", "delivery": delivery}
if node_type:
    config["node_type"] = node_type
print(json.dumps(config, indent=2, sort_keys=True))
EOF

# 3. the token (api only), then the unit and its drop-in
if [[ "$TRANSPORT" == api ]]; then
    put 0600 "$ETC/agent.token" <"$TOKEN_SRC"
    printf '[Service]\nLoadCredential=token:/etc/mtc/agent.token\n' |
        put 0644 "$UNIT_DIR/$UNIT.d/credentials.conf"
fi
sed "s|/opt/mtc-agent|$PREFIX|g" "$HERE/deploy/systemd/$UNIT" | put 0644 "$UNIT_DIR/$UNIT"

# 4. enable and (re)start
if ((START)); then
    run systemctl daemon-reload
    run systemctl enable "$UNIT"
    if ((CHANGED)); then
        run systemctl restart "$UNIT"
    else
        run systemctl start "$UNIT"  # a no-op when it runs
    fi
fi
if ((!CHANGED)); then
    echo "install_agent: unchanged"
elif ((DRY)); then
    echo "install_agent: dry run, nothing changed (would install $TRANSPORT)"
else
    echo "install_agent: installed ($TRANSPORT)"
fi
