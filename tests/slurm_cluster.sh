#!/usr/bin/env bash
# A single-node Slurm cluster on localhost for the `slurm` tests (real slurmctld + slurmd + munged).
#
#   export SLURM_CONF=/tmp/fa-envkit-slurm/slurm.conf   # the default; clients (sbatch, squeue) read it
#   bash tests/slurm_cluster.sh start                  # writes slurm.conf, starts the daemons, waits for idle
#   bash tests/slurm_cluster.sh stop                   # stops what start started, by PID
#
# No systemd here: the daemons run by hand, as root, with state, logs and PID files in the
# directory of $SLURM_CONF. Needs `apt-get install slurm-wlm` (brings munge).
set -euo pipefail

SLURM_CONF=${SLURM_CONF:-/tmp/fa-envkit-slurm/slurm.conf}
export SLURM_CONF
STATE=$(dirname "$SLURM_CONF")
MUNGE_PID=/run/munge/munged.pid   # munged's default; our marker says whether we started it

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
    local cpus mem_mb
    cpus=$(nproc)
    # Slurm drains a node that has less memory than configured: stay below what this machine has.
    mem_mb=$(awk '/MemTotal/ {m = int($2 / 1024 * 0.9); print (m < 20000 ? m : 20000)}' /proc/meminfo)
    mkdir -p "$STATE/state" "$STATE/spool"
    cat > "$SLURM_CONF" <<EOF
# Written by tests/slurm_cluster.sh: one node (this machine), no accounting, no cgroups.
ClusterName=fa-envkit-test
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Schedule a submitted batch job at once (the default waits up to 3 s to batch submissions together).
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
    if pid_alive "$STATE/slurmctld.pid" && pid_alive "$STATE/slurmd.pid"; then
        echo "slurm_cluster: already running ($SLURM_CONF)"
        return 0
    fi
    write_conf
    if ! pid_alive "$MUNGE_PID"; then
        install -d -o munge -g munge -m 0755 /run/munge
        runuser -u munge -- /usr/sbin/munged
        touch "$STATE/munged.started-here"
    fi
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF" -N localhost
    for _ in $(seq 1 60); do
        if [ "$(sinfo -h -N -o %T 2>/dev/null)" = idle ]; then
            echo "slurm_cluster: node localhost idle ($SLURM_CONF)"
            return 0
        fi
        sleep 0.5
    done
    echo "slurm_cluster: node did not become idle in 30 s; see $STATE/slurmctld.log and $STATE/slurmd.log" >&2
    sinfo -N -l >&2 || true
    return 1
}

stop_pid_file() {
    local pid_file=$1 pid
    pid_alive "$pid_file" || return 0
    pid=$(cat "$pid_file")
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    echo "slurm_cluster: PID $pid ($pid_file) still alive after 5 s" >&2
}

stop() {
    stop_pid_file "$STATE/slurmd.pid"
    stop_pid_file "$STATE/slurmctld.pid"
    if [ -e "$STATE/munged.started-here" ]; then
        stop_pid_file "$MUNGE_PID"
        rm -f "$STATE/munged.started-here"
    fi
    echo "slurm_cluster: stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: SLURM_CONF=... bash $0 start|stop" >&2; exit 2 ;;
esac
