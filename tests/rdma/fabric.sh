#!/usr/bin/env bash
# fabric.sh CMD ARGS...: inside the RDMA test guest (the job tests/rdma/run.sh writes runs it
# first), builds the soft-RoCE fabric of tests/rdma/lib.sh, then replaces itself with CMD.
#
# Two devices on one kernel need two netdevs that really carry packets: a veth pair, both
# ends in this namespace.  rxe sends through its own netdev, so a packet from rxe1 (veth1)
# to 10.0.0.1 crosses the pair even though 10.0.0.1 is a local address; the receiving end
# must then accept a packet whose source is local too (accept_local).  `rdma link add` needs
# the "crc32" hash, which crc32_generic (loaded by the initramfs) provides.
#
# CMD inherits ZS_RDMA_DEV0/1, ZS_RDMA_NETDEV0/1, ZS_RDMA_ADDR0/1 and ZS_RDMA_GID0/1 (the
# RoCE v2 GID index of each device's address), for tests that want them.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

if [ "${ZS_RDMA_GUEST:-}" != 1 ]; then
  echo "fabric.sh: runs inside the RDMA test guest (tests/rdma/run.sh); ZS_RDMA_GUEST is not 1" >&2
  exit 2
fi

trap 'echo "fabric.sh: setting up the soft-RoCE fabric failed at line $LINENO" >&2' ERR
start=$(now_ms)
# One ip and one rdma for the lot: under emulation every program started costs tens of
# milliseconds.
ip -batch - <<END
link set lo up
link add $ZS_RDMA_NETDEV0 type veth peer name $ZS_RDMA_NETDEV1
addr add $ZS_RDMA_ADDR0/24 dev $ZS_RDMA_NETDEV0
addr add $ZS_RDMA_ADDR1/24 dev $ZS_RDMA_NETDEV1
END
for conf in all "$ZS_RDMA_NETDEV0" "$ZS_RDMA_NETDEV1"; do
  echo 1 >"/proc/sys/net/ipv4/conf/$conf/accept_local"
  echo 0 >"/proc/sys/net/ipv4/conf/$conf/rp_filter"
done
ip -batch - <<END
link set $ZS_RDMA_NETDEV0 up
link set $ZS_RDMA_NETDEV1 up
END
rdma -b - <<END
link add $ZS_RDMA_DEV0 type rxe netdev $ZS_RDMA_NETDEV0
link add $ZS_RDMA_DEV1 type rxe netdev $ZS_RDMA_NETDEV1
END
for n in 0 1; do
  dev_var=ZS_RDMA_DEV$n addr_var=ZS_RDMA_ADDR$n
  dev=${!dev_var}
  wait_until 10 "$dev port 1 ACTIVE" port_active "$dev"
  wait_until 10 "$dev GID for ${!addr_var}" gid_index "$dev" "${!addr_var}" >/dev/null
  printf -v "ZS_RDMA_GID$n" '%s' "$(gid_index "$dev" "${!addr_var}")"
done
export ZS_RDMA_GID0 ZS_RDMA_GID1
read -r kernel </proc/sys/kernel/osrelease
echo "rdma guest: kernel $kernel; $ZS_RDMA_DEV0 ($ZS_RDMA_NETDEV0 $ZS_RDMA_ADDR0, gid $ZS_RDMA_GID0)" \
  "and $ZS_RDMA_DEV1 ($ZS_RDMA_NETDEV1 $ZS_RDMA_ADDR1, gid $ZS_RDMA_GID1) up in $(($(now_ms) - start)) ms"
exec "$@"
