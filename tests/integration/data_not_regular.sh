# --data must be a regular file or a directory of them (issue 10, part 5): a FIFO, a device, or
# a directory holding a FIFO is refused with its path by zshard train, zshard coord and zshard
# eval, at once.  Opening a FIFO for reading waits for a writer, so before the fix these
# commands blocked forever: each runs under `timeout`, and one that is killed (exit 124, no
# message) fails its check instead of hanging the test.
source "$(dirname "$0")/lib.sh"

mkfifo "$WORK/fifo"
mkdir "$WORK/dir"
cp "$DATA/tiny.txt" "$WORK/dir/a.txt"
mkfifo "$WORK/dir/b.fifo"
WHY="; --data must be a regular file or a directory of regular files"

for data in "$WORK/fifo" "$WORK/dir" /dev/zero; do
  case $data in
  "$WORK/fifo") want="data $data: is a FIFO$WHY" ;;
  "$WORK/dir") want="data $WORK/dir/b.fifo: is a FIFO$WHY" ;;
  *) want="data $data: is a character device$WHY" ;;
  esac
  expect_fail "zshard train: $want" timeout 30 "$ZSHARD" train --config "$DATA/tiny.json" \
    --data "$data" --steps 1 --out "$WORK/train"
  expect_fail "$want" timeout 30 "$ZSHARD" coord --listen 'tcp://127.0.0.1:*' \
    --config "$DATA/tiny.json" --servers 1 --data "$data" --steps 1 --out "$WORK/coord"
done

# zshard eval reads --data the same way.
expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 0 \
  --out "$WORK/model"
expect_fail "data $WORK/fifo: is a FIFO$WHY" timeout 30 "$ZSHARD" eval --model "$WORK/model" \
  --data "$WORK/fifo"

# Without the FIFO the directory is good data.
rm "$WORK/dir/b.fifo"
expect_ok timeout 60 "$ZSHARD" train --config "$DATA/tiny.json" --data "$WORK/dir" --steps 1 \
  --out "$WORK/train-dir"
finish
