# `zshard launch --elastic-script` refuses bad scripts (file:line and the reason, exit 2, before
# anything starts), and a config with "elasticity": {"enabled": true} alone makes a worker's
# death an event: one killed by hand, the job goes on to the same bits.
source "$(dirname "$0")/elastic_lib.sh"


# refused NEEDLE SCRIPT_TEXT [WORKERS]: the script is refused (exit 2) with NEEDLE, and nothing
# was started (no output directory).
refused() {
  local needle=$1 text=$2 workers=${3:-1} rc=0
  checks=$((checks + 1))
  printf '%s\n' "$text" >"$WORK/bad.txt"
  rm -rf "$WORK/bad"
  "$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 5 --servers 1 \
    --workers "$workers" --out "$WORK/bad" --elastic-script "$WORK/bad.txt" \
    >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  [ $rc -eq 2 ] || fail "script '$text': exit $rc, expected 2: $(cat "$WORK/err.txt")"
  grep -qF -- "$needle" "$WORK/err.txt" ||
    fail "script '$text': stderr lacks '$needle': $(cat "$WORK/err.txt")"
  [ ! -e "$WORK/bad" ] || fail "script '$text': $WORK/bad was created"
}
B=$WORK/bad.txt
refused "$B:2: \"kil\": the action is start, kill, term, stop or cont" $'step 1 start\nstep 2 kil 1'
refused "$B:1: step \"6\": not a step of this job (1 to 5, from --steps)" 'step 6 start'
refused "$B:1: step \"0\"" 'step 0 start'
refused "$B:3: after \"-5\": not a number of milliseconds" $'# c\n\nafter -5 start'
refused "$B:1: \"at\": a line is \"step K ACTION [TARGET]\" or \"after MS ACTION [TARGET]\"" \
  'at 3 start'
refused "$B:1: no action after \"step ...\"" 'step 2'
refused "$B:1: unexpected \"now\" after the target" 'step 2 kill 1 now'
refused "$B:1: kill \"first\": the target is a worker number, any or all" 'step 2 kill first'
refused "$B:1: start \"0\": not a number of workers" 'step 2 start 0'
refused "$B:2: term 3: there is no worker 3 when this line fires (2 by then: 1 from --workers, 1 started by the lines above)" \
  $'step 2 start\nstep 3 term 3'
refused "$B:1: stop 1: there is no worker 1 when this line fires (0 by then" 'step 1 stop 1' 0
checks=$((checks + 1))
rc=0
"$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 5 --servers 1 \
  --workers 1 --out "$WORK/bad" --elastic-script "$WORK/none.txt" 2>"$WORK/err.txt" || rc=$?
[ $rc -eq 2 ] && grep -qF -- "--elastic-script $WORK/none.txt: No such file" "$WORK/err.txt" ||
  fail "a missing script: exit $rc: $(cat "$WORK/err.txt")"
expect_ok "$ZSHARD" launch --help
for want in '--elastic-script FILE' 'step K ACTION [TARGET]' 'after MS ACTION [TARGET]' \
  'kill (SIGKILL)'; do
  grep -qF -- "$want" "$WORK/out.txt" || fail "launch --help lacks '$want'"
done

# Elastic by the config alone: worker 1 killed by hand at step 3, worker 2 finishes the job.
elastic_config "$WORK/elastic.json" "$MEDIUM"
train_reference "$WORK/elastic.json" 8
"$ZSHARD" launch --config "$WORK/elastic.json" --data "$DATA/tiny.txt" --steps 8 --servers 1 \
  --workers 2 --threads 1 --out "$WORK/byhand" 2>"$WORK/byhand.err" &
LPID=$!
end=$((SECONDS + 60))
until grep -q '^step  *2/8' "$WORK/byhand.err" 2>/dev/null || [ $SECONDS -ge $end ]; do
  sleep 0.02
done
W1=$(sed -n 's/.* worker 1 (pid \([0-9]*\)).*/\1/p' "$WORK/byhand.err" | head -n 1)
[ -n "$W1" ] && kill -KILL "$W1" || fail "byhand: no pid for worker 1: $(cat "$WORK/byhand.err")"
end=$((SECONDS + 60))
while alive "$LPID" && [ $SECONDS -lt $end ]; do sleep 0.1; done
alive "$LPID" && { fail "byhand: still running 60 s later"; kill -INT "$LPID"; }
RC=0
wait "$LPID" || RC=$?
{ grep -o '(pid [0-9]*)' "$WORK/byhand.err" || true; } | tr -dc '0-9\n' >"$WORK/byhand.pids"
check_same byhand 8
expect_line byhand "^zshard launch: worker 1 \\(pid $W1\\) was killed by signal 9 .*; the job goes on: the coordinator gives its chunks to the others" \
  "the death of worker 1 is not an event"
check_none_left byhand
finish
