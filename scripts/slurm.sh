#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests that run under srun and sbatch.
#
#   bash scripts/slurm.sh start    # install (apt) Slurm and munge, configure, start, wait for idle
#   bash scripts/slurm.sh stop     # stop slurmd, slurmctld and munged
#   bash scripts/slurm.sh status   # print sinfo
#
# Needs root (apt, daemons, /etc). Safe to run twice: what is installed is not reinstalled, the
# configuration is rewritten from this machine (host name, CPU topology), and daemons already
# running are restarted only when the configuration changed. The node gets
# OverSubscribe=FORCE:4, so `srun -n 4 --overcommit` runs 4 tasks on 2 cores.
set -euo pipefail

conf_dir=/etc/slurm
spool=/var/spool/slurm
logs=/var/log/slurm
host=$(hostname -s)

die() { echo "scripts/slurm.sh: $*" >&2; exit 1; }

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        return
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

start_munge() {
    mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
    chmod 0700 /etc/munge
    chmod 0400 /etc/munge/munge.key
    chmod 0755 /run/munge
    if ! pgrep -x munged >/dev/null; then
        runuser -u munge -- munged
    fi
    for _ in $(seq 50); do
        munge -n </dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.1
    done
    die "munged did not start (see /var/log/munge/munged.log)"
}

# The node line must match what slurmd finds (`slurmd -C`), or the node comes up invalid.
node_line() {
    local cpus sockets cores threads
    cpus=$(nproc --all)
    sockets=$(lscpu | awk -F: '/^Socket\(s\)/ {gsub(/ /, "", $2); print $2}')
    cores=$(lscpu | awk -F: '/^Core\(s\) per socket/ {gsub(/ /, "", $2); print $2}')
    threads=$(lscpu | awk -F: '/^Thread\(s\) per core/ {gsub(/ /, "", $2); print $2}')
    echo "NodeName=$host CPUs=$cpus Sockets=${sockets:-1} CoresPerSocket=${cores:-$cpus} ThreadsPerCore=${threads:-1} State=UNKNOWN"
}

write_config() {
    mkdir -p "$conf_dir" "$spool/ctld" "$spool/d" "$logs"
    local new
    new=$(cat <<EOF
# Written by distcomm's scripts/slurm.sh for this machine; rewritten on every start.
ClusterName=distcomm
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$spool/ctld
SlurmdSpoolDir=$spool/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd.log
SchedulerType=sched/backfill
$(node_line)
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
)
    if [ -f "$conf_dir/slurm.conf" ] && [ "$(cat "$conf_dir/slurm.conf")" = "$new" ]; then
        return 1  # unchanged
    fi
    printf '%s\n' "$new" >"$conf_dir/slurm.conf"
    return 0
}

wait_idle() {
    local state=""
    for _ in $(seq 120); do
        state=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -n 1 || true)
        case "$state" in
            idle | mixed | allocated) return ;;
            drain* | down* | inval*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.5
    done
    die "node $host is '${state:-unknown}', not idle, after 60 s (see $logs/slurmd.log, $logs/slurmctld.log)"
}

start() {
    [ "$(id -u)" -eq 0 ] || die "needs root (apt-get, daemons, /etc/slurm)"
    install
    start_munge
    if write_config; then
        stop_daemons slurmd slurmctld  # a new configuration: daemons started with the old one restart
    fi
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    wait_idle
    echo "scripts/slurm.sh: node $host is idle ($(nproc) CPUs, up to 4 tasks per CPU with --overcommit)"
}

# Stop the named daemons: SIGTERM, then SIGKILL for those still there after 5 s.
stop_daemons() {
    local daemons=("${@:-slurmd}")
    for daemon in "${daemons[@]}"; do
        pkill -x "$daemon" 2>/dev/null || true
    done
    for _ in $(seq 50); do
        local alive=0
        for daemon in "${daemons[@]}"; do
            pgrep -x "$daemon" >/dev/null && alive=1
        done
        [ "$alive" -eq 0 ] && return 0
        sleep 0.1
    done
    for daemon in "${daemons[@]}"; do
        pkill -9 -x "$daemon" 2>/dev/null || true
    done
}

stop() {
    stop_daemons slurmd slurmctld
    stop_daemons munged
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) sinfo ;;
    *) die "usage: bash scripts/slurm.sh start|stop|status" ;;
esac
