# Whole jobs over the shared-memory data plane (cluster.transport "shm", transport/shm.h):
# zshard launch with 2 servers, fp32 and bf16, each with an elastic script that SIGKILLs a
# worker mid-run (while the servers may be reading its pushes out of its memory) and starts
# another: the bits are zshard train's, the servers said they serve shm, and no process is
# left.  Then a server told to serve tcp in a job whose config says shm is refused by the
# coordinator with the reason.
source "$(dirname "$0")/elastic_lib.sh"
STEPS=12

shm_config() {
  elastic_config "$1" "$SMALL"
  python3 - "$1" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["cluster"]["transport"] = "shm"
c["bf16"] = {"enabled": sys.argv[2] == "1"}
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
}

for dt in fp32 bf16; do
  shm_config "$WORK/$dt.json" "$([ $dt = bf16 ] && echo 1 || echo 0)"
  train_reference "$WORK/$dt.json" $STEPS
  printf 'step 3 start\nstep 5 kill 1\nstep 8 start\n' >"$WORK/$dt.script"
  launch_elastic "$dt" "$WORK/$dt.json" $STEPS 2 1 --elastic-script "$WORK/$dt.script" \
    --log-level info
  check_same "$dt" $STEPS
  check_none_left "$dt"
  expect_line "$dt" "data plane over shm" "the servers serve shared memory"
  rm -rf "$WORK/train"
done

# A server that serves another backend than the config names is refused, with the reason.
trap kill_started EXIT
PIDS=()
start_coord "$WORK/coord.log" "$WORK/fp32.json" $STEPS "$WORK/refuse"
RC=0
timeout 60 "$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --transport tcp --threads 1 \
  2>"$WORK/server_tcp.log" || RC=$?
checks=$((checks + 1))
[ "$RC" -ne 0 ] && [ "$RC" -ne 124 ] || fail "a tcp server in a shm job exited $RC"
expect_log refuse "$WORK/server_tcp.log" 'this server serves tcp, but cluster.transport is shm'
kill_started
finish
