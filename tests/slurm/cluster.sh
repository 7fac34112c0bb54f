#!/usr/bin/env bash
# Start/stop a real multi-node Slurm test cluster on this one machine.
#
#   tests/slurm/cluster.sh start   # idempotent: returns quickly if healthy
#   tests/slurm/cluster.sh stop    # kills only what this script started
#   tests/slurm/cluster.sh status  # exit 0 if running and healthy
#   tests/slurm/cluster.sh lose NODE  # SIGKILL the node's slurmd and everything it started
#                                     # (a lost node); `start` brings the cluster back
#   eval "$(tests/slurm/cluster.sh env)"   # export SLURM_CONF=...
#
# Needs root and Debian's slurm-wlm + munge (tests/system-packages.sh installs them if missing).
#
# Layout: one slurmctld plus HPCTF_SLURM_NODES slurmd daemons (node1..nodeN,
# multiple-slurmd build), node I at loopback address 127.0.10.I, port PORT+I.
# Each slurmd runs in its own UTS + mount namespace, so the job steps it starts
# see `hostname` == their node name and a private /etc/hosts (bind-mounted:
# the machine's entries plus "127.0.10.I nodeI" lines). No cgroups, no
# accounting database. Each node declares fake GPUs (gres gpu whose device
# files are character devices 1:3, i.e. /dev/null).
#
# Environment knobs:
#   HPCTF_SLURM_DIR        state dir              (default /tmp/hpctf-slurm)
#   HPCTF_SLURM_NODES      number of nodes        (default 2)
#   HPCTF_SLURM_CPUS       CPUs per node          (default 2)
#   HPCTF_SLURM_GPUS       fake GPUs per node     (default 2, 0 = no gres)
#   HPCTF_SLURM_PORT       slurmctld port         (default 16817; slurmd i
#                                                  listens on PORT+i)
#   HPCTF_SLURM_TIMEOUT    seconds to wait for nodes idle (default 60)
#   HPCTF_SLURM_SLURMD_TIMEOUT  slurm.conf's SlurmdTimeout (default 60): how long a node
#                          whose slurmd is gone stays up in Slurm's view
#   HPCTF_SLURM_FIRST_JOB_ID  first job id (default 1); give clusters that run
#                          side by side different ones, so TF ports differ
#   HPCTF_SLURM_ACCOUNTING 1: real accounting (default 0): a private MariaDB on
#                          127.0.0.1:PORT+300 (data in $DIR/db, gone at stop) and
#                          slurmdbd on PORT+301, so sacct answers
#   HPCTF_SLURM_ROOT       a Debian 13 root (tests/slurm/debian13-root.sh): every Slurm daemon
#                          and client of the cluster runs in it (Slurm 24.11; the jobs on its
#                          Python 3.13) through tests/slurm/in-root.sh; munged and MariaDB stay
#                          the host's. $DIR/bin holds the clients for the host's side
#                          (sbatch, squeue, ...: `env` puts it first on PATH)
#
# Known Slurm quirks (not worked around here):
#   * `sbatch --export=NONE` leaks SLURM_EXPORT_ENV=NONE into `srun` inside
#     the batch script, so its tasks get an empty environment (no PATH:
#     "execve(): bash: No such file or directory"). Workaround: in the
#     script, `export SLURM_EXPORT_ENV=ALL` (or `srun --export=ALL`).
#   * Jobs see SLURM_CONF (slurmd sets it), also under --export=NONE.
#   * All nodes share one network namespace: two "nodes" cannot listen on
#     the same TCP port. Node names resolve only inside jobs (the login side
#     does not need them).
#   * A requeued job waits 120 s for its BeginTime unless released with
#     `scontrol update JobId=X StartTime=now+N` (hpctf's job-end and trap do).
#   * `sbatch --wait` polls slowly; poll `scontrol show job -o ID` instead.
#   * Without HPCTF_SLURM_ACCOUNTING=1, no accounting: `sacct` says "accounting
#     storage is disabled"; completed jobs stay visible to `scontrol show job`
#     and squeue for MinJobAge seconds, then only to sacct (with accounting).
#   * slurmdbd has no -f: it reads slurmdbd.conf beside $SLURM_CONF, which must
#     be mode 0600; slurm.conf's AccountingStoragePass names the munge socket
#     (the dbd connection ignores AuthInfo's socket). Records reach sacct 1-4 s
#     after a job ends; `sacct -D` lists a requeued job's earlier runs.
#   * HPCTF_SLURM_ROOT (Slurm 24.11.5): slurmdbd's first connection to the host's
#     MariaDB (10.11, no TLS) fails "SSL is required, but the server does not
#     support it"; slurmdbd tries again 5 s later and connects. The same
#     slurm.conf works on 22.05 and 24.11 (24.11 only logs "Configured MailProg
#     is invalid"). A 22.05 client cannot talk to a 24.11 slurmctld: use the
#     root's clients ($DIR/bin, `env`).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${HPCTF_SLURM_DIR:-/tmp/hpctf-slurm}
NODES=${HPCTF_SLURM_NODES:-2}
CPUS=${HPCTF_SLURM_CPUS:-2}
GPUS=${HPCTF_SLURM_GPUS:-2}
CTLD_PORT=${HPCTF_SLURM_PORT:-16817}
TIMEOUT=${HPCTF_SLURM_TIMEOUT:-60}
SLURMD_TIMEOUT=${HPCTF_SLURM_SLURMD_TIMEOUT:-60}
FIRST_JOB_ID=${HPCTF_SLURM_FIRST_JOB_ID:-1}
ACCOUNTING=${HPCTF_SLURM_ACCOUNTING:-0}
SROOT=${HPCTF_SLURM_ROOT:-}

ETC=$DIR/etc
RUN=$DIR/run
LOG=$DIR/log
SPOOL=$DIR/spool
CONF=$ETC/slurm.conf
MUNGE_DIR=$DIR/munge
MUNGE_PID=$MUNGE_DIR/munged.pid
MUNGE_KEY=/etc/munge/munge.key
# Each cluster has its own munged and socket, so clusters side by side (several developers,
# or a test run beside another) never stop each other's authentication.
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
DB=$DIR/db
DB_PORT=$((CTLD_PORT + 300))
DBD_PORT=$((CTLD_PORT + 301))

log() { echo "cluster.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $DIR == /* && $DIR != / ]] || die "HPCTF_SLURM_DIR must be an absolute path other than /"
[[ $ACCOUNTING == [01] ]] || die "HPCTF_SLURM_ACCOUNTING must be 0 or 1, got '$ACCOUNTING'"
if [[ -n $SROOT ]]; then
    [[ -f $SROOT/.hpctf-root-complete ]] ||
        die "HPCTF_SLURM_ROOT=$SROOT is no root that tests/slurm/debian13-root.sh completed"
fi
for v in NODES CPUS GPUS CTLD_PORT TIMEOUT SLURMD_TIMEOUT; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
((NODES >= 1 && NODES <= 254)) || die "HPCTF_SLURM_NODES must be 1..254"
((CPUS >= 1)) || die "HPCTF_SLURM_CPUS must be >= 1"

node_names() {
    local i
    for ((i = 1; i <= NODES; i++)); do echo "node$i"; done
}

# node_addr I: loopback address of node I. Distinct per node so that forward
# and reverse lookups agree (`hostname -f` on node2 says node2, not node1).
node_addr() { echo "127.0.10.$1"; }

node_list() {
    if ((NODES == 1)); then echo node1; else echo "node[1-$NODES]"; fi
}

# slurm_cmd CMD [ARG...]: a Slurm daemon or client of this cluster: the host's, or the root's.
slurm_cmd() {
    if [[ -n $SROOT ]]; then
        "$HERE/in-root.sh" "$SROOT" "$@"
    else
        "$@"
    fi
}

# The clients the host's side calls (hpctf, the tests), each running the root's own.
CLIENTS=(sbatch srun salloc squeue scontrol scancel sacct sinfo sacctmgr sstat sattach sprio)
write_client_wrappers() {
    local tool
    mkdir -p "$DIR/bin"
    for tool in "${CLIENTS[@]}"; do
        printf '#!/bin/sh\nexec %q %q /usr/bin/%s "$@"\n' "$HERE/in-root.sh" "$SROOT" "$tool" \
            >"$DIR/bin/$tool"
        chmod 0755 "$DIR/bin/$tool"
    done
}

# ---------------------------------------------------------------- packages

# The packages (slurm-wlm, munge, ...) come from the one list in tests/system-packages.sh,
# which `make test` runs before the first test; here it is a no-op unless this script runs
# on its own on a machine that lacks them.
ensure_packages() {
    "$HERE/../system-packages.sh" >&2 || die "the Slurm packages are not installed (see above)"
}

# ---------------------------------------------------------------- pid helpers

# running PID: process exists and is not a zombie. (Daemons reparent to PID 1,
# which may be slow to reap them -- e.g. in containers and microVMs.)
running() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

# pid_alive PIDFILE NAME: pid in file is alive and is NAME (guards against
# pid reuse). Debian's slurmd is an alternatives link to slurmd-wlm, so match
# the process name (comm) or the executable's basename with a -wlm suffix.
pid_alive() {
    local file=$1 name=$2 pid comm exe
    [[ -s $file ]] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [[ -n $pid ]] && running "$pid" || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [[ $comm == "$name" ]] && return 0
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
    exe=${exe##*/}
    [[ $exe == "$name" || $exe == "$name-wlm" ]]
}

# kill_pidfiles PIDFILE:NAME...: SIGTERM all of them at once, wait up to
# 15 s for them to exit, SIGKILL stragglers; remove the pid files.
kill_pidfiles() {
    local spec file name pid i pids=() left
    for spec in "$@"; do
        file=${spec%:*}
        name=${spec##*:}
        if pid_alive "$file" "$name"; then
            pid=$(tr -dc '0-9' <"$file")
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    for ((i = 0; i < 200 && ${#pids[@]}; i++)); do
        left=()
        for pid in "${pids[@]}"; do
            if running "$pid"; then left+=("$pid"); fi
        done
        pids=("${left[@]}")
        ((${#pids[@]})) || break
        if ((i == 150)); then
            log "pid(s) ${pids[*]} ignored SIGTERM, sending SIGKILL"
            kill -KILL "${pids[@]}" 2>/dev/null || true
        fi
        sleep 0.1
    done
    for spec in "$@"; do rm -f "${spec%:*}"; done
}

# kill_namespace NSFILE: kill every process living in the UTS namespace
# recorded in NSFILE (a node's slurmd, slurmstepd and leftover job processes)
# that is this cluster's: SLURM_CONF=$CONF in its environment (this script
# exports it to slurmd, and slurmd sets it for every job). A namespace's
# number is reused once its last process is gone: measured, a stop whose
# node had just emptied its namespace killed the slurmd another cluster had
# started a second later in a new namespace with the same number.
kill_namespace() {
    local file=$1 ns host_ns sig p pids i
    [[ -s $file ]] || return 0
    ns=$(<"$file")
    host_ns=$(readlink /proc/self/ns/uts)
    if [[ -z $ns || $ns == "$host_ns" ]]; then
        rm -f "$file"
        return 0
    fi
    for sig in TERM KILL; do
        for ((i = 0; i < 50; i++)); do
            pids=()
            for p in /proc/[0-9]*; do
                [[ $(readlink "$p/ns/uts" 2>/dev/null) == "$ns" ]] &&
                    tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$CONF" &&
                    pids+=("${p#/proc/}")
            done
            ((${#pids[@]})) || break
            # First pass of each signal: send it; then just wait.
            if ((i == 0)); then kill "-$sig" "${pids[@]}" 2>/dev/null || true; fi
            sleep 0.1
        done
        ((${#pids[@]})) || break
    done
    rm -f "$file"
}

# lose_node NODE: stop, then SIGKILL, every process of this cluster in NODE's UTS namespace
# (its slurmd, the subreaper, slurmstepd and the job's tasks): the node is lost as a node
# whose kernel panicked is, and Slurm notices only when its slurmd stops answering pings
# (SlurmdTimeout). SIGSTOP first: killed in one go, a task could die before its slurmstepd
# and be reported (srun then ends at once, as it never does for a node that is gone).
lose_node() {
    local node=$1 file ns p pids=()
    [[ $node =~ ^node[0-9]+$ ]] || die "lose: not a node name: '$node'"
    file=$RUN/slurmd-$node.utsns
    [[ -s $file ]] || die "lose: $node has no namespace recorded ($file)"
    ns=$(<"$file")
    # Slurm 24.11's slurmstepd runs with an environment of its own, without SLURM_CONF: in
    # the namespace of a node whose slurmd lives, it is this cluster's.
    for p in /proc/[0-9]*; do
        [[ $(readlink "$p/ns/uts" 2>/dev/null) == "$ns" ]] || continue
        if [[ $(cat "$p/comm" 2>/dev/null) == slurmstepd ]] ||
            tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$CONF"; then
            pids+=("${p#/proc/}")
        fi
    done
    ((${#pids[@]})) || die "lose: nothing of $node is running"
    kill -STOP "${pids[@]}" 2>/dev/null || true
    kill -KILL "${pids[@]}" 2>/dev/null || true
    log "lost $node: killed ${#pids[@]} process(es)"
}

# ---------------------------------------------------------------- munge

munge_ok() {
    [[ -S $MUNGE_SOCKET ]] &&
        timeout 5 munge --socket="$MUNGE_SOCKET" -n 2>/dev/null |
        timeout 5 unmunge --socket="$MUNGE_SOCKET" >/dev/null 2>&1
}

ensure_munge() {
    if [[ ! -s $MUNGE_KEY ]]; then
        log "creating munge key $MUNGE_KEY"
        mkdir -p "${MUNGE_KEY%/*}"
        if command -v mungekey >/dev/null; then
            mungekey --create --force --keyfile="$MUNGE_KEY"
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
        fi
    fi
    chown munge:munge "${MUNGE_KEY%/*}" "$MUNGE_KEY"
    chmod 0700 "${MUNGE_KEY%/*}"
    chmod 0400 "$MUNGE_KEY"

    if munge_ok; then
        return 0 # this cluster's munged is already serving
    fi
    if pid_alive "$MUNGE_PID" munged; then
        log "our munged is running but not answering; restarting it"
        kill_pidfiles "$MUNGE_PID:munged"
    fi
    log "starting munged"
    mkdir -p "$MUNGE_DIR"
    chown munge:munge "$MUNGE_DIR"
    chmod 0755 "$MUNGE_DIR"
    runuser -u munge -- munged \
        --socket="$MUNGE_SOCKET" \
        --pid-file="$MUNGE_PID" \
        --log-file="$MUNGE_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed"
    local i
    for ((i = 0; i < 50; i++)); do
        munge_ok && return 0
        sleep 0.1
    done
    cat "$MUNGE_DIR/munged.log" >&2 || true
    die "munged does not answer (munge -n | unmunge failed)"
}

# ---------------------------------------------------------------- accounting

# start_accounting: a private MariaDB (a fresh data dir, on 127.0.0.1 only) and
# slurmdbd on top of it, before slurmctld starts.
start_accounting() {
    local i
    rm -rf "$DB"
    # A tmpdir of its own: two clusters' MariaDB starting at once in /tmp (two xdist workers,
    # each with a 22.05 and a 24.11 cluster) failed "Could not remove temporary table
    # '/tmp/#sql-temptable-...'" and "Installation of system tables failed".
    mkdir -p "$DB/tmp"
    chown mysql:mysql "$DB" "$DB/tmp"
    mariadb-install-db --user=mysql --datadir="$DB/data" --tmpdir="$DB/tmp" --skip-test-db \
        --auth-root-authentication-method=socket >"$LOG/mariadb-install.log" 2>&1 ||
        fail "mariadb-install-db failed (see $LOG/mariadb-install.log)"
    mariadbd --user=mysql --datadir="$DB/data" --tmpdir="$DB/tmp" --socket="$DB/mysqld.sock" --port="$DB_PORT" \
        --bind-address=127.0.0.1 --pid-file="$DB/mysqld.pid" --log-error="$LOG/mariadb.log" \
        --skip-log-bin --innodb-buffer-pool-size=16M </dev/null >/dev/null 2>&1 &
    for ((i = 0; i < 100; i++)); do
        mariadb-admin --socket="$DB/mysqld.sock" ping >/dev/null 2>&1 && break
        sleep 0.2
    done
    mariadb --socket="$DB/mysqld.sock" -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'hpctf';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" ||
        fail "MariaDB did not start (see $LOG/mariadb.log)"
    SLURM_CONF=$CONF slurm_cmd slurmdbd || fail "slurmdbd failed to start"
    for ((i = 0; i < 100; i++)); do
        if pid_alive "$RUN/slurmdbd.pid" slurmdbd && ss -Htln "sport = :$DBD_PORT" | grep -q .; then
            return 0
        fi
        sleep 0.1
    done
    fail "slurmdbd is not listening on port $DBD_PORT"
}

# ---------------------------------------------------------------- config

accounting_lines() {
    if ((ACCOUNTING)); then
        printf '%s\n' AccountingStorageType=accounting_storage/slurmdbd \
            AccountingStorageHost=localhost "AccountingStoragePort=$DBD_PORT" \
            "AccountingStoragePass=$MUNGE_SOCKET"
        # GPUs in each allocation's TRES (sacct AllocTRES), for hpctf's GPU-hours.
        echo AccountingStorageTRES=gres/gpu
    else
        echo AccountingStorageType=accounting_storage/none
    fi
}

write_config() { # write_config OUTDIR
    local out=$1 nodes i gres_line="" gpu_files
    nodes=$(node_list)
    mkdir -p "$out"

    if ((GPUS > 0)); then
        gres_line=" Gres=gpu:$GPUS"
    fi

    {
        cat <<EOF
# Generated by tests/slurm/cluster.sh -- do not edit.
ClusterName=hpctf
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$(accounting_lines)
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Schedule batch jobs at once instead of batching them up to 3 s (default). A job whose start
# time comes later (a requeued job that hpctf released) starts at the next scheduling pass: on a
# busy cluster the next job's submission or end, on an idle one the backfill pass (bf_interval,
# 30 s by default). Every 5 s here, as on a cluster where jobs come and go.
SchedulerParameters=batch_sched_delay=0,bf_interval=5
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
PropagateResourceLimits=NONE
ReturnToService=2
KillWait=5
# Short, so a test can see a job forgotten by slurmctld (squeue, scontrol) in a minute.
MinJobAge=30
FirstJobId=$FIRST_JOB_ID
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=$SLURMD_TIMEOUT
MessageTimeout=10
StateSaveLocation=$SPOOL/ctld
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmctldDebug=info
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmdSpoolDir=$SPOOL/%n
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmdDebug=info
EOF
        if ((GPUS > 0)); then
            echo "GresTypes=gpu"
        fi
        for ((i = 1; i <= NODES; i++)); do
            echo "NodeName=node$i NodeAddr=$(node_addr "$i") NodeHostname=node$i Port=$((CTLD_PORT + i)) CPUs=$CPUS RealMemory=2000${gres_line} State=UNKNOWN"
        done
        # debug: where tests run; high: jobs there preempt debug's (requeued, SIGTERM at once,
        # SIGKILL after KillWait), the way a site's priority partition does.
        echo "PartitionName=debug Nodes=$nodes Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=0"
        echo "PartitionName=high Nodes=$nodes MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF"
    } >"$out/slurm.conf"

    if ((ACCOUNTING)); then
        (
            umask 077 # slurmdbd refuses a slurmdbd.conf that others may read
            cat >"$out/slurmdbd.conf" <<EOF
# Generated by tests/slurm/cluster.sh -- do not edit.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=hpctf
StorageLoc=slurm_acct_db
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
EOF
        )
    fi

    # Present so slurmd never falls back to anything cgroup-ish; no cgroup
    # plugin is configured (proctrack/pgid, task/none).
    echo "# Generated by tests/slurm/cluster.sh: cgroups are not used." >"$out/cgroup.conf"

    {
        echo "# Generated by tests/slurm/cluster.sh -- fake GPUs (copies of /dev/null)."
        echo "AutoDetect=off"
        if ((GPUS > 0)); then
            if ((GPUS == 1)); then
                gpu_files="$DIR/dev/nvidia0"
            else
                gpu_files="$DIR/dev/nvidia[0-$((GPUS - 1))]"
            fi
            echo "NodeName=$nodes Name=gpu File=$gpu_files"
        fi
    } >"$out/gres.conf"

    # /etc/hosts seen by the job steps: the machine's own entries (so its
    # real hostname stays resolvable) plus the emulated node names.
    {
        echo "# Generated by tests/slurm/cluster.sh"
        grep -v '^# Generated by tests/slurm/cluster.sh' /etc/hosts || true
        if ! getent hosts "$(hostname)" >/dev/null 2>&1; then
            echo "127.0.0.1 $(hostname)"
        fi
        for ((i = 1; i <= NODES; i++)); do
            echo "$(node_addr "$i") node$i"
        done
    } >"$out/hosts"
}

make_devices() {
    local i
    mkdir -p "$DIR/dev"
    for ((i = 0; i < GPUS; i++)); do
        [[ -c $DIR/dev/nvidia$i ]] || mknod -m 0666 "$DIR/dev/nvidia$i" c 1 3
    done
}

# ---------------------------------------------------------------- reaper

# Child subreaper that runs "$@" (slurmd, which daemonizes) and reaps every
# orphan below it until none is left. Without it, orphans (the intermediate
# slurmstepd fork, srun's helper child) go to PID 1; where PID 1 is not a real
# init (containers, microVMs) their zombies linger, keep the job's process
# group alive, and proctrack/pgid then delays every batch job's completion
# by 3-6 s (1 s + 2 s + ... back-off).
REAPER='
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
signal.signal(signal.SIGHUP, signal.SIG_IGN)
child = os.fork()
if child == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
'

# ---------------------------------------------------------------- status

export SLURM_CONF=$CONF

# healthy: every daemon alive and every node in a usable state.
healthy() {
    local n states
    [[ -s $CONF ]] || return 1
    pid_alive "$RUN/slurmctld.pid" slurmctld || return 1
    for n in $(node_names); do
        pid_alive "$RUN/slurmd-$n.pid" slurmd || return 1
    done
    munge_ok || return 1
    if ((ACCOUNTING)); then
        pid_alive "$RUN/slurmdbd.pid" slurmdbd || return 1
        pid_alive "$DB/mysqld.pid" mariadbd || return 1
    fi
    states=$(slurm_cmd timeout 10 sinfo -h -N -p debug -o '%N %T' 2>/dev/null) || return 1
    [[ $(wc -l <<<"$states") -eq $NODES ]] || return 1
    ! grep -Evq ' (idle|mixed|allocated|completing)$' <<<"$states"
}

all_idle() {
    local states
    states=$(slurm_cmd timeout 10 sinfo -h -N -p debug -o '%N %T' 2>/dev/null) || return 1
    [[ $(wc -l <<<"$states") -eq $NODES ]] || return 1
    ! grep -vq ' idle$' <<<"$states"
}

dump_logs() {
    local f
    slurm_cmd timeout 10 sinfo -N -l >&2 2>&1 || true
    for f in "$LOG"/*.log "$MUNGE_DIR/munged.log"; do
        [[ -f $f ]] || continue
        echo "===== $f (last 40 lines)" >&2
        tail -n 40 "$f" >&2 || true
    done
}

# ---------------------------------------------------------------- start/stop

# fail MSG: start failed -- show logs, tear down what was started, exit 1.
fail() {
    dump_logs
    cmd_stop || true
    die "$*"
}

cmd_stop() {
    local f specs
    if [[ -s $CONF ]] && pid_alive "$RUN/slurmctld.pid" slurmctld; then
        # Cancel leftover jobs so their steps end cleanly.
        slurm_cmd timeout 5 scancel --quiet --full --partition=debug >/dev/null 2>&1 || true
    fi
    # Nodes: slurmd, then anything left in its namespace (slurmstepd, job
    # processes, the subreaper).
    specs=()
    for f in "$RUN"/slurmd-*.pid; do
        [[ -e $f ]] && specs+=("$f:slurmd")
    done
    ((${#specs[@]} == 0)) || kill_pidfiles "${specs[@]}"
    for f in "$RUN"/*.utsns; do
        [[ -e $f ]] && kill_namespace "$f"
    done
    # Controller, and only a munged this script started (pid file in $DIR).
    kill_pidfiles "$RUN/slurmctld.pid:slurmctld" "$RUN/slurmdbd.pid:slurmdbd"
    kill_pidfiles "$DB/mysqld.pid:mariadbd" "$MUNGE_PID:munged"
    # Keep logs for post-mortems; everything else is regenerated by start.
    rm -rf "$ETC" "$RUN" "$SPOOL" "${DIR:?}/dev" "$MUNGE_DIR" "$DB" "${DIR:?}/bin"
    log "stopped (logs kept in $LOG)"
}

cmd_start() {
    local t0 tmp n i j port python ports launcher
    t0=$(date +%s%N)
    [[ $(id -u) -eq 0 ]] || die "must run as root"
    ensure_packages

    # Already running with the same configuration and healthy? Done.
    if [[ -s $CONF ]]; then
        tmp=$(mktemp -d)
        write_config "$tmp"
        if cmp -s "$tmp/slurm.conf" "$CONF" && cmp -s "$tmp/gres.conf" "$ETC/gres.conf" && healthy; then
            rm -rf "$tmp"
            log "already running and healthy"
            return 0
        fi
        rm -rf "$tmp"
        log "stale or changed cluster found; restarting"
    fi
    cmd_stop

    ports=()
    for ((i = 0; i <= NODES; i++)); do ports+=($((CTLD_PORT + i))); done
    if ((ACCOUNTING)); then ports+=("$DB_PORT" "$DBD_PORT"); fi
    for port in "${ports[@]}"; do
        if command -v ss >/dev/null && ss -Htln "sport = :$port" 2>/dev/null | grep -q .; then
            die "TCP port $port is already in use (set HPCTF_SLURM_PORT)"
        fi
    done

    rm -rf "$LOG"
    mkdir -p "$ETC" "$RUN" "$LOG" "$SPOOL/ctld"
    for n in $(node_names); do mkdir -p "$SPOOL/$n"; done
    write_config "$ETC"
    make_devices
    ensure_munge
    if ((ACCOUNTING)); then start_accounting; fi

    if [[ -n $SROOT ]]; then write_client_wrappers; fi
    slurm_cmd slurmctld -f "$CONF" || fail "slurmctld failed to start"

    python=$(command -v /usr/bin/python3 python3 | head -n 1) || true
    launcher=()
    if [[ -n $SROOT ]]; then
        # The node's slurmd in the root, its /etc/hosts there the node's own.
        python=/usr/bin/python3
        launcher=(env "HPCTF_ROOT_HOSTS=$ETC/hosts" "$HERE/in-root.sh" "$SROOT")
    fi
    [[ -n $python ]] || log "WARNING: no python3: slurmd runs without a subreaper (zombies may slow job completion)"
    for n in $(node_names); do
        # New UTS + mount namespace (private propagation): own hostname and
        # own /etc/hosts for this node and every job step it launches. Inside,
        # a child subreaper (see REAPER) parents the daemonized slurmd.
        # shellcheck disable=SC2016  # expanded by the inner sh, not here
        # The arguments after the first five (launcher) run slurmd (in the root).
        setsid unshare --uts --mount --propagation private -- /bin/sh -c '
            set -e
            hostname "$1"
            mount --bind "$2" /etc/hosts
            node=$1 conf=$3 python=$4 reaper=$5
            shift 5
            if [ -n "$python" ]; then
                exec "$@" "$python" -c "$reaper" slurmd -f "$conf" -N "$node"
            fi
            exec "$@" slurmd -f "$conf" -N "$node"
        ' slurmd-ns "$n" "$ETC/hosts" "$CONF" "$python" "$REAPER" "${launcher[@]}" \
            </dev/null >>"$LOG/reaper-$n.log" 2>&1 &
        for ((i = 0; i < 100; i++)); do
            pid_alive "$RUN/slurmd-$n.pid" slurmd && break
            sleep 0.1
        done
        pid_alive "$RUN/slurmd-$n.pid" slurmd || fail "slurmd $n did not start (no live pid in $RUN/slurmd-$n.pid)"
        readlink "/proc/$(tr -dc '0-9' <"$RUN/slurmd-$n.pid")/ns/uts" >"$RUN/slurmd-$n.utsns"
    done

    for ((i = 0; i < TIMEOUT * 4; i++)); do
        if all_idle; then
            # slurmctld's first scheduling pass comes ~3 s after it starts;
            # until then batch jobs just sit PENDING. Wait for it (it logs its
            # SchedulerParameters) so the first job is as quick as later ones.
            for ((j = 0; j < 40; j++)); do
                grep -q 'SchedulerParameters=' "$LOG/slurmctld.log" 2>/dev/null && break
                sleep 0.25
            done
            log "cluster up: $NODES node(s) idle after $((($(date +%s%N) - t0) / 1000000)) ms"
            log "use: export SLURM_CONF=$CONF"
            return 0
        fi
        sleep 0.25
    done
    fail "nodes not idle after ${TIMEOUT}s"
}

case ${1:-} in
start) cmd_start ;;
stop) cmd_stop ;;
restart)
    cmd_stop
    cmd_start
    ;;
status)
    if healthy; then
        slurm_cmd timeout 10 sinfo -N
    else
        log "not running or unhealthy"
        exit 1
    fi
    ;;
lose) lose_node "${2:-}" ;;
env)
    echo "export SLURM_CONF=$CONF"
    if [[ -n $SROOT ]]; then echo "export PATH=$DIR/bin:\$PATH"; fi
    ;;
*)
    echo "usage: $0 {start|stop|restart|status|env|lose NODE}" >&2
    exit 2
    ;;
esac
