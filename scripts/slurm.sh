#!/usr/bin/env bash
# A private one-node Slurm cluster on this machine, for the tests that run under srun and sbatch.
#
#   bash scripts/slurm.sh start    # install (apt) Slurm and munge, configure, start, wait for idle
#   bash scripts/slurm.sh stop     # stop the daemons this script started, remove its directory
#   bash scripts/slurm.sh status   # print sinfo for the private cluster
#   bash scripts/slurm.sh env      # print `export SLURM_CONF=...`: eval it to use the cluster
#
# The cluster leaves the machine as it found it. Everything lives in one private directory,
# DISTCOMM_SLURM_DIR (default /run/distcomm-slurm: root's own tmpfs, so no other user can plant
# files or links in it the way /tmp allows, and a reboot clears it):
#
#   slurm.conf                      the configuration; daemons and clients find it via SLURM_CONF
#   state/ spool/ log/ run/         slurmctld's state, slurmd's spool, both logs, both pid files
#   munge/                          a private munged: key, socket, pid file, log, seed
#
# It never reads or writes /etc/slurm or /etc/munge, and never talks to a system munged: Slurm
# reaches its own munged through AuthInfo=socket=.... Its ports are not Slurm's defaults (6817,
# 6818), so a system Slurm can run beside it: the first pair of free ports from
# DISTCOMM_SLURM_PORT (default 16817, below Linux's ephemeral range) is used. `stop` stops only
# the daemons this script started, found by their pid files in the private directory, never by
# name, so another slurmd or munged on this machine is left alone. A second cluster runs beside
# the first with another DISTCOMM_SLURM_DIR (its own pid files, spool and ports).
#
# Needs root (apt, daemons that run jobs as any user). Safe to run twice: what is installed is
# not reinstalled, the configuration is rewritten from this machine (host name, CPU topology),
# and daemons already running are restarted only when the configuration changed. The node gets
# OverSubscribe=FORCE:4, so `srun -n 4 --overcommit` runs 4 tasks on 2 cores.
set -euo pipefail

dir=${DISTCOMM_SLURM_DIR:-/run/distcomm-slurm}
base_port=${DISTCOMM_SLURM_PORT:-16817}
marker=$dir/.distcomm-slurm
conf=$dir/slurm.conf
state=$dir/state
spool=$dir/spool
logs=$dir/log
run=$dir/run
munge_dir=$dir/munge
socket=$munge_dir/munge.socket
host=$(hostname -s)
# Every Slurm command below (the daemons, sinfo, scontrol, scancel) reads this, not /etc/slurm.
export SLURM_CONF=$conf

die() { echo "scripts/slurm.sh: $*" >&2; exit 1; }

[[ "$base_port" =~ ^[0-9]+$ ]] && [ "$base_port" -ge 1024 ] && [ "$base_port" -le 65000 ] ||
    die "DISTCOMM_SLURM_PORT=$base_port is not a port number from 1024 to 65000"

need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (apt-get, Slurm and munge daemons)"; }

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        return
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

# Whether process $1 is alive (a zombie is not: nothing may reap it where PID 1 is no init).
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }  # the state follows the command name, which may hold spaces
    [ "${stat%% *}" != Z ]
}

# The pid from pid file $1 if that process is alive and is daemon $2 (a pid reused by another
# program after a crash is not ours); fails otherwise.
own_pid() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    alive "$pid" || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
    echo "$pid"
}

# Stop daemon $1 whose pid file is $2, if it is ours and alive: SIGTERM, then SIGKILL if it is
# still there after 10 s (slurmctld saves its state first).
stop_daemon() {
    local pid
    if pid=$(own_pid "$2" "$1"); then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            kill -KILL "$pid" 2>/dev/null || true
            for _ in $(seq 20); do
                alive "$pid" || break
                sleep 0.1
            done
        fi
    fi
    rm -f "$2"
}

# The private directory: owned by root, not a link (this script writes in it as root; a link
# that someone else made could point it anywhere), and either empty or marked as made here, so
# that a DISTCOMM_SLURM_DIR set to a directory in use (/, /var) is neither filled nor emptied.
make_dir() {
    [ ! -L "$dir" ] || die "$dir is a symbolic link; set DISTCOMM_SLURM_DIR to a root's directory"
    mkdir -p "$dir"
    [ "$(stat -c %u "$dir")" -eq 0 ] || die "$dir is not owned by root"
    if [ ! -f "$marker" ]; then
        [ -z "$(ls -A "$dir")" ] || die "$dir holds files of others; set DISTCOMM_SLURM_DIR"
        echo "A private Slurm cluster of distcomm's scripts/slurm.sh (stop removes it)" >"$marker"
    fi
    # Readable by all: munged (user munge) checks and uses its directory below this one.
    chmod 0755 "$dir"
    mkdir -p "$state" "$spool" "$logs" "$run" "$munge_dir"
}

# A munged of our own, so that a system munged and /etc/munge/munge.key are never touched. It runs
# as user munge (munged refuses root without --force), which must own its key and directory.
start_munge() {
    local key=$munge_dir/munge.key
    if [ ! -s "$key" ]; then
        (umask 077 && dd if=/dev/urandom of="$key" bs=1024 count=1 status=none)
    fi
    chown munge:munge "$munge_dir" "$key"
    chmod 0755 "$munge_dir"  # clients (srun as any user) must reach the socket
    chmod 0400 "$key"
    if ! own_pid "$munge_dir/munged.pid" munged >/dev/null; then
        rm -f "$munge_dir/munged.pid"
        runuser -u munge -- munged --key-file="$key" --socket="$socket" \
            --pid-file="$munge_dir/munged.pid" --log-file="$munge_dir/munged.log" \
            --seed-file="$munge_dir/munged.seed"
    fi
    for _ in $(seq 50); do
        munge -S "$socket" -n </dev/null | unmunge -S "$socket" >/dev/null 2>&1 && return
        sleep 0.1
    done
    die "munged did not start (see $munge_dir/munged.log)"
}

# Whether nobody listens on TCP port $1 (IPv4 or IPv6); read from /proc, so neither ss nor
# netstat is needed.
port_free() {
    local hex table tables=()
    hex=$(printf '%04X' "$1")
    for table in /proc/net/tcp /proc/net/tcp6; do
        [ -r "$table" ] && tables+=("$table")
    done
    [ "${#tables[@]}" -gt 0 ] || return 0
    ! awk -v port="$hex" 'FNR > 1 && $4 == "0A" { sub(/.*:/, "", $2); if ($2 == port) found = 1 }
        END { exit !found }' "${tables[@]}"
}

# SlurmctldPort and SlurmdPort: those of the running configuration while our daemons run (they
# hold them, and an unchanged configuration keeps them running), else the first free pair
# from base_port on.
choose_ports() {
    if [ -f "$conf" ] && { own_pid "$run/slurmctld.pid" slurmctld ||
        own_pid "$run/slurmd.pid" slurmd; } >/dev/null; then
        ctld_port=$(sed -n 's/^SlurmctldPort=//p' "$conf")
        slurmd_port=$(sed -n 's/^SlurmdPort=//p' "$conf")
        [ -n "$ctld_port" ] && [ -n "$slurmd_port" ] && return
    fi
    local port
    for port in $(seq "$base_port" 2 $((base_port + 38))); do
        if port_free "$port" && port_free $((port + 1)); then
            ctld_port=$port
            slurmd_port=$((port + 1))
            return
        fi
    done
    die "no two free TCP ports in $base_port-$((base_port + 39)); set DISTCOMM_SLURM_PORT"
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
    local new
    new=$(cat <<EOF
# Written by distcomm's scripts/slurm.sh for this machine; rewritten on every start.
ClusterName=distcomm
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$state
SlurmdSpoolDir=$spool
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd.pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd.log
SchedulerType=sched/backfill
$(node_line)
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
)
    if [ -f "$conf" ] && [ "$(cat "$conf")" = "$new" ]; then
        return 1  # unchanged
    fi
    printf '%s\n' "$new" >"$conf"
    chmod 0644 "$conf"
    return 0
}

# Print the end of the daemons' logs, so that a failed start in CI says why.
show_logs() {
    local log
    for log in "$logs/slurmctld.log" "$logs/slurmd.log" "$munge_dir/munged.log"; do
        [ -f "$log" ] || continue
        echo "--- $log (last 20 lines)" >&2
        tail -n 20 "$log" >&2
    done
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
    show_logs
    die "node $host is '${state:-unknown}', not idle, after 60 s (logs in $logs)"
}

start() {
    need_root
    install
    make_dir
    start_munge
    choose_ports
    if write_config; then
        # A new configuration: our daemons started with the old one restart.
        stop_daemon slurmd "$run/slurmd.pid"
        stop_daemon slurmctld "$run/slurmctld.pid"
    fi
    own_pid "$run/slurmctld.pid" slurmctld >/dev/null || slurmctld
    own_pid "$run/slurmd.pid" slurmd >/dev/null || slurmd
    wait_idle
    echo "scripts/slurm.sh: node $host is idle ($(nproc) CPUs, up to 4 tasks per CPU with" \
        "--overcommit); SLURM_CONF=$conf, ports $ctld_port and $slurmd_port"
}

stop() {
    need_root
    [ -f "$marker" ] || return 0  # no cluster of ours here
    # Jobs still running would outlive slurmd (it leaves its steps running when it stops).
    if own_pid "$run/slurmctld.pid" slurmctld >/dev/null; then
        local jobs
        jobs=$(timeout 5 squeue -h -o %A 2>/dev/null || true)
        # shellcheck disable=SC2086  # one argument per job id
        [ -z "$jobs" ] || timeout 10 scancel --quiet $jobs >/dev/null 2>&1 || true
        for _ in $(seq 50); do
            [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null || true)" ] && break
            sleep 0.1
        done
    fi
    stop_daemon slurmd "$run/slurmd.pid"
    stop_daemon slurmctld "$run/slurmctld.pid"
    stop_daemon munged "$munge_dir/munged.pid"
    # Only what start made: a DISTCOMM_SLURM_DIR that holds other files keeps them, and itself.
    rm -rf "$conf" "$state" "$spool" "$logs" "$run" "$munge_dir" "$marker"
    rmdir "$dir" 2>/dev/null || true
}

status() {
    [ -f "$conf" ] || die "no private cluster in $dir (start it: bash scripts/slurm.sh start)"
    sinfo
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) printf 'export SLURM_CONF=%q\n' "$conf" ;;
    *) die "usage: bash scripts/slurm.sh start|stop|status|env" ;;
esac
