#!/usr/bin/env bash
# A real, single-host Slurm cluster for integration tests and the "plain drain" baseline.
#
#   scripts/slurm/cluster.sh start|stop|status|env
#
# Four static nodes n[1-4] and two power-saving cloud nodes c[1-2], all slurmd processes on
# 127.0.0.1 with distinct ports, one slurmctld, a private munged and (where the slurmrestd
# package is installed) slurmrestd on 127.0.0.1:BASE+20 with JWT auth (AuthAltTypes=auth/jwt,
# key $STATE/etc/jwt_hs256.key; tokens from `scontrol token`), running as user nobody. Everything lives in a
# state dir ($MTC_SLURM_DIR, default /tmp/mtc-slurm); every PID we start is recorded under
# $STATE/pids and `stop` kills exactly those (after cancelling this cluster's jobs).
# Clients need SLURM_CONF=$STATE/etc/slurm.conf (`cluster.sh env` prints the export lines, and
# MTC_SLURMRESTD_URL for mtc's Slurm Job API).
#
# Optional environment:
#   MTC_SLURM_DIR                    state dir (default /tmp/mtc-slurm)
#   MTC_SLURM_PORT_BASE              slurmctld port = BASE, slurmd ports BASE+1.. (default 17000)
#   MTC_SLURM_HEALTHCHECK_PROGRAM    absolute path: becomes HealthCheckProgram
#   MTC_SLURM_HEALTHCHECK_INTERVAL   seconds (default 5)
#   MTC_SLURM_START_TIMEOUT          seconds to wait for 4 idle nodes (default 60)
#   MTC_SLURM_KEEP_STATE=1           recover jobs and node states on a cold start (default: clean)
set -euo pipefail

STATE="${MTC_SLURM_DIR:-/tmp/mtc-slurm}"
PORT_BASE="${MTC_SLURM_PORT_BASE:-17000}"
START_TIMEOUT="${MTC_SLURM_START_TIMEOUT:-60}"
HC_PROGRAM="${MTC_SLURM_HEALTHCHECK_PROGRAM:-}"
HC_INTERVAL="${MTC_SLURM_HEALTHCHECK_INTERVAL:-5}"

STATIC_NODES=(n1 n2 n3 n4)
CONF="$STATE/etc/slurm.conf"
PIDS="$STATE/pids"
MUNGE_DIR="$STATE/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
MUNGE_KEY="$MUNGE_DIR/munge.key"
JWT_KEY="$STATE/etc/jwt_hs256.key"
RESTD_PORT=$((PORT_BASE + 20))
RESTD_USER="${MTC_SLURMRESTD_RUN_AS:-nobody}"  # slurmrestd refuses root and SlurmUser

export SLURM_CONF="$CONF"
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

log() { printf '[cluster.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------------------- install
have_binaries() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
        command -v sinfo >/dev/null && command -v munged >/dev/null
}

install_packages() {
    have_binaries && { have_restd || install_restd; return 0; }
    [[ $(id -u) -eq 0 ]] || die "slurm is not installed and we are not root to apt-get it"
    command -v apt-get >/dev/null || die "slurm is not installed and apt-get is missing"
    local pkgs=(slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin munge)
    log "installing ${pkgs[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    # Refresh the package lists only when an install from the current ones fails (or none exist).
    if ! ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 ||
        ! apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${pkgs[@]}" >"$STATE/log/apt.log" 2>&1; then
        log "apt-get install failed or no package lists: running apt-get update first"
        apt-get update -q -o DPkg::Lock::Timeout=300 >>"$STATE/log/apt.log" 2>&1 || die "apt-get update failed, see $STATE/log/apt.log"
        apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${pkgs[@]}" >>"$STATE/log/apt.log" 2>&1 ||
            die "apt-get install failed, see $STATE/log/apt.log"
    fi
    have_binaries || die "slurm binaries still missing after install"
}

have_restd() {  # slurmrestd and the auth/jwt plugin slurmctld needs to check its tokens
    command -v slurmrestd >/dev/null && compgen -G "/usr/lib/*/slurm-wlm/auth_jwt.so" >/dev/null
}

install_restd() {  # the Slurm Job API's backend; the cluster runs without it (tests skip)
    [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null || return 0
    log "installing slurmrestd and slurm-wlm-jwt-plugin with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends \
        slurmrestd slurm-wlm-jwt-plugin >>"$STATE/log/apt.log" 2>&1 ||
        log "slurmrestd could not be installed (see $STATE/log/apt.log)"
}

# ---------------------------------------------------------------------------- pids
pid_alive() {  # pid_alive PID EXPECTED_COMM_SUBSTRING
    local pid=$1 want=$2
    [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
    tr '\0' ' ' </proc/"$pid"/cmdline | grep -q -- "$want"
}

recorded_alive() {  # recorded_alive NAME  (pid file $PIDS/NAME.pid; comm from NAME prefix)
    local name=$1 pid
    [[ -r $PIDS/$name.pid ]] || return 1
    pid=$(<"$PIDS/$name.pid")
    pid_alive "$pid" "${name%%-*}"
}

wait_for_pidfile() {  # wait_for_pidfile FILE TIMEOUT_S -> prints pid
    local file=$1 deadline=$((SECONDS + $2))
    while ((SECONDS < deadline)); do
        if [[ -s $file ]]; then cat "$file"; return 0; fi
        sleep 0.05
    done
    return 1
}

# ---------------------------------------------------------------------------- config
write_helpers() {
    mkdir -p "$STATE/bin"
    # Exec a command with every signal unblocked and at its default action: slurmctld runs the
    # power-saving programs with signals blocked, and a slurmd inheriting that ignores SIGTERM.
    cat >"$STATE/bin/unblock-exec" <<'EOF'
#!/usr/bin/perl
use strict; use warnings; use POSIX ();
POSIX::sigprocmask(POSIX::SIG_SETMASK(), POSIX::SigSet->new()) or die "sigprocmask: $!";
for my $sig (keys %SIG) { next if $sig =~ /^(KILL|STOP|__)/; local $@; eval { $SIG{$sig} = 'DEFAULT' }; }
exec { $ARGV[0] } @ARGV or die "exec $ARGV[0]: $!";
EOF
    # start-slurmd NODE [-b]: start one node's slurmd (daemonizes) and record its PID.
    cat >"$STATE/bin/start-slurmd" <<EOF
#!/bin/bash
# Runs from cluster.sh and from slurmctld/slurmd with an empty environment: absolute paths only.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF=$CONF
node=\$1; shift
# A "boot" (-b) must register at least a second after slurmctld asked for the reboot or power
# up: slurmctld compares whole-second boot times and ignores a node that seems to have booted
# before the request, which then times out (ResumeTimeout) and goes DOWN. Also a fair
# stand-in for boot time.
echo \$\$ >$PIDS/starting-\$node.pid  # cluster.sh stop waits for us (a reboot in flight)
trap 'rm -f $PIDS/starting-\$node.pid' EXIT
[[ " \$* " == *" -b "* ]] && sleep 2
# cluster.sh stop is under way: a reboot or power-up must not bring a slurmd back after it
[[ -e $STATE/run/stopping ]] && exit 0
mkdir -p $STATE/spool/\$node
rm -f $STATE/run/slurmd-\$node.pid
/usr/bin/env -i PATH=\$PATH SLURM_CONF=$CONF /usr/bin/perl $STATE/bin/unblock-exec /usr/sbin/slurmd -f $CONF -N "\$node" "\$@" </dev/null >>$STATE/log/slurmd-\$node.out 2>&1
for _ in \$(seq 1 200); do
    if [[ -s $STATE/run/slurmd-\$node.pid ]]; then
        cp $STATE/run/slurmd-\$node.pid $PIDS/slurmd-\$node.pid
        exit 0
    fi
    sleep 0.05
done
echo "slurmd \$node wrote no pid file" >&2
exit 1
EOF
    # stop-slurmd NODE: kill the recorded slurmd of one node and wait for it to go.
    cat >"$STATE/bin/stop-slurmd" <<EOF
#!/bin/bash
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
node=\$1
pidfile=$PIDS/slurmd-\$node.pid
[[ -r \$pidfile ]] || exit 0
pid=\$(<\$pidfile)
if [[ -r /proc/\$pid/cmdline ]] && tr '\0' ' ' </proc/\$pid/cmdline | grep -q "slurmd .*-N \$node"; then
    kill -TERM "\$pid" 2>/dev/null || true
    for _ in \$(seq 1 100); do [[ -e /proc/\$pid ]] || break; sleep 0.05; done
    [[ -e /proc/\$pid ]] && kill -KILL "\$pid" 2>/dev/null
fi
rm -f "\$pidfile"
exit 0
EOF
    # ResumeProgram / SuspendProgram: slurmctld passes a hostlist expression such as c[1-2].
    cat >"$STATE/bin/resume" <<EOF
#!/bin/bash
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF=$CONF
echo "\$(date +%T) resume \$*" >>$STATE/log/power.log
for node in \$(/usr/bin/scontrol show hostnames "\$1"); do
    $STATE/bin/start-slurmd "\$node" -b >>$STATE/log/power.log 2>&1 &
done
wait
EOF
    cat >"$STATE/bin/suspend" <<EOF
#!/bin/bash
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF=$CONF
echo "\$(date +%T) suspend \$*" >>$STATE/log/power.log
for node in \$(/usr/bin/scontrol show hostnames "\$1"); do
    $STATE/bin/stop-slurmd "\$node"
done
EOF
    # RebootProgram: run by the node's own slurmd. Find which node from the parent slurmd's
    # command line, then (detached, so killing slurmd does not kill us) restart it with -b.
    cat >"$STATE/bin/reboot" <<EOF
#!/bin/bash
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF=$CONF
node=\${SLURMD_NODENAME:-}
pid=\$PPID
for _ in 1 2 3 4 5 6; do
    [[ -n \$node || -z \$pid || \$pid -le 1 ]] && break
    node=\$(tr '\0' '\n' </proc/\$pid/cmdline 2>/dev/null | sed -n '/^-N\$/{n;p;q}')
    pid=\$(awk '{print \$4}' /proc/\$pid/stat 2>/dev/null)
done
echo "\$(date +%T) reboot node=\$node ppid=\$PPID" >>$STATE/log/power.log
[[ -n \$node ]] || exit 1
/usr/bin/setsid /bin/bash -c "sleep 0.5; $STATE/bin/stop-slurmd \$node; $STATE/bin/start-slurmd \$node -b" \
    </dev/null >>$STATE/log/power.log 2>&1 &
exit 0
EOF
    chmod 0755 "$STATE/bin/"*
}

write_conf() {
    local hc="" jwt=""
    if have_restd; then
        jwt="AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY"
    fi
    if [[ -n $HC_PROGRAM ]]; then
        hc="HealthCheckProgram=$HC_PROGRAM
HealthCheckInterval=$HC_INTERVAL
HealthCheckNodeState=ANY"
    fi
    mkdir -p "$STATE/etc"
    cat >"$CONF.tmp" <<EOF
# Written by scripts/slurm/cluster.sh; rewritten on every cold start.
ClusterName=mtc
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT_BASE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10,socket=$MUNGE_SOCKET
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
MailProg=/bin/true
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SlurmdTimeout=10
SlurmctldTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
ReturnToService=2
JobRequeue=1
RebootProgram=$STATE/bin/reboot
ResumeProgram=$STATE/bin/resume
SuspendProgram=$STATE/bin/suspend
SuspendTime=600
SuspendExcNodes=n[1-4]
SuspendTimeout=5
ResumeTimeout=30
PrivateData=cloud
TreeWidth=65533
$jwt
$hc
NodeName=n[1-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT_BASE + 1))-$((PORT_BASE + 4)) CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=c[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT_BASE + 11))-$((PORT_BASE + 12)) CPUs=2 RealMemory=1000 State=CLOUD
PartitionName=main Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP
PartitionName=cloud Nodes=c[1-2] Default=NO MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

# ---------------------------------------------------------------------------- daemons
start_munged() {
    recorded_alive munged && return 0
    getent passwd munge >/dev/null || die "user munge missing (is the munge package installed?)"
    install -d -o munge -g munge -m 0711 "$MUNGE_DIR"
    if [[ ! -s $MUNGE_KEY ]]; then
        log "creating munge key $MUNGE_KEY"
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$MUNGE_KEY" --force
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
        fi
    fi
    chown munge:munge "$MUNGE_KEY"
    chmod 0400 "$MUNGE_KEY"
    rm -f "$MUNGE_DIR/munged.pid"
    runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" \
        --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed" || die "munged failed, see $MUNGE_DIR/munged.log"
    local pid
    pid=$(wait_for_pidfile "$MUNGE_DIR/munged.pid" 10) || die "munged wrote no pid file"
    echo "$pid" >"$PIDS/munged.pid"
    log "munged pid $pid"
}

write_jwt_key() {  # slurmctld signs and checks the tokens with it; only root reads it
    have_restd || return 0
    [[ -s $JWT_KEY ]] || { (umask 077; dd if=/dev/urandom of="$JWT_KEY" bs=32 count=1 status=none); }
    chmod 0600 "$JWT_KEY"
}

start_slurmrestd() {
    have_restd || { log "slurmrestd (or its jwt plugin) not installed: no Slurm REST API"; return 0; }
    recorded_alive slurmrestd && return 0
    getent passwd "$RESTD_USER" >/dev/null || { log "user $RESTD_USER missing: no slurmrestd"; return 0; }
    # SLURM_JWT=daemon: slurmrestd passes each client's token on to slurmctld (rest_auth/jwt)
    /usr/bin/setsid /usr/sbin/runuser -u "$RESTD_USER" -- /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/bin \
        SLURM_CONF="$CONF" SLURM_JWT=daemon /usr/sbin/slurmrestd -a rest_auth/jwt -s openapi/v0.0.38 \
        "127.0.0.1:$RESTD_PORT" </dev/null >>"$STATE/log/slurmrestd.log" 2>&1 &
    local pid=$! deadline=$((SECONDS + 10))
    while ((SECONDS < deadline)); do  # runuser execs nothing itself: find its slurmrestd child
        local child
        child=$(pgrep -P "$pid" -x slurmrestd 2>/dev/null || true)
        [[ -z $child ]] && pid_alive "$pid" slurmrestd && child=$pid
        if [[ -n $child ]] && (exec 3<>"/dev/tcp/127.0.0.1/$RESTD_PORT") 2>/dev/null; then
            echo "$child" >"$PIDS/slurmrestd.pid"
            log "slurmrestd pid $child on 127.0.0.1:$RESTD_PORT"
            return 0
        fi
        sleep 0.1
    done
    log "slurmrestd did not come up (see $STATE/log/slurmrestd.log)"
}

start_slurmctld() {
    recorded_alive slurmctld && return 0
    rm -f "$STATE/run/slurmctld.pid"
    local clean=(-c)
    [[ ${MTC_SLURM_KEEP_STATE:-0} == 1 ]] && clean=()
    /usr/bin/perl "$STATE/bin/unblock-exec" /usr/sbin/slurmctld -f "$CONF" "${clean[@]}" \
        </dev/null >>"$STATE/log/slurmctld.out" 2>&1 || die "slurmctld failed, see $STATE/log/slurmctld.log"
    local pid
    pid=$(wait_for_pidfile "$STATE/run/slurmctld.pid" 10) || die "slurmctld wrote no pid file"
    echo "$pid" >"$PIDS/slurmctld.pid"
    log "slurmctld pid $pid"
}

start_slurmds() {
    local node
    for node in "${STATIC_NODES[@]}"; do
        recorded_alive "slurmd-$node" && continue
        "$STATE/bin/start-slurmd" "$node" || die "slurmd $node failed, see $STATE/log/slurmd-$node.log"
        log "slurmd $node pid $(<"$PIDS/slurmd-$node.pid")"
    done
}

wait_idle() {
    local deadline=$((SECONDS + START_TIMEOUT)) states
    while ((SECONDS < deadline)); do
        states=$(sinfo -h -N -n "n[1-4]" -o '%N %t' 2>/dev/null | sort -u || true)
        if [[ $(grep -c ' idle$' <<<"$states") -eq ${#STATIC_NODES[@]} ]]; then
            return 0
        fi
        sleep 0.2
    done
    log "static nodes not all idle after ${START_TIMEOUT}s:"
    printf '%s\n' "$states" >&2
    return 1
}

all_running() {
    recorded_alive munged && recorded_alive slurmctld || return 1
    local node
    for node in "${STATIC_NODES[@]}"; do recorded_alive "slurmd-$node" || return 1; done
}

cmd_start() {
    local t_start
    t_start=$(date +%s.%N)
    mkdir -p "$STATE"/{log,run,pids,ctld,spool,etc}
    rm -f "$STATE/run/stopping"
    chmod 0755 "$STATE"  # munged runs as user munge and must reach its socket dir below
    if all_running; then
        # A no-op: nodes may be drained or busy on purpose, so do not wait for idle here.
        log "already running"
        return 0
    fi
    install_packages
    if ! recorded_alive slurmctld; then
        write_helpers
        write_conf
    fi
    write_jwt_key
    start_munged
    start_slurmctld
    start_slurmds
    wait_idle || die "cluster did not come up; logs in $STATE/log"
    start_slurmrestd
    log "up: 4 static nodes idle after $(awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')s (SLURM_CONF=$CONF)"
}

kill_recorded() {  # kill_recorded NAME...: SIGTERM them all at once, wait, SIGKILL stragglers
    local name pid file pids=() names=()
    for name in "$@"; do
        file=$PIDS/$name.pid
        [[ -r $file ]] || continue
        pid=$(<"$file")
        if pid_alive "$pid" "${name%%-*}"; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
            names+=("$name")
        fi
        rm -f "$file"
    done
    local deadline=$((SECONDS + 10)) i alive
    while ((SECONDS < deadline)); do
        alive=0
        for pid in "${pids[@]}"; do [[ -e /proc/$pid ]] && alive=1; done
        ((alive)) || return 0
        sleep 0.1
    done
    for i in "${!pids[@]}"; do
        if [[ -e /proc/${pids[$i]} ]]; then
            log "${names[$i]} (${pids[$i]}) ignored SIGTERM: SIGKILL"
            kill -KILL "${pids[$i]}" 2>/dev/null || true
        fi
    done
}

cmd_stop() {
    [[ -d $PIDS ]] || { log "nothing recorded in $PIDS"; return 0; }
    touch "$STATE/run/stopping"
    # Cancel this cluster's jobs first so no slurmstepd or job process outlives the cluster.
    if recorded_alive slurmctld; then
        local jobs
        jobs=$(timeout 10 squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: $(tr '\n' ' ' <<<"$jobs")"
            # shellcheck disable=SC2086
            timeout 10 scancel $jobs 2>/dev/null || true
            local deadline=$((SECONDS + 15))
            while ((SECONDS < deadline)) && [[ -n $(timeout 5 squeue -h -o %i 2>/dev/null || true) ]]; do
                sleep 0.2
            done
        fi
    fi
    local f daemons=() deadline=$((SECONDS + 15))
    # A reboot or power-up in flight starts its slurmd a few seconds late: wait for those
    # helpers to finish (they see the stopping marker) so their slurmd is recorded or never started.
    for f in "$PIDS"/starting-*.pid; do
        [[ -e $f ]] || continue
        while ((SECONDS < deadline)) && [[ -e $f ]] && pid_alive "$(<"$f")" start-slurmd; do sleep 0.1; done
        rm -f "$f"
    done
    for f in "$PIDS"/slurmd-*.pid; do
        [[ -e $f ]] && daemons+=("$(basename "$f" .pid)")
    done
    kill_recorded slurmrestd
    kill_recorded "${daemons[@]}" slurmctld
    kill_recorded munged  # last: the others authenticate through it while shutting down
    log "stopped"
}

cmd_status() {
    local rc=0 f name
    for f in "$PIDS"/*.pid; do
        [[ -e $f ]] || continue
        name=$(basename "$f" .pid)
        if recorded_alive "$name"; then echo "$name running pid $(<"$f")"; else echo "$name DEAD (pid $(<"$f"))"; rc=1; fi
    done
    if all_running; then
        sinfo -N -o '%N %P %t %E' 2>/dev/null || true
        return $rc
    fi
    echo "cluster not running"
    return 3
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env)
        echo "export SLURM_CONF=$CONF"
        recorded_alive slurmrestd && echo "export MTC_SLURMRESTD_URL=http://127.0.0.1:$RESTD_PORT"
        ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
