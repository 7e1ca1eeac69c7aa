# A hung worker (SIGSTOP) while another one works: the coordinator declares it dead after the
# heartbeat timeout (2 s here) and gives its chunks to the other; then it runs again (SIGCONT),
# finds it was dropped and exits on its own, and its late fetches and pushes change nothing:
# the bits are zshard train's.  Then a worker stopped and never continued: the job finishes
# without it, and the launcher stops it once the coordinator has exited (SIGTERM and SIGCONT).
# No process of either launch is left.
source "$(dirname "$0")/elastic_lib.sh"
STEPS=16
elastic_config "$WORK/job.json" "$MEDIUM"
train_reference "$WORK/job.json" $STEPS
cat >"$WORK/script.txt" <<'SCRIPT'
step 2 start      # worker 2
step 4 stop 1     # worker 1 hangs mid-step
after 3000 cont 1 # and comes back after it was declared dead
SCRIPT
launch_elastic run "$WORK/job.json" $STEPS 2 1 --elastic-script "$WORK/script.txt"
check_same run $STEPS
check_none_left run
expect_line run '^zshard launch: step 4: SIGSTOP worker 1 \(pid [0-9]+\)$' "no SIGSTOP"
expect_line run '^zshard launch: after 3000 ms: SIGCONT worker 1 \(pid [0-9]+\)$' "no SIGCONT"
checks=$((checks + 1))
grep -qE 'coord: worker [0-9]+ left: no heartbeat' "$WORK/run/logs/coord.log" ||
  fail "run: the coordinator did not declare the hung worker dead: $(grep -E 'WARN|ERROR' "$WORK/run/logs/coord.log")"
# Back from the hang, worker 1 must learn it was dropped and exit while the job runs, not hang
# until the launcher stops it at the end.
expect_line run '^zshard launch: worker 1 \(pid [0-9]+\) exited with status [0-9]+.*; the job goes on' \
  "worker 1 did not exit on its own after SIGCONT"
checks=$((checks + 1))
! grep -qE 'worker 1 \(pid [0-9]+\) is still running' "$WORK/run.err" ||
  fail "run: worker 1 had to be stopped by the launcher: $(cat "$WORK/run.err")"

# Stopped for good, on short steps.
elastic_config "$WORK/small.json" "$SMALL"
rm -rf "$WORK/train"
train_reference "$WORK/small.json" 10
printf 'step 1 start\nstep 3 stop 1\n' >"$WORK/never.txt"
launch_elastic never "$WORK/small.json" 10 1 1 --elastic-script "$WORK/never.txt"
check_same never 10
check_none_left never
expect_line never '^zshard launch: worker 1 \(pid [0-9]+\) is still running 2 s after the coordinator exited; stopping it' \
  "the stopped worker was not stopped at the end"
finish
