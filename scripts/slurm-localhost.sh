#!/usr/bin/env bash
# A real SLURM cluster on this machine (slurmctld + slurmd on localhost, its own munged), for the
# tests of scalelab's SLURM launcher. Following ../shared/recipes/slurm-localhost.md.
#
#   scripts/slurm-localhost.sh start    # prints SLURM_CONF=<path>: export it to use the cluster
#   scripts/slurm-localhost.sh stop     # cancels its jobs, ends its daemons, removes its files
#   scripts/slurm-localhost.sh status
#
# Needs root and the packages slurm-wlm and munge (scripts/deps.sh installs them). Everything
# lives in $SCALELAB_SLURM_DIR (default /tmp/scalelab-slurm): configuration, state, logs, and a
# munged of its own on a private socket, so that a system munged is neither needed nor touched.
# Ports: $SCALELAB_SLURMCTLD_PORT and $SCALELAB_SLURMD_PORT (default 6817, 6818).
# Exit codes: 0 ok; 1 failed (logs printed); 77 cannot run here (not root, packages missing).
set -uo pipefail

D=${SCALELAB_SLURM_DIR:-/tmp/scalelab-slurm}
CTLD_PORT=${SCALELAB_SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SCALELAB_SLURMD_PORT:-6818}
NODE=$(hostname -s)
export SLURM_CONF=$D/slurm.conf

die() { echo "slurm-localhost: $*" >&2; exit 1; }

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Ends the processes whose ids are in the files given: TERM to all at once, then KILL to any
# still there after 5 s.
end_pid_files() {
  local pids=() f pid
  for f in "$@"; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  for _ in $(seq 50); do
    local left=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [ $left -eq 0 ] && return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

show_logs() {
  for f in "$D"/log/*; do
    [ -f "$f" ] || continue
    echo "--- $f (last 20 lines)" >&2
    tail -n 20 "$f" >&2
  done
}

check_prerequisites() {
  if [ "$(id -u)" -ne 0 ]; then echo "slurm-localhost: needs root (the daemons run as root)" >&2; exit 77; fi
  for b in slurmctld slurmd munged sbatch srun sinfo; do
    command -v "$b" >/dev/null || { echo "slurm-localhost: $b not found: install slurm-wlm and munge (scripts/deps.sh)" >&2; exit 77; }
  done
  [ -f /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ] || [ -n "$(find /usr/lib -name mpi_pmix.so 2>/dev/null | head -1)" ] ||
    echo "slurm-localhost: warning: SLURM's mpi_pmix plugin not found; srun --mpi=pmix will fail" >&2
}

start() {
  check_prerequisites
  if alive "$D/slurmctld.bgpid" || alive "$D/slurmd.bgpid"; then
    echo "slurm-localhost: a cluster from $D is running; stopping it first" >&2
    stop
  fi
  rm -rf "$D"
  mkdir -p "$D"/{state,spool,log,munge}
  chmod 755 "$D"

  # munged of our own, on a private socket, with the system key (made if missing).
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key || die "cannot create /etc/munge/munge.key"
  chown munge:munge "$D/munge"
  chmod 755 "$D/munge"
  local sock=$D/munge/munge.socket
  runuser -u munge -- /usr/sbin/munged --socket="$sock" --pid-file="$D/munge/munged.pid" \
    --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed" </dev/null || {
    cat "$D/munge/munged.log" >&2 2>/dev/null; die "munged did not start"; }
  cp "$D/munge/munged.pid" "$D/munged.bgpid"
  munge --socket="$sock" -n | unmunge --socket="$sock" >/dev/null || die "munge self-test failed"

  local mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024 ))
  cat >"$SLURM_CONF" <<EOF
ClusterName=scalelab
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=${sock}
CredType=cred/munge
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
MpiDefault=pmix
ReturnToService=2
MinJobAge=5
KillWait=5
InactiveLimit=0
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP
EOF
  # Own sessions, stdio on files: the daemons outlive this script and hold no caller's pipe.
  setsid slurmctld -D -f "$SLURM_CONF" </dev/null >"$D/log/slurmctld.out" 2>&1 & echo $! >"$D/slurmctld.bgpid"
  setsid slurmd -D -f "$SLURM_CONF" </dev/null >"$D/log/slurmd.out" 2>&1 & echo $! >"$D/slurmd.bgpid"
  for _ in $(seq 150); do
    [ "$(sinfo -h -n "$NODE" -o %T 2>/dev/null)" = idle ] && { echo "SLURM_CONF=$SLURM_CONF"; return 0; }
    alive "$D/slurmctld.bgpid" && alive "$D/slurmd.bgpid" || break
    sleep 0.2
  done
  echo "slurm-localhost: the node did not become idle (state: $(sinfo -h -n "$NODE" -o %T 2>&1))" >&2
  show_logs
  stop
  exit 1
}

stop() {
  [ -d "$D" ] || return 0
  if [ -f "$SLURM_CONF" ] && alive "$D/slurmctld.bgpid"; then
    for job in $(squeue -h -o %i 2>/dev/null); do scancel "$job" 2>/dev/null || true; done
  fi
  end_pid_files "$D/slurmd.bgpid" "$D/slurmctld.bgpid" "$D/munged.bgpid"
  rm -rf "$D"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) sinfo; squeue ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
