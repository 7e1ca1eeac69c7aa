# The CLI's conventions and its errors: each names the problem and exits non-zero.
source "$(dirname "$0")/lib.sh"

expect_ok "$ZSHARD" --version
grep -qE '^zshard [0-9]+\.[0-9]+\.[0-9]+$' "$WORK/out.txt" || fail "--version printed '$(cat "$WORK/out.txt")'"
expect_ok "$ZSHARD" --help
grep -q 'train' "$WORK/out.txt" || fail "--help does not list train"
expect_ok "$ZSHARD" train --help
grep -q -- '--config' "$WORK/out.txt" || fail "train --help lacks --config"
expect_ok "$ZSHARD" eval --help
grep -q -- '--seq-len' "$WORK/out.txt" || fail "eval --help lacks --seq-len"

expect_fail 'unknown command "trian"' "$ZSHARD" trian
expect_fail 'unknown option "--stepz"' "$ZSHARD" train --stepz 3
expect_fail '--steps needs a value' "$ZSHARD" train --config x --steps
expect_fail 'missing --data' "$ZSHARD" train --config "$DATA/tiny.json" --steps 1 --out "$WORK/o"
expect_fail '--steps: "ten" is not an integer' "$ZSHARD" train --steps ten
expect_fail '--threads: "0" is not an integer in [1, 1024]' "$ZSHARD" train --threads 0
expect_fail 'unexpected argument "extra"' "$ZSHARD" eval --model m --data d extra

# Config problems name the key.
printf '{"model": {"n_layer": 2}, "lr": 0.1}' > "$WORK/unknown.json"
expect_fail 'unknown key "lr"' "$ZSHARD" train --config "$WORK/unknown.json" --data "$DATA/tiny.txt" --steps 1 --out "$WORK/o"
printf '{"model": {"n_layer": "two"}}' > "$WORK/type.json"
expect_fail '"model.n_layer": expected an integer, got a string' "$ZSHARD" train --config "$WORK/type.json" --data "$DATA/tiny.txt" --steps 1 --out "$WORK/o"
printf '{"model": {' > "$WORK/broken.json"
expect_fail 'invalid JSON' "$ZSHARD" train --config "$WORK/broken.json" --data "$DATA/tiny.txt" --steps 1 --out "$WORK/o"
expect_fail "$WORK/none.json" "$ZSHARD" train --config "$WORK/none.json" --data "$DATA/tiny.txt" --steps 1 --out "$WORK/o"
expect_fail "$WORK/none.txt" "$ZSHARD" train --config "$DATA/tiny.json" --data "$WORK/none.txt" --steps 1 --out "$WORK/o"
# Data whose token ids do not fit the vocabulary.
printf '{"model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "vocab_size": 100, "block_size": 8}}' > "$WORK/v100.json"
expect_fail 'outside the model'"'"'s vocab_size 100' "$ZSHARD" train --config "$WORK/v100.json" --data "$DATA/tiny.txt" --steps 1 --out "$WORK/o"
expect_fail 'missing --listen' "$ZSHARD" server --coord tcp://127.0.0.1:1
expect_fail 'missing --servers' "$ZSHARD" coord --listen tcp://127.0.0.1:0 --config "$DATA/tiny.json"
expect_fail '--servers: "0" is not an integer' "$ZSHARD" coord --servers 0
expect_fail "$WORK/none.json" "$ZSHARD" coord --listen tcp://127.0.0.1:0 --config "$WORK/none.json" --servers 1 --data "$DATA/tiny.txt" --steps 1 --out "$WORK/c"
expect_fail "$WORK/nomodel/config.json" "$ZSHARD" eval --model "$WORK/nomodel" --data "$DATA/tiny.txt"
# --metrics addresses are checked before anything starts, and named.
expect_fail 'metrics address "bogus": expected HOST:PORT' "$ZSHARD" server --coord tcp://127.0.0.1:1 --listen 127.0.0.1:0 --metrics bogus
expect_fail 'metrics address "127.0.0.1:70000": "70000" is not a port' "$ZSHARD" coord --listen tcp://127.0.0.1:0 --config "$DATA/tiny.json" --servers 1 --data "$DATA/tiny.txt" --steps 1 --out "$WORK/c" --metrics 127.0.0.1:70000
expect_fail '--metrics: port 65535 + 3 servers and workers goes beyond 65535' "$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 1 --servers 2 --workers 1 --out "$WORK/l" --metrics 127.0.0.1:65535
expect_fail 'metrics address "bogus": expected HOST:PORT' "$ZSHARD" worker --coord tcp://127.0.0.1:1 --insecure --metrics bogus
expect_fail '--metrics: "nohost" is not HOST:PORT' "$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 1 --servers 1 --workers 1 --out "$WORK/l" --metrics nohost
finish
