# Workers join and leave a running job, through `zshard launch --elastic-script`: 1 worker at
# the start, a second at step 3, a third at step 5, one SIGKILLed at step 10 and one SIGTERMed
# at step 12, over 15 steps of ~200 ms (five steps for the third to register before the kill:
# with two, a loaded machine once had it register only after the kill).  The bits are zshard train's; the metrics' "workers"
# field shows the joins happened during the run; no process of the launch is left.
source "$(dirname "$0")/elastic_lib.sh"
STEPS=15
elastic_config "$WORK/job.json" "$MEDIUM"
train_reference "$WORK/job.json" $STEPS
cat >"$WORK/script.txt" <<'SCRIPT'
# joins
step 3 start      # worker 2
step 5 start      # worker 3
# leaves
step 10 kill any  # SIGKILL: the coordinator finds out by the heartbeat timeout
step 12 term any  # SIGTERM: it finishes its chunk and says it leaves
SCRIPT
launch_elastic run "$WORK/job.json" $STEPS 1 1 --elastic-script "$WORK/script.txt"
check_same run $STEPS
check_none_left run
expect_line run '^zshard launch: step 3: start worker 2 \(pid [0-9]+\)$' "worker 2 did not start"
expect_line run '^zshard launch: step 5: start worker 3 \(pid [0-9]+\)$' "worker 3 did not start"
expect_line run '^zshard launch: step 10: SIGKILL worker 1 \(pid [0-9]+\)$' "no SIGKILL"
expect_line run '^zshard launch: step 12: SIGTERM worker 2 \(pid [0-9]+\)$' "no SIGTERM"
expect_line run '^zshard launch: worker 1 \(pid [0-9]+\) was killed by signal 9 .*; the job goes on' \
  "the killed worker is not reported as an event"
expect_line run '^zshard launch: worker 2 \(pid [0-9]+\) exited with status 0; the job goes on' \
  "the terminated worker did not leave cleanly"
# The worker counts per step: 1 at first, 3 at some step, never more.
counts=$(sed -E 's/.*"workers": ([0-9]+).*/\1/' "$WORK/run/metrics.jsonl" | tr '\n' ' ')
echo "run: workers per step: $counts"
checks=$((checks + 1))
case " $counts" in
" 1 "*" 3 "*) ;;
*) fail "run: the workers per step ($counts) do not go from 1 to 3" ;;
esac
for c in $counts; do
  [ "$c" -le 3 ] || fail "run: $c workers at a step, at most 3 were started"
done
finish
