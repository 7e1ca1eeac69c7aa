# shellcheck shell=bash
# Helpers for the scripts that run inside the RDMA test guest (fabric.sh, guest.sh,
# *.test.sh); source it.  The guest's fabric, set up by fabric.sh, is fixed:
#   rxe0 on veth0, 10.0.0.1/24    rxe1 on veth1, 10.0.0.2/24
# and the two veth ends are a pair, so RoCE packets between rxe0 and rxe1 cross it.

export ZS_RDMA_DEV0=rxe0 ZS_RDMA_NETDEV0=veth0 ZS_RDMA_ADDR0=10.0.0.1
export ZS_RDMA_DEV1=rxe1 ZS_RDMA_NETDEV1=veth1 ZS_RDMA_ADDR1=10.0.0.2

# now_ms: milliseconds since boot, for deadlines (the guest's clock has no other use here).
now_ms() {
  local up
  read -r up _ </proc/uptime
  echo $((${up%.*} * 1000 + 10#${up#*.} * 10))
}

# wait_until SECONDS WHAT CMD...: runs CMD every 50 ms until it succeeds; returns 1 with a
# message naming WHAT if SECONDS pass first.  The only sleeps in these scripts are its polls.
wait_until() {
  local limit=$1 what=$2
  shift 2
  local deadline=$(($(now_ms) + limit * 1000))
  until "$@"; do
    if [ "$(now_ms)" -ge $deadline ]; then
      echo "wait_until: $what: not true after $limit s" >&2
      return 1
    fi
    sleep 0.05
  done
}

# gid_index DEV IPV4: prints the index of DEV's port-1 RoCE v2 GID for IPV4 (the GID is the
# IPv4-mapped IPv6 address); returns 1 if there is none yet.  rxe lists each address twice,
# as RoCE v1 and v2; rxe speaks only v2, so v1 entries would not connect.  Builtins only:
# under emulation every program started costs tens of milliseconds.
gid_index() {
  local dev=$1 a b c d want
  IFS=. read -r a b c d <<<"$2"
  printf -v want '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d"
  local port=/sys/class/infiniband/$dev/ports/1 g i gid type
  for g in "$port"/gids/*; do
    i=${g##*/}
    { read -r gid <"$g" && read -r type <"$port/gid_attrs/types/$i"; } 2>/dev/null || continue
    if [ "$gid" = "$want" ] && [ "$type" = "RoCE v2" ]; then
      echo "$i"
      return 0
    fi
  done
  return 1
}

# port_active DEV: DEV's port 1 is ACTIVE.
port_active() {
  local state
  # The file reads "4: ACTIVE".
  read -r _ state <"/sys/class/infiniband/$1/ports/1/state" 2>/dev/null && [ "$state" = ACTIVE ]
}
