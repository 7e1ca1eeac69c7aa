# idle_wakeups.test.sh BUILD_DIR WORKDIR (in the guest of tests/rdma/run.sh): the idle-server
# test of tests/integration/idle_wakeups.sh, here where the server's "auto" transport finds
# soft-RoCE and serves RDMA: its loop sleeps on the completion channel, the async events and the
# set-up streams (rdma.c's wait_fd) as it does on TCP's epoll, and the job that follows has
# zshard train's bits.
set -euo pipefail
build=$1
work=$2
bash "$(dirname "$0")/../integration/idle_wakeups.sh" "$build/zshard" "$work"
if ! grep -q "data plane over rdma" "$work/server.log"; then
  echo "idle_wakeups.test.sh: the server did not serve rdma: $(grep 'data plane' "$work/server.log")" >&2
  exit 1
fi
echo "idle_wakeups.test.sh: the server served rdma"
