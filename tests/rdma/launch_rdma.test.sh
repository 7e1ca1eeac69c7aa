# launch_rdma.test.sh BUILD_DIR WORKDIR (in the guest of tests/rdma/run.sh): whole jobs with
# cluster.transport "rdma", against zshard train's bits.
#
# 1. fp32, two devices: a coordinator, two servers listening on 10.0.0.1 (rxe0, found by the
#    address) and workers on rxe1 (ZS_RDMA_DEVICE), started by hand; one worker is SIGKILLed
#    mid-run and another joins.  The bits are zshard train's, rxe1 carried traffic, and no
#    process is left.
# 2. bf16, zshard launch --bind 10.0.0.1 with an elastic script (a kill, a join): the bits are
#    zshard train's and no process outlives the launcher.
# 3. A worker that offers no RDMA (ZS_RDMA_DISABLE=1, as on a host without a device) is refused
#    by the coordinator with a reason, not left hanging.
set -- "$1/zshard" "$2"
# shellcheck source=../integration/elastic_lib.sh
source "$(dirname "$0")/../integration/elastic_lib.sh"
STEPS=12
ADDR0=${ZS_RDMA_ADDR0:-10.0.0.1}
DEV1=${ZS_RDMA_DEV1:-rxe1}
trap kill_started EXIT

# rdma_config FILE BF16: the elastic config with the data plane over RDMA.  Heartbeats are
# slower than elastic_config's: the guest runs under emulation.
rdma_config() {
  elastic_config "$1" "$SMALL"
  python3 - "$1" "$2" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["cluster"].update({"transport": "rdma", "heartbeat_interval_ms": 200,
                     "heartbeat_timeout_ms": 8000})
c["bf16"] = {"enabled": sys.argv[2] == "1"}
json.dump(c, open(sys.argv[1], "w"), indent=1)
EOF
}

sent_pkts() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/sent_pkts" 2>/dev/null || echo 0; }

# ---- 1: fp32, servers on rxe0, workers on rxe1, a kill and a join ----
rdma_config "$WORK/fp32.json" 0
train_reference "$WORK/fp32.json" $STEPS
mv "$WORK/train" "$WORK/train_fp32"
before=$(sent_pkts "$DEV1")
SERVERS=2 start_coord "$WORK/coord.log" "$WORK/fp32.json" $STEPS "$WORK/fp32"
for s in 1 2; do
  "$ZSHARD" server --coord "$EP" --listen "$ADDR0:0" --transport rdma --threads 1 \
    2>"$WORK/server$s.log" &
  PIDS+=($!)
done
start_worker() {
  ZS_RDMA_DEVICE=$DEV1 "$ZSHARD" worker --coord "$EP" --data "$DATA/tiny.txt" --threads 1 \
    2>"$WORK/worker$1.log" &
  PIDS+=($!)
  WPID[$1]=$!
}
declare -a WPID
start_worker 1
start_worker 2
steps_done() { [ "$(wc -l <"$WORK/fp32/metrics.jsonl" 2>/dev/null || echo 0)" -ge "$1" ]; }
coord_gone() { ! alive "$COORD"; }
wait_until 120 steps_done 4 ||
  fail "fp32: 4 steps not done in 120 s: $(tail -n 3 "$WORK/coord.log")"
kill -KILL "${WPID[1]}"
start_worker 3
wait_until 240 coord_gone || fail "fp32: the coordinator still runs after 240 s"
checks=$((checks + 1))
wait "$COORD" || fail "fp32: the coordinator exited $?: $(tail -n 5 "$WORK/coord.log")"
same_bits fp32 "$WORK/fp32" "$WORK/train_fp32"
expect_log fp32 "$WORK/server1.log" "data plane over rdma"
checks=$((checks + 1))
after=$(sent_pkts "$DEV1")
[ "$after" -gt "$before" ] || fail "fp32: $DEV1 sent no packets ($before before, $after after)"
echo "launch_rdma: fp32: $DEV1 sent $((after - before)) packets"
none_started_left

# ---- 2: bf16 through zshard launch, with an elastic script ----
rdma_config "$WORK/bf16.json" 1
train_reference "$WORK/bf16.json" $STEPS
mv "$WORK/train" "$WORK/train_bf16"
printf 'step 3 start\nstep 5 kill 1\n' >"$WORK/script"
launch_elastic bf16 "$WORK/bf16.json" $STEPS 2 1 --bind "$ADDR0" --elastic-script "$WORK/script"
mv "$WORK/train_bf16" "$WORK/train"
check_same bf16 $STEPS
check_none_left bf16

# ---- 3: a worker without RDMA is refused, named ----
PIDS=()
SERVERS=1 start_coord "$WORK/coord3.log" "$WORK/fp32.json" $STEPS "$WORK/refuse"
"$ZSHARD" server --coord "$EP" --listen "$ADDR0:0" --transport rdma --threads 1 \
  2>"$WORK/server3.log" &
PIDS+=($!)
wait_until 60 has_line "$WORK/coord3.log" "server [0-9]+ registered" || fail "refuse: no server"
RC=0
ZS_RDMA_DISABLE=1 timeout 60 "$ZSHARD" worker --coord "$EP" --data "$DATA/tiny.txt" \
  --threads 1 2>"$WORK/worker_refused.log" || RC=$?
checks=$((checks + 1))
[ $RC -ne 0 ] && [ $RC -ne 124 ] || fail "refuse: the worker exited $RC"
expect_log refuse "$WORK/worker_refused.log" "the servers serve rdma and this worker does not offer it"
kill_started
finish
