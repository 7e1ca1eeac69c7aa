#!/bin/bash
# tests/slurm/cluster.sh DIR up|down: a throwaway Slurm cluster under DIR, one slurmctld and
# three slurmd (emulated nodes n1..n3, all at 127.0.0.1, each on a port of its own), for the
# tests of deploy/slurm/ (tests/slurm/run.sh; docs/slurm.md).  After `up`, use it with
# SLURM_CONF=DIR/etc/slurm.conf.  `down` cancels the jobs, stops every daemon it started and
# the jobs' slurmstepd (scontrol shutdown, SIGTERM; SIGKILL to those still there 5 s later).
#
# Ports: slurmctld on ZS_SLURM_PORT (default 26817), the nodes on the next three, srun on
# ZS_SLURM_PORT+83..+182: below the kernel's ephemeral range, where the tests' own processes
# take their ports.  Authentication: auth/none (Slurm 22.05 still has it), so no munged.
# State is wiped at each `up`: stale node state shows nodes idle too early.
set -eu
here=$(cd "$(dirname "$0")" >/dev/null && pwd)
base=$(mkdir -p "$1" && cd "$1" >/dev/null && pwd)
export SLURM_CONF=$base/etc/slurm.conf
nodes="n1 n2 n3"
port=${ZS_SLURM_PORT:-26817}
case "${2:-}" in
up)
  rm -rf "$base"/state "$base"/spool "$base"/log "$base"/run
  mkdir -p "$base"/{etc,state,log,run} $(for n in $nodes; do echo "$base/spool/$n"; done)
  sed -e "s#BASE#$base#g" -e "s#CTLPORT#$port#" -e "s#N1PORT#$((port + 1))#" \
    -e "s#N2PORT#$((port + 2))#" -e "s#N3PORT#$((port + 3))#" \
    -e "s#SRUNPORTS#$((port + 83))-$((port + 182))#" "$here/slurm.conf.in" >"$SLURM_CONF"
  slurmctld -f "$SLURM_CONF"
  for n in $nodes; do slurmd -f "$SLURM_CONF" -N $n; done
  for _ in $(seq 100); do
    [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | wc -l)" = "$(echo $nodes | wc -w)" ] && exit 0
    sleep 0.1
  done
  echo "tests/slurm/cluster.sh: nodes not idle after 10 s" >&2
  sinfo -N >&2 || true
  exit 1
  ;;
down)
  pids=$(cat "$base"/run/*.pid 2>/dev/null || true)
  # Jobs first, while slurmd still runs to end their steps; then the daemons.  A step's
  # slurmstepd outlives slurmd, so those still there (their working directory is under
  # DIR) are killed.
  scancel --user="$(id -un)" >/dev/null 2>&1 || true
  for _ in $(seq 50); do
    [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
    sleep 0.1
  done
  scontrol shutdown >/dev/null 2>&1 || true
  for p in $(pgrep -x slurmstepd || true); do
    case $(readlink "/proc/$p/cwd" 2>/dev/null) in
    "$base"/*) kill -KILL "$p" 2>/dev/null || true ;;
    esac
  done
  alive=
  for _ in $(seq 50); do
    alive=
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  [ -z "$alive" ] || kill -9 $alive 2>/dev/null || true
  rm -f "$base"/run/*.pid
  ;;
*)
  echo "usage: tests/slurm/cluster.sh DIR up|down" >&2
  exit 2
  ;;
esac
