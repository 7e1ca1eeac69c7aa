# Chaos: over 30 short steps, a schedule of SIGKILLs, SIGTERMs and starts drawn from a seed
# (printed; ZS_TEST_SEED=N repeats it): at most 8 lines, and whenever the workers may all be
# gone a new one starts a moment later (a "step K" line would wait forever then: no worker, no
# step).  The bits are zshard train's; no process of the launch is left.
source "$(dirname "$0")/elastic_lib.sh"
STEPS=30
SEED=${ZS_TEST_SEED:-$(( ($(date +%s%N) / 1000) % 1000000 ))}
echo "elastic_chaos: seed $SEED (ZS_TEST_SEED=$SEED repeats it)"
RANDOM=$SEED

elastic_config "$WORK/job.json" "$SMALL"
train_reference "$WORK/job.json" $STEPS

# The schedule.  live[w] is 1 while worker w runs (as the launcher will see it: a worker told
# to leave is not "any" any more); W workers at the start.
W=$((1 + RANDOM % 2))
declare -a live
for ((w = 1; w <= W; w++)); do live[w]=1; done
n_workers=$W
lines=0
step=1
{
  echo "# seed $SEED"
  while [ $lines -lt 6 ]; do
    step=$((step + 1 + RANDOM % 6))
    [ $step -le 28 ] || break
    when="step $step"
    # The first line waits for a step: one that waits for a time may come after a fast job has
    # ended (seed 780104's "after 250" did), and then nothing of the chaos happens.
    [ $lines -gt 0 ] && [ $((RANDOM % 3)) -eq 0 ] && when="after $((RANDOM % 400))"
    alive_list=()
    for ((w = 1; w <= n_workers; w++)); do [ "${live[w]}" = 1 ] && alive_list+=("$w"); done
    r=$((RANDOM % 8))
    if [ ${#alive_list[@]} -eq 0 ] || [ $r -ge 5 ]; then
      n=$((1 + RANDOM % 2))
      echo "$when start $n"
      for ((k = 0; k < n; k++)); do n_workers=$((n_workers + 1)); live[n_workers]=1; done
    else
      sig=kill
      [ $((RANDOM % 3)) -eq 0 ] && sig=term
      case $r in
      0 | 1) target=any ;;
      2) target=all ;;
      *) target=${alive_list[RANDOM % ${#alive_list[@]}]} ;;
      esac
      echo "$when $sig $target"
      case $target in
      any) live[${alive_list[0]}]=0 ;;
      all) for w in "${alive_list[@]}"; do live[w]=0; done ;;
      *) live[target]=0 ;;
      esac
    fi
    lines=$((lines + 1))
    # No worker left: only time can move the script on.
    any_left=0
    for ((w = 1; w <= n_workers; w++)); do [ "${live[w]}" = 1 ] && any_left=1; done
    if [ $any_left -eq 0 ]; then
      echo "after $((100 + RANDOM % 400)) start"
      n_workers=$((n_workers + 1))
      live[n_workers]=1
      lines=$((lines + 1))
    fi
  done
  # At least one start after the last kill.
  echo "after $((RANDOM % 300)) start"
} >"$WORK/script.txt"
echo "elastic_chaos: $W workers at the start; script:"
sed 's/^/  /' "$WORK/script.txt"

launch_elastic run "$WORK/job.json" $STEPS 2 $W --elastic-script "$WORK/script.txt"
check_same run $STEPS
check_none_left run
checks=$((checks + 1))
fired=$(grep -cE '^zshard launch: (step [0-9]+|after [0-9]+ ms): ' "$WORK/run.err" || true)
[ "$fired" -ge 1 ] || fail "run: no line of the script fired: $(cat "$WORK/run.err")"
echo "elastic_chaos: $fired actions fired"
[ $failures -eq 0 ] || echo "elastic_chaos: to repeat: ZS_TEST_SEED=$SEED" >&2
finish
