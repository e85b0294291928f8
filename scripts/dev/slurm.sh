#!/usr/bin/env bash
# A one-node Slurm of its own, for trying deploy/slurm/sweep.sbatch (and for tests/test_slurm.py): munged with a
# key of its own, slurmctld and slurmd for this host's name and cores, every file (key, sockets, state, logs, the
# PID files) in one folder, on free ports. It reads no /etc/slurm or /etc/munge file and stops only the processes
# it started, by the PID files it wrote.
#
#   scripts/dev/slurm.sh up DIR     # start; prints `export SLURM_CONF=DIR/slurm.conf` for sbatch/squeue/scancel
#   scripts/dev/slurm.sh down DIR   # cancel its jobs, stop its daemons, leave DIR (logs) behind
#
# Needs Debian's slurm-wlm and munge (`apt-get install slurm-wlm munge`) and root: slurmd runs jobs as their user.
set -euo pipefail

usage() { echo "usage: $0 up|down DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$(realpath -m "$2")
WAIT_S=${WAIT_S:-60}  # how long `up` waits for the node to be idle, and `down` for its jobs and daemons to end

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Stop the process whose PID file is $1 (SIGTERM, then SIGKILL after WAIT_S); nothing if it is gone.
stop_pid() {
    local file=$1 pid
    [ -s "$file" ] || return 0
    pid=$(cat "$file")
    kill -0 "$pid" 2>/dev/null || { rm -f "$file"; return 0; }
    kill -TERM "$pid"
    for _ in $(seq "$((WAIT_S * 10))"); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$file"; return 0; }
        sleep 0.1
    done
    echo "$0: $file: pid $pid still running after ${WAIT_S} s; SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$file"
}

up() {
    for cmd in munged slurmctld slurmd sinfo; do
        command -v "$cmd" >/dev/null || { echo "$0: no $cmd: apt-get install slurm-wlm munge" >&2; exit 1; }
    done
    [ "$(id -u)" -eq 0 ] || { echo "$0: slurmd must run as root" >&2; exit 1; }
    mkdir -p "$dir"/{munge,state,spool}
    # munged wants its socket's folders searchable by all (the key stays readable by root only)
    chmod 711 "$dir" "$dir/munge"
    # munged's own key, not the machine's /etc/munge/munge.key: this Slurm trusts only itself
    head -c 1024 /dev/urandom >"$dir/munge/munge.key"
    chmod 400 "$dir/munge/munge.key"
    local socket="$dir/munge/munge.socket"
    # munged checks that every folder above its socket is searchable by all and none writable by others but /tmp
    # (sticky): DIR's parents must be so (pytest's own temp folders are not: 700)
    munged --foreground --key-file="$dir/munge/munge.key" --socket="$socket" --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" >>"$dir/munge/munged.out" 2>&1 &
    echo $! >"$dir/munged.pid"
    for _ in $(seq "$((WAIT_S * 10))"); do
        [ -S "$socket" ] || ! kill -0 "$(cat "$dir/munged.pid")" 2>/dev/null && break
        sleep 0.1
    done
    [ -S "$socket" ] || { echo "$0: munged did not start: $(tail -n 3 "$dir/munge/munged.out")" >&2; exit 1; }

    local host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)  # MiB; slurmd refuses more than it sees
    : >"$dir/plugstack.conf"  # none of the machine's SPANK plugins
    cat >"$dir/slurm.conf" <<EOF
ClusterName=pefusion-dev
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
PlugStackConfig=$dir/plugstack.conf
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.daemon.pid
SlurmdPidFile=$dir/slurmd.daemon.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
# No cgroups (a container may not delegate them): processes tracked by their parents, no CPU binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=dev Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -D -f "$SLURM_CONF" >>"$dir/slurmctld.log" 2>&1 &
    echo $! >"$dir/slurmctld.pid"
    slurmd -D -f "$SLURM_CONF" >>"$dir/slurmd.log" 2>&1 &
    echo $! >"$dir/slurmd.pid"
    for _ in $(seq "$((WAIT_S * 2))"); do
        [ "$(sinfo -h -n "$host" -o %t 2>/dev/null)" = idle ] && { echo "export SLURM_CONF=$SLURM_CONF"; return 0; }
        sleep 0.5
    done
    echo "$0: the node did not become idle in ${WAIT_S} s; see $dir/slurmctld.log and $dir/slurmd.log" >&2
    down
    exit 1
}

down() {
    export SLURM_CONF="$dir/slurm.conf"
    if [ -s "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            # shellcheck disable=SC2086
            scancel $jobs || true
            for _ in $(seq "$((WAIT_S * 2))"); do
                [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
                sleep 0.5
            done
        fi
    fi
    stop_pid "$dir/slurmd.pid"
    stop_pid "$dir/slurmctld.pid"
    stop_pid "$dir/munged.pid"
}

case $action in
    up) up ;;
    down) down ;;
    *) usage ;;
esac
