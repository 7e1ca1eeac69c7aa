# Emulated hosts for multi-host tests and benchmarks: one network namespace per role (the
# coordinator, each partition server, each worker), each with one interface, eth0, a veth pair
# whose other end is a port of a bridge in a hub namespace of its own.  Nothing is created in
# the root namespace, so the addresses (10.77.0.0/16) are private to the run and runs in
# parallel do not collide: only the namespace names are global, and they carry a prefix unique
# to the run (MH_PREFIX, default zsmh<pid>).
#
#   coordinator  MH_PREFIX-c    10.77.0.1
#   server i     MH_PREFIX-s<i> 10.77.1.<i>
#   worker i     MH_PREFIX-w<i> 10.77.2.<i>
#
# Shaping: each link is shaped in both directions (the role's eth0 egress, and the bridge
# port's egress towards the role), like a NIC of that rate: tbf for the rate alone; netem
# (rate, delay, loss) when a delay or a loss is asked for.  netem needs the sch_netem module:
# a kernel without it (this project's CI host) refuses, and mh_up says so and fails.
#
# Source it (functions mh_*), or run it: `netns.sh up S W [RATE [DELAY [LOSS]]]`, `down`,
# `cut NAME`, `heal NAME`, `exec NAME CMD...`, with MH_PREFIX set (NAME: c, s1, w2, ...).
# Sourcing it sets no trap: the caller's EXIT trap must call mh_down (which removes whatever
# of the run exists, also after a half-finished mh_up).

MH_PREFIX_GIVEN=${MH_PREFIX:-}
MH_PREFIX=${MH_PREFIX:-zsmh$$}

# mh_ns NAME: the namespace of role NAME (c, s1, w1, hub).
mh_ns() { echo "$MH_PREFIX-$1"; }

# mh_addr NAME: the address of role NAME.
mh_addr() {
  case "$1" in
  c) echo 10.77.0.1 ;;
  s*) echo "10.77.1.${1#s}" ;;
  w*) echo "10.77.2.${1#w}" ;;
  *) echo "mh_addr: no role '$1'" >&2 && return 1 ;;
  esac
}

# mh_can: whether this process may create namespaces and bridges (root, iproute2); the reason
# on stderr when not.
mh_can() {
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "no ip/tc (iproute2)" >&2
    return 1
  fi
  local probe="$MH_PREFIX-probe"
  ip netns add "$probe" 2>/dev/null || {
    echo "cannot create a network namespace (not root?)" >&2
    return 1
  }
  local ok=0
  ip -n "$probe" link add br0 type bridge 2>/dev/null || {
    echo "cannot create a bridge (no bridge support in this kernel?)" >&2
    ok=1
  }
  ip netns del "$probe"
  return $ok
}

# mh_has_netem: whether this kernel has netem (sch_netem), tried on a scratch namespace's lo.
mh_has_netem() {
  local probe="$MH_PREFIX-netem" ok=1
  ip netns add "$probe" 2>/dev/null || return 1
  tc -n "$probe" qdisc add dev lo root netem delay 1ms 2>/dev/null && ok=0
  ip netns del "$probe"
  return $ok
}

# mh_shape NS DEV RATE DELAY LOSS: the root qdisc of DEV in NS.
mh_shape() {
  local ns=$1 dev=$2 rate=$3 delay=$4 loss=$5
  [ -n "$rate" ] || [ -n "$delay" ] || [ -n "$loss" ] || return 0
  if [ -n "$delay" ] || [ -n "$loss" ]; then
    # netem's own rate; a limit large enough for a window at that rate.
    tc -n "$ns" qdisc replace dev "$dev" root netem limit 100000 \
      ${delay:+delay "$delay"} ${loss:+loss "$loss"} ${rate:+rate "$rate"} || {
      echo "mh_up: tc netem failed on $ns $dev (no sch_netem in this kernel?)" >&2
      return 1
    }
  else
    # A burst of 1 ms at the rate, at least 128 KiB (a GSO segment must fit); a queue of 20 ms.
    local bits
    bits=$(mh_rate_bits "$rate") || return 1
    local burst=$((bits / 8 / 1000))
    [ $burst -ge 131072 ] || burst=131072
    tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" \
      latency 20ms || {
      echo "mh_up: tc tbf failed on $ns $dev" >&2
      return 1
    }
  fi
}

# mh_rate_bits RATE: RATE (100mbit, 1gbit, 10gbit, 500kbit) in bits per second.
mh_rate_bits() {
  local r=${1,,}
  case "$r" in
  *gbit) echo $((${r%gbit} * 1000000000)) ;;
  *mbit) echo $((${r%mbit} * 1000000)) ;;
  *kbit) echo $((${r%kbit} * 1000)) ;;
  *bit) echo "${r%bit}" ;;
  *) echo "mh_rate_bits: '$1' is not a rate like 1gbit or 100mbit" >&2 && return 1 ;;
  esac
}

# mh_host NAME RATE DELAY LOSS: role NAME's namespace, linked to the hub's bridge.
mh_host() {
  local name=$1 ns hub
  ns=$(mh_ns "$1")
  hub=$(mh_ns hub)
  ip netns add "$ns" || return 1
  ip -n "$hub" link add "$name" type veth peer name eth0 netns "$ns" || return 1
  ip -n "$hub" link set "$name" master br0 up || return 1
  ip -n "$ns" addr add "$(mh_addr "$name")/16" dev eth0 || return 1
  ip -n "$ns" link set lo up || return 1
  ip -n "$ns" link set eth0 up || return 1
  mh_shape "$ns" eth0 "$2" "$3" "$4" || return 1
  mh_shape "$hub" "$name" "$2" "$3" "$4" || return 1
}

# mh_up S W [RATE [DELAY [LOSS]]]: the hub, the coordinator's namespace, S servers' and W
# workers' (RATE like 1gbit, DELAY like 50us, LOSS like 1%; empty: not shaped).
mh_up() {
  local S=$1 W=$2 rate=${3:-} delay=${4:-} loss=${5:-} i hub
  hub=$(mh_ns hub)
  ip netns add "$hub" || return 1
  ip -n "$hub" link add br0 type bridge || return 1
  # No spanning tree (a new port would wait in "listening" state) and no forwarding delay.
  ip -n "$hub" link set br0 type bridge stp_state 0 forward_delay 0 2>/dev/null || true
  ip -n "$hub" link set br0 up || return 1
  mh_host c "$rate" "$delay" "$loss" || return 1
  for ((i = 1; i <= S; i++)); do mh_host "s$i" "$rate" "$delay" "$loss" || return 1; done
  for ((i = 1; i <= W; i++)); do mh_host "w$i" "$rate" "$delay" "$loss" || return 1; done
  # Every host reaches the coordinator (also a check that the bridge forwards).
  for ((i = 1; i <= S; i++)); do mh_ping "s$i" || return 1; done
  for ((i = 1; i <= W; i++)); do mh_ping "w$i" || return 1; done
}

# mh_ping NAME: NAME reaches the coordinator's address within 5 s: a TCP connection to a port
# where nothing listens is refused (an RST came back), not lost (no ping on a minimal Debian).
mh_ping() {
  local k ns
  ns=$(mh_ns "$1")
  for ((k = 0; k < 10; k++)); do
    case "$(ip netns exec "$ns" timeout 0.5 bash -c ': </dev/tcp/10.77.0.1/9' 2>&1)" in
    *"Connection refused"*) return 0 ;;
    esac
  done
  echo "mh_up: $1 does not reach the coordinator's address 10.77.0.1" >&2
  return 1
}

# mh_down: removes every namespace of this run (the veths and the bridge go with them).  Any
# process still running in one of them keeps it alive as an unnamed namespace until it exits:
# the caller kills its processes first.
mh_down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case "$ns" in
    "$MH_PREFIX"-*) ip netns del "$ns" 2>/dev/null || true ;;
    esac
  done
}

# mh_cut NAME / mh_heal NAME: takes the bridge port of role NAME down (the cable pulled: every
# frame to or from it is lost, the TCP connections stay open and retransmit) / up again.
mh_cut() { ip -n "$(mh_ns hub)" link set "$1" down; }
mh_heal() { ip -n "$(mh_ns hub)" link set "$1" up; }

# mh_exec NAME CMD...: CMD in role NAME's namespace (exec: the pid is CMD's).
mh_exec() {
  local ns
  ns=$(mh_ns "$1")
  shift
  exec ip netns exec "$ns" "$@"
}

# mh_bytes NAME: "RX TX" bytes of role NAME's eth0 so far.
mh_bytes() {
  local ns
  ns=$(mh_ns "$1")
  echo "$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes) $(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes)"
}

# mh_job_start ZSHARD CONFIG DATA STEPS OUT LOGS S W: a job over the namespaces of mh_up S W:
# `zshard coord` in c on 10.77.0.1:7000, `zshard server` in s<i> (data plane over TCP on its own
# address), `zshard worker` in w<i>, each with 1 thread, stderr in LOGS/<name>.log; the job's
# secret from ZSHARD_SECRET_FILE.  Sets MH_PIDS (the coordinator's first) and MH_COORD.  Fails
# when the coordinator does not say it listens within 15 s.
MH_PIDS=()
MH_COORD=
mh_job_start() {
  local zs=$1 cfg=$2 data=$3 steps=$4 out=$5 logs=$6 S=$7 W=$8 i k
  mkdir -p "$logs"
  (mh_exec c "$zs" coord --listen tcp://10.77.0.1:7000 --config "$cfg" --servers "$S" \
    --data "$data" --steps "$steps" --out "$out") 2>"$logs/coord.log" &
  MH_COORD=$!
  MH_PIDS+=("$MH_COORD")
  for ((k = 0; k < 300; k++)); do
    grep -q 'coord: listening on' "$logs/coord.log" 2>/dev/null && break
    kill -0 "$MH_COORD" 2>/dev/null || break
    sleep 0.05
  done
  grep -q 'coord: listening on' "$logs/coord.log" 2>/dev/null || {
    echo "mh_job_start: the coordinator does not listen: $(tail -n 3 "$logs/coord.log")" >&2
    return 1
  }
  for ((i = 1; i <= S; i++)); do
    (mh_exec "s$i" "$zs" server --coord tcp://10.77.0.1:7000 --listen "$(mh_addr "s$i"):0" \
      --threads 1 --transport tcp) 2>"$logs/s$i.log" &
    MH_PIDS+=($!)
  done
  for ((i = 1; i <= W; i++)); do
    (mh_exec "w$i" "$zs" worker --coord tcp://10.77.0.1:7000 --data "$data" --threads 1) \
      2>"$logs/w$i.log" &
    MH_PIDS+=($!)
  done
}

# mh_job_wait SECONDS: waits for the coordinator for at most SECONDS (then kills it), and
# for every other process of the job for 15 s more (then kills them); MH_RC: the
# coordinator's exit status (137 when killed).  Returns 1 if anything had to be killed.
mh_job_wait() {
  local end=$((SECONDS + $1)) p killed=0
  while kill -0 "$MH_COORD" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.05; done
  kill -0 "$MH_COORD" 2>/dev/null && { kill -KILL "$MH_COORD" 2>/dev/null; killed=1; }
  MH_RC=0
  wait "$MH_COORD" 2>/dev/null || MH_RC=$?
  end=$((SECONDS + 15))
  for p in "${MH_PIDS[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.05; done
    kill -0 "$p" 2>/dev/null && { kill -KILL "$p" 2>/dev/null; killed=1; }
    wait "$p" 2>/dev/null || true
  done
  return $killed
}

# mh_kill_all: kills every process of the job (an EXIT trap's first step, before mh_down).
mh_kill_all() {
  local p
  for p in "${MH_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${MH_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  [ -n "$MH_PREFIX_GIVEN" ] || { echo "netns.sh: set MH_PREFIX (the same for up, cut, heal and down)" >&2; exit 2; }
  cmd=${1:-}
  shift || true
  case "$cmd" in
  up) mh_up "$@" ;;
  down) mh_down ;;
  cut) mh_cut "$@" ;;
  heal) mh_heal "$@" ;;
  exec) mh_exec "$@" ;;
  *)
    echo "usage: MH_PREFIX=P netns.sh up S W [RATE [DELAY [LOSS]]] | down | cut NAME | heal NAME | exec NAME CMD..." >&2
    exit 2
    ;;
  esac
fi
