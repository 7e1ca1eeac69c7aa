# The NVMe tier (docs/nvme.md): partition servers whose AdamW moments do not fit
# cluster.server_memory_bytes keep them in a state file under
# zero_optimization.offload_optimizer.nvme_path, and give zshard train's bits.
#  - 1 server (budget: the moments of 1 of its 9 shards in RAM) and 2 servers (1 of 4 or 5):
#    model and metrics bitwise train's; each server says how many shards went to NVMe.
#  - bf16 workers: the fp32 master weights go to NVMe with the moments, and a budget of 0.39 of
#    the state (18 bytes a float) trains with train's bits.
#  - offload_param: the copy workers fetch goes to NVMe too and is served through a window of 2
#    shards: bf16 jobs on 1 and 2 servers, an fp32 job, each with train's bits.
#  - checkpoints on the tier's file system get the tier's output of their step written
#    straight into their shard files (each server says so); one written that way resumes with
#    the moments in RAM, and one written in RAM resumes on NVMe: train's bits.  With the
#    checkpoint directory on another file system (a tmpfs, as root) they are written the usual
#    way, said once, and resume.
#  - a budget too small even for the weights and gradients, an nvme_path that is a file, and
#    (as root, on a tmpfs of 64 KiB in a private mount namespace) a disk too small: the server
#    says so, naming the numbers or the path.
#  - an injected read error (ZS_NVME_INJECT_EIO) fails the server's first apply, naming the
#    file and offset, and the coordinator logs it as the server's reason.
#  - bytes flipped in a running server's state files (through /proc/PID/fd): its next apply
#    or fetch read fails naming the block, nothing is applied or served from it, the
#    coordinator goes back to the newest checkpoint on the spare server zshard launch keeps,
#    and the job ends with train's bits; with and without offload_param.
if [ -z "${ZS_NVME_NS:-}" ] && [ "$(id -u)" = 0 ] &&
  unshare --mount --propagation private true 2>/dev/null; then
  ZS_NVME_NS=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
source "$(dirname "$0")/lib.sh"
trap kill_started EXIT
STEPS=12
LONG=300
mkdir -p "$WORK/nvme"

# config NAME BUDGET [TIER]: job config NAME.json: tiny.json with a checkpoint every 3 steps, and
# with TIER=nvme (the default) the moments on NVMe under a budget of BUDGET bytes.
config() {
  local tier=${3:-nvme} extra=
  if [ "$tier" = nvme ]; then
    extra=", \"server_memory_bytes\": $2}, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"${NVME_PATH:-$WORK/nvme}\", \"pin_memory\": true}}, \"aio\": {\"block_size\": 8192, \"queue_depth\": 4"
  fi
  sed "s|\"cluster\": {\"shard_size\": 16384}|\"cluster\": {\"shard_size\": 16384$extra}, \"checkpoint\": {\"interval_steps\": ${INTERVAL:-3}, \"keep\": 100}|" \
    "$DATA/tiny.json" >"$WORK/$1.json"
  grep -q interval_steps "$WORK/$1.json" || fail "the config edit for $1 did not take"
}

# run_launch NAME CONFIG SERVERS WORKERS [ARGS...]: zshard launch, out in $WORK/NAME.
run_launch() {
  local name=$1 cfg=$2 servers=$3 workers=$4
  shift 4
  launch_fg "$name" --config "$WORK/$cfg.json" --data "$DATA/tiny.txt" --steps "${NSTEPS:-$STEPS}" \
    --servers "$servers" --workers "$workers" --threads 1 --out "$WORK/$name" "$@"
}

# check_same NAME TRAIN: exit 0, and model and metrics equal to the train run TRAIN's.
check_same() {
  checks=$((checks + 1))
  [ "$RC" -eq 0 ] || fail "$1: exit $RC: $(tail -n 5 "$WORK/$1.err")"
  same_bits "$1" "$WORK/$1" "$WORK/$2"
}

config ram 0 ram
expect_ok "$ZSHARD" train --config "$WORK/ram.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"
expect_ok "$ZSHARD" train --config "$WORK/ram.json" --data "$DATA/tiny.txt" --steps $LONG \
  --threads 1 --out "$WORK/train_long"

# ---- the same bits, 1 and 2 servers --------------------------------------------------------
# tiny.json: 35200 floats in 9 shards of 4096.  One server needs 10 bytes a float in RAM
# (352000) and 3 slots of two 16384-byte arrays (98304): 500000 leaves room for the moments
# of 1 shard (32768).  Two servers (4 and 5 shards): 330000 leaves room for 1 or 2.
config nvme1 500000
run_launch s1 nvme1 1 1
check_same s1 train
expect_log s1 "$WORK/s1/logs/server-1.log" 'AdamW moments of 8 of 9 shards on NVMe in .*, 1 in RAM'
# Its checkpoints are on the tier's file system: the steps they hold were written by the tier
# straight into their shard files, which the checkpoint completed (and which the resumes below
# read, checked against the manifests).
expect_log s1 "$WORK/s1/logs/server-1.log" \
  'the NVMe tier writes the state of its shards straight into their checkpoint files \(8 of 9 here\): it is not written twice'
config nvme2 330000
run_launch s2 nvme2 2 2
check_same s2 train
for f in "$WORK"/s2/logs/server-*.log; do
  expect_log s2 "$f" 'AdamW moments of [2-4] of [45] shards on NVMe'
done

# ---- bf16 workers: the fp32 master weights go to NVMe too -----------------------------------
# With bf16.enabled the workers fetch the bf16 copy, so a server keeps only the accumulator and
# that copy in RAM (6 bytes a float).  Shards of 4096 bytes (35 of them); the budget, 250000
# bytes, is 0.39 of the state's 18 bytes a float (633600): every shard's moments and weights on
# NVMe, and zshard train's bits.
sed 's|"cluster": {"shard_size": 16384}|"bf16": {"enabled": true}, "cluster": {"shard_size": 4096, "server_memory_bytes": 250000}, "zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "'"$WORK"'/nvme"}}, "aio": {"block_size": 4096, "queue_depth": 4}, "checkpoint": {"interval_steps": 3, "keep": 100}|' \
  "$DATA/tiny.json" >"$WORK/bf16.json"
sed 's|"cluster": {"shard_size": 16384}|"bf16": {"enabled": true}, "cluster": {"shard_size": 4096}|' \
  "$DATA/tiny.json" >"$WORK/bf16_ram.json"
expect_ok "$ZSHARD" train --config "$WORK/bf16_ram.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train_bf16"
run_launch bf16 bf16 1 2
check_same bf16 train_bf16
expect_log bf16 "$WORK/bf16/logs/server-1.log" \
  'AdamW moments and fp32 master weights of 35 of 35 shards on NVMe in .*, 0 in RAM; RAM budget 244.1 KiB'
expect_log bf16 "$WORK/bf16/logs/server-1.log" 'straight into their checkpoint files \(35 of 35 here\)'
# Its step 6, restored into the tier (weights and moments) by a resume.
mkdir -p "$WORK/bf16_resumed"
cp "$WORK/bf16/metrics.jsonl" "$WORK/bf16_resumed/"
run_launch bf16_resumed bf16 1 1 --resume "$WORK/bf16/checkpoints/step-00000006"
check_same bf16_resumed train_bf16

# ---- the copy workers fetch on NVMe too (offload_param) ------------------------------------
# Then a server keeps only the gradients of its NVMe shards in RAM (4 bytes a float), and
# serves fetches through a window of offload_param.buffer_count shards read from the disk.
# A bf16 job (the bf16 copy in a file of its own) on 1 and 2 servers with 2 workers, and an
# fp32 job (the weights are the copy); a window of 2 shards, so that fetches wait for slots.
sed 's|"offload_optimizer": {"device": "nvme", "nvme_path": "'"$WORK"'/nvme"}}|"offload_optimizer": {"device": "nvme", "nvme_path": "'"$WORK"'/nvme"}, "offload_param": {"device": "nvme", "buffer_count": 2}}|; s|"server_memory_bytes": 250000|"server_memory_bytes": 220000|' \
  "$WORK/bf16.json" >"$WORK/bf16_param.json"
grep -q offload_param "$WORK/bf16_param.json" || fail "the config edit for bf16_param did not take"
run_launch bf16_param1 bf16_param 1 2
check_same bf16_param1 train_bf16
expect_log bf16_param1 "$WORK/bf16_param1/logs/server-1.log" \
  'AdamW moments, fp32 master weights and the copy workers fetch of 3[0-9] of 35 shards on NVMe'
run_launch bf16_param2 bf16_param 2 2
check_same bf16_param2 train_bf16
sed 's|"pin_memory": true}}|"pin_memory": true}, "offload_param": {"device": "nvme", "buffer_count": 2}}|; s|"server_memory_bytes": 500000|"server_memory_bytes": 400000|' \
  "$WORK/nvme1.json" >"$WORK/fp32_param.json"
grep -q offload_param "$WORK/fp32_param.json" || fail "the config edit for fp32_param did not take"
run_launch fp32_param fp32_param 1 2
check_same fp32_param train
expect_log fp32_param "$WORK/fp32_param/logs/server-1.log" \
  'AdamW moments, fp32 master weights and the copy workers fetch of 8 of 9 shards on NVMe'

# ---- checkpoints cross tiers ----------------------------------------------------------------
# Written with the moments on NVMe (s2's step 6), resumed with them in RAM; written in RAM,
# resumed on NVMe.  A resume into a new --out starts from a copy of the metrics.
mkdir -p "$WORK/to_ram" "$WORK/to_nvme"
cp "$WORK/s2/metrics.jsonl" "$WORK/to_ram/"
run_launch to_ram ram 1 1 --resume "$WORK/s2/checkpoints/step-00000006"
check_same to_ram train
run_launch ram_full ram 2 1
check_same ram_full train
cp "$WORK/ram_full/metrics.jsonl" "$WORK/to_nvme/"
run_launch to_nvme nvme1 1 1 --resume "$WORK/ram_full/checkpoints/step-00000006"
check_same to_nvme train

# ---- what does not fit, and where ----------------------------------------------------------
config small 300000
run_launch small small 1 1
checks=$((checks + 1))
[ "$RC" -ne 0 ] || fail "small: a budget below the weights and gradients was accepted"
expect_log small "$WORK/small/logs/server-1.log" \
  'server [0-9]+: 9 shards need [0-9.]+ KiB of RAM even with their moments on NVMe \(weights, gradients, the 16-bit copy and the NVMe slots\), but cluster.server_memory_bytes gives 293.0 KiB'
: >"$WORK/plainfile"
NVME_PATH=$WORK/plainfile config notdir 500000
run_launch notdir notdir 1 1
checks=$((checks + 1))
[ "$RC" -ne 0 ] || fail "notdir: an nvme_path that is a file was accepted"
expect_log notdir "$WORK/notdir/logs/server-1.log" \
  "zero_optimization.offload_optimizer.nvme_path $WORK/plainfile: not a directory"
if [ -n "${ZS_NVME_NS:-}" ] && mkdir -p "$WORK/tiny_fs" &&
  mount -t tmpfs -o size=65536 tmpfs "$WORK/tiny_fs"; then
  NVME_PATH=$WORK/tiny_fs config full 500000
  run_launch full full 1 1
  umount -l "$WORK/tiny_fs"
  checks=$((checks + 1))
  [ "$RC" -ne 0 ] || fail "full: a state file larger than its disk was accepted"
  expect_log full "$WORK/full/logs/server-1.log" \
    "nvme_path $WORK/tiny_fs: cannot allocate [0-9.]+ KiB for the state file: No space left on device"
else
  echo "nvme_tier: the full-disk case is skipped (needs root for a private tmpfs)"
fi
# Checkpoints on another file system than the tier's (a tmpfs): the state is read back from
# NVMe and written the usual way, said once; the same bits, and a checkpoint that resumes.
if [ -n "${ZS_NVME_NS:-}" ] && mkdir -p "$WORK/other_fs" &&
  mount -t tmpfs -o size=64m tmpfs "$WORK/other_fs"; then
  sed 's|"keep": 100}|"keep": 100, "dir": "'"$WORK"'/other_fs/ck"}|' "$WORK/nvme1.json" >"$WORK/other.json"
  grep -q other_fs "$WORK/other.json" || fail "the config edit for other did not take"
  run_launch other other 1 1
  check_same other train
  expect_log other "$WORK/other/logs/server-1.log" \
    "checkpoint.dir $WORK/other_fs/ck is not on the file system of nvme_path $WORK/nvme: a checkpoint reads the state back from NVMe and writes it again"
  mkdir -p "$WORK/other_resumed"
  cp "$WORK/other/metrics.jsonl" "$WORK/other_resumed/"
  run_launch other_resumed ram 1 1 --resume "$WORK/other_fs/ck/step-00000009"
  check_same other_resumed train
  umount -l "$WORK/other_fs"
else
  echo "nvme_tier: the checkpoint on another file system is skipped (needs root for a tmpfs)"
fi

# ---- an I/O error -------------------------------------------------------------------------
# The state file holds shards 1..8 (shard 0's moments stay in RAM), each as two arrays of 16384
# bytes read in requests of 8192: byte 20000 is in the first request of shard 1's exp_avg_sq.
start_coord "$WORK/eio_coord.log" "$WORK/nvme1.json" $STEPS "$WORK/eio"
ZS_NVME_INJECT_EIO=20000 "$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 \
  2>"$WORK/eio_server.log" &
SERVER=$!
PIDS+=($SERVER)
"$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/eio_worker.log" &
PIDS+=($!)
checks=$((checks + 1))
wait_until 30 gone $SERVER || fail "eio: the server did not stop at its failed read"
reap $SERVER
checks=$((checks + 1))
[ "$RC" = 1 ] || fail "eio: the server exited $RC, expected 1"
expect_log eio "$WORK/eio_server.log" \
  'read of 8192 bytes at offset 16384 \(shard 1 exp_avg_sq\): Input/output error'
checks=$((checks + 1))
wait_until 15 has_line "$WORK/eio_coord.log" 'server [0-9]+ left: .*offset 16384 .*Input/output error' ||
  fail "eio: the coordinator did not log the server's reason: $(tail -n 3 "$WORK/eio_coord.log")"
kill_started
PIDS=()

# ---- bytes flipped on disk mid-run ----------------------------------------------------------
# flip_run NAME CONFIG TRAIN: zshard launch of CONFIG for LONG steps (1 server, 2 workers); once
# 30 steps are done, one byte in every 32 KiB (at 7232 past each multiple) of each of server 1's
# state files is flipped through /proc/PID/fd, until the server stops.  A block whose write-back was in flight then is written whole again; the others
# fail their checksum at their next read.  The server stops naming the block, the spare that
# zshard launch starts takes over from the newest checkpoint, and the job ends with TRAIN's
# bits.
flip_run() {
  local name=$1 cfg=$2 train=$3 launcher sp f files flipped=0
  NSTEPS=$LONG run_launch "$name" "$cfg" 1 2 >/dev/null &
  launcher=$!
  PIDS+=($launcher)
  steps_past() { [ "$({ wc -l <"$WORK/$name/metrics.jsonl"; } 2>/dev/null || echo 0)" -ge "$1" ]; }
  checks=$((checks + 1))
  wait_until 60 steps_past 30 || fail "$name: the job did not reach step 30"
  sp=$(pid_of "$WORK/$name.err" "server 1")
  # A pass flips the bytes of every state file the server holds (descriptor order).  A step
  # whose output went straight into a checkpoint's files leaves the state file stale until the
  # next apply writes it again without reading it, so bytes flipped then are never read: the
  # passes go on, 0.5 s apart, until the server stops (or 10 passes).
  for pass in 1 2 3 4 5 6 7 8 9 10; do
    files=$(for f in /proc/"$sp"/fd/*; do
      case "$(readlink "$f" 2>/dev/null)" in "$WORK/nvme/"*"(deleted)") echo "${f##*/}" ;; esac
    done | sort -n)
    for f in $files; do
      f=/proc/$sp/fd/$f
      case "$(readlink "$f" 2>/dev/null)" in
      "$WORK/nvme/"*"(deleted)")
        python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
for at in range(7232, os.fstat(fd).st_size, 32768):
    b = bytearray(os.pread(fd, 1, at)); b[0] ^= 1
    os.pwrite(fd, bytes(b), at)
try:
    os.fsync(fd)
except OSError:
    pass  # EIO: the kernel saw the server write the same page directly; the byte was flipped
' "$f" 2>>"$WORK/flip_py.err" && flipped=$((flipped + 1))
        ;;
      esac
    done
    until_ms $(($(now_ms) + 500)) gone "$sp" && break
  done
  echo "nvme_tier: $name: flipped bytes $flipped times in state files of server 1 ($pass passes) by $({ wc -l <"$WORK/$name/metrics.jsonl"; } 2>/dev/null) steps"
  checks=$((checks + 1))
  [ $flipped -ge 1 ] || fail "$name: no state file among server 1's (pid $sp) descriptors: $(cat "$WORK/flip_py.err" 2>/dev/null)"
  wait $launcher
  RC=$?
  check_same "$name" "$train"
  expect_log "$name" "$WORK/$name/logs/coord.log" \
    'server [0-9]+ left: .*block of [0-9]+ bytes at offset [0-9]+ \(shard [0-9]+ [a-z_0-9 ]+, elements [0-9.]+\) fails its checksum'
  expect_log "$name" "$WORK/$name/logs/coord.log" 'every server goes back to checkpoint'
}

INTERVAL=20 config flip 500000
flip_run flip flip train_long
# The same with the copy workers fetch on NVMe too (a bf16 job): an apply finds the damage, or
# a fetch's read through the window (each apply writes the whole bf16 copy again, so which one
# comes first depends on when the bytes change; test_shardstore checks the read itself).
sed 's|"interval_steps": 3,|"interval_steps": 20,|' "$WORK/bf16_param.json" >"$WORK/flip_param.json"
expect_ok "$ZSHARD" train --config "$WORK/bf16_ram.json" --data "$DATA/tiny.txt" --steps $LONG \
  --threads 1 --out "$WORK/train_long_bf16"
flip_run flip_param flip_param train_long_bf16
finish
