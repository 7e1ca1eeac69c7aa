# Every worker killed: the job waits with no worker (a worker's death is not a failure in
# elastic mode, and the coordinator has no one to give the chunks to), until the script starts
# a new one 1.5 s later; it attaches and the run finishes with zshard train's bits.  Starts
# with --workers 0: the script starts the first two.  No process of the launch is left.
source "$(dirname "$0")/elastic_lib.sh"
STEPS=10
elastic_config "$WORK/job.json" "$MEDIUM"
train_reference "$WORK/job.json" $STEPS
cat >"$WORK/script.txt" <<'SCRIPT'
step 1 start 2    # workers 1 and 2, at once
step 4 kill all
after 1500 start  # worker 3, while the job waits
SCRIPT
launch_elastic run "$WORK/job.json" $STEPS 1 0 --elastic-script "$WORK/script.txt"
check_same run $STEPS
check_none_left run
expect_line run '^zshard launch: step 1: start worker 2 \(pid [0-9]+\)$' "worker 2 did not start"
expect_line run '^zshard launch: step 4: SIGKILL worker 1 \(pid [0-9]+\)$' "worker 1 was not killed"
expect_line run '^zshard launch: step 4: SIGKILL worker 2 \(pid [0-9]+\)$' "worker 2 was not killed"
expect_line run '^zshard launch: no worker is running; the job waits for the script to start one$' \
  "no word that the job waits"
expect_line run '^zshard launch: after 1500 ms: start worker 3 \(pid [0-9]+\)$' "worker 3 did not start"
checks=$((checks + 1))
grep -q 'zshard launch: no workers started' "$WORK/run.err" &&
  fail "run: told to attach workers by hand although the script starts them"
finish
