#!/usr/bin/env bash
# verbs_smoke.test.sh BUILD_DIR WORKDIR: the fabric carries RC traffic between its two
# devices, with nothing of zshard's involved: rdma-core's ibv_rc_pingpong, server on rxe0 and
# client on rxe1, each on the RoCE v2 GID of its own address.  Both must finish their
# ITERS round trips (default 500, ZS_SMOKE_ITERS), and the packets must have crossed the veth
# pair: each end sent at least ITERS of them.  Runs inside the guest (tests/rdma/guest.sh).
#
# The two processes busy-poll, so they are pinned to different CPUs: on one vCPU they would
# hand over only at scheduler ticks.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

if [ $# -ne 2 ] || [ "${ZS_RDMA_GUEST:-}" != 1 ]; then
  echo "usage: verbs_smoke.test.sh BUILD_DIR WORKDIR, inside the guest of tests/rdma/run.sh" >&2
  exit 2
fi
work=$2
iters=${ZS_SMOKE_ITERS:-500}
port=18515

fail() {
  echo "verbs_smoke: FAIL: $*" >&2
  exit 1
}

gid0=$(gid_index "$ZS_RDMA_DEV0" "$ZS_RDMA_ADDR0") || fail "$ZS_RDMA_DEV0 has no RoCE v2 GID for $ZS_RDMA_ADDR0"
gid1=$(gid_index "$ZS_RDMA_DEV1" "$ZS_RDMA_ADDR1") || fail "$ZS_RDMA_DEV1 has no RoCE v2 GID for $ZS_RDMA_ADDR1"
cpu0=() cpu1=()
if [ "$(nproc)" -ge 2 ]; then
  cpu0=(taskset -c 0) cpu1=(taskset -c 1)
fi

# tx_packets NETDEV: packets NETDEV has sent.
tx_packets() {
  cat "/sys/class/net/$1/statistics/tx_packets"
}
tx0_before=$(tx_packets "$ZS_RDMA_NETDEV0")
tx1_before=$(tx_packets "$ZS_RDMA_NETDEV1")

server=
stop_server() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
}
trap stop_server EXIT

echo "verbs_smoke: server $ZS_RDMA_DEV0 gid $gid0, client $ZS_RDMA_DEV1 gid $gid1, $iters iterations"
"${cpu0[@]}" ibv_rc_pingpong -d "$ZS_RDMA_DEV0" -g "$gid0" -p "$port" -n "$iters" \
  >"$work/server.log" 2>&1 &
server=$!

# listening: the server has its TCP port open for the out-of-band exchange (it opens it
# only after its device context is set up); fails fast if the server died instead.
listening() {
  kill -0 "$server" 2>/dev/null || fail "the server exited before listening: $(cat "$work/server.log")"
  [ -n "$(ss -Hltn "sport = :$port")" ]
}
wait_until 30 "ibv_rc_pingpong server listening on port $port" listening ||
  fail "server not listening; its output: $(cat "$work/server.log")"

rc=0
timeout 60 "${cpu1[@]}" ibv_rc_pingpong -d "$ZS_RDMA_DEV1" -g "$gid1" -p "$port" -n "$iters" \
  "$ZS_RDMA_ADDR0" >"$work/client.log" 2>&1 || rc=$?
echo "verbs_smoke: client: $(tail -n 1 "$work/client.log")"
[ $rc -eq 0 ] ||
  fail "client exited $rc; its output: $(cat "$work/client.log"); the server's: $(cat "$work/server.log")"

server_done() {
  ! kill -0 "$server" 2>/dev/null
}
wait_until 30 "ibv_rc_pingpong server exiting" server_done || fail "server still running after the client finished"
src=0
wait "$server" || src=$?
server=
echo "verbs_smoke: server: $(tail -n 1 "$work/server.log")"
[ $src -eq 0 ] || fail "server exited $src; its output: $(cat "$work/server.log")"
for log in server client; do
  grep -q "^$iters iters in" "$work/$log.log" || fail "$log did not report $iters iterations"
done

sent0=$(($(tx_packets "$ZS_RDMA_NETDEV0") - tx0_before))
sent1=$(($(tx_packets "$ZS_RDMA_NETDEV1") - tx1_before))
echo "verbs_smoke: packets sent: $ZS_RDMA_NETDEV0 $sent0, $ZS_RDMA_NETDEV1 $sent1"
[ "$sent0" -ge "$iters" ] || fail "$ZS_RDMA_NETDEV0 sent $sent0 packets, expected at least $iters"
[ "$sent1" -ge "$iters" ] || fail "$ZS_RDMA_NETDEV1 sent $sent1 packets, expected at least $iters"
echo "verbs_smoke: ok"
