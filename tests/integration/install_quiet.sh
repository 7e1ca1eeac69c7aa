# deploy/build.sh prints exactly one line on stdout, the build directory, even when
# deploy/install-deps.sh has to install packages: callers capture that stdout
# (`build=$(deploy/build.sh)`), and apt-get's progress lines on it once turned the build
# directory into "build/zshard: File name too long".  The deploy scripts run in a copy of
# deploy/ under WORK, with stubs first in PATH for cmake, dpkg-query (one package missing),
# apt-get (chatter on stdout and stderr), sudo and id, so neither the real build/ nor the real
# apt is touched.  The zshard binary argument is not used.
source "$(dirname "$0")/lib.sh"

deploy=$(cd "$(dirname "$0")/../../deploy" >/dev/null && pwd)
# The stubs report this one package as not installed; cmake is in every version of the list.
missing_pkg=cmake
root=$WORK/root
stubs=$WORK/stubs
log=$WORK/calls.log
mkdir -p "$root" "$stubs"
cp -R "$deploy" "$root/deploy"

# Each stub appends "name args..." to the log, so the test sees who ran and with what.
cat >"$stubs/dpkg-query" <<EOF
#!/usr/bin/env bash
echo "dpkg-query \$*" >>"$log"
pkg=\${!#}
if [ "\$pkg" = "$missing_pkg" ]; then
  echo "dpkg-query: no packages found matching \$pkg" >&2
  exit 1
fi
printf 'install ok installed'
EOF
cat >"$stubs/apt-get" <<EOF
#!/usr/bin/env bash
echo "apt-get DEBIAN_FRONTEND=\${DEBIAN_FRONTEND:-} \$*" >>"$log"
echo "apt-get-stdout-chatter: Reading package lists... (\$1)"
echo "apt-get-stderr-chatter: W: stub warning (\$1)" >&2
if [ "\$1" = update ] && [ -n "\${STUB_APT_UPDATE_FAILS:-}" ]; then
  exit 100
fi
EOF
cat >"$stubs/sudo" <<EOF
#!/usr/bin/env bash
echo "sudo \$*" >>"$log"
exec "\$@"
EOF
# id -u says what STUB_UID says, so that both the root and the sudo path are exercised.
cat >"$stubs/id" <<EOF
#!/usr/bin/env bash
echo "\${STUB_UID:-1000}"
EOF
cat >"$stubs/cmake" <<EOF
#!/usr/bin/env bash
echo "cmake \$*" >>"$log"
echo "cmake-stdout-chatter: -- Configuring done"
echo "cmake-stderr-chatter: CMake Warning" >&2
EOF
chmod +x "$stubs"/*
PATH=$stubs:$PATH
export PATH

# expect MESSAGE CMD...: one check; fails with MESSAGE unless CMD succeeds.
expect() {
  local message=$1
  shift
  checks=$((checks + 1))
  "$@" || fail "$message"
}
# lacks PATTERN FILE: FILE has no line matching PATTERN.
lacks() {
  ! grep -q -- "$1" "$2"
}
# one_line_is TEXT FILE: FILE holds exactly the line TEXT.
one_line_is() {
  [ "$(cat "$2")" = "$1" ] && [ "$(wc -l <"$2")" -eq 1 ]
}

# run_build NAME EXPECTED_DIR [FLAG]: runs the copied build.sh; checks that it succeeds, that
# its stdout is exactly EXPECTED_DIR, that apt-get installed the missing package without
# questions, and that the installer's and cmake's chatter reached stderr instead.
run_build() {
  local name=$1 expected=$2
  shift 2
  local cmd="build.sh${*:+ $*}"
  : >"$log"
  local rc=0
  "$root/deploy/build.sh" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
  expect "$name: $cmd exited $rc: $(tail -n 5 "$WORK/$name.err")" [ $rc -eq 0 ]
  local printed
  printed=$(cat "$WORK/$name.out")
  expect "$name: $cmd printed on stdout '$printed', expected exactly the line '$expected'" \
    one_line_is "$expected" "$WORK/$name.out"
  expect "$name: apt-get was not asked to install $missing_pkg; calls: $(cat "$log")" \
    grep -qE "^apt-get .*install .*\\b$missing_pkg\\b" "$log"
  expect "$name: apt-get install ran without DEBIAN_FRONTEND=noninteractive: $(cat "$log")" \
    grep -q '^apt-get DEBIAN_FRONTEND=noninteractive install' "$log"
  expect "$name: cmake was not configured into $expected: $(cat "$log")" \
    grep -qF -- "cmake -S $root -B $expected " "$log"
  local chatter
  for chatter in apt-get-stdout-chatter apt-get-stderr-chatter cmake-stdout-chatter; do
    expect "$name: '$chatter' did not reach $cmd's stderr" grep -q "$chatter" "$WORK/$name.err"
  done
}

# Not root: sudo runs apt-get.
STUB_UID=1000 run_build release "$root/build"
expect "release: not root, but apt-get ran without sudo: $(cat "$log")" \
  grep -q '^sudo .*apt-get' "$log"
STUB_UID=1000 run_build asan "$root/build-asan" --asan
STUB_UID=1000 run_build fuzz "$root/build-fuzz" --fuzz
# Root: no sudo, which containers often lack.
STUB_UID=0 run_build root "$root/build"
expect "root: sudo was used although id -u is 0: $(cat "$log")" lacks '^sudo' "$log"

# install-deps.sh on its own prints nothing on stdout either, so a caller that forgets to
# redirect it cannot capture apt-get's output.
: >"$log"
rc=0
STUB_UID=1000 "$root/deploy/install-deps.sh" >"$WORK/deps.out" 2>"$WORK/deps.err" || rc=$?
expect "install-deps.sh exited $rc: $(tail -n 5 "$WORK/deps.err")" [ $rc -eq 0 ]
expect "install-deps.sh printed on stdout: $(head -n 3 "$WORK/deps.out")" \
  [ ! -s "$WORK/deps.out" ]

# A failing apt-get update stops the build with a message that says so, and stdout stays
# empty, so that a caller never mistakes the failure for a build directory.
: >"$log"
rc=0
STUB_UID=1000 STUB_APT_UPDATE_FAILS=1 "$root/deploy/build.sh" >"$WORK/upd.out" \
  2>"$WORK/upd.err" || rc=$?
expect "build.sh succeeded although apt-get update failed" [ $rc -ne 0 ]
expect "apt-get update failure: stderr lacks 'apt-get update failed': $(cat "$WORK/upd.err")" \
  grep -q 'apt-get update failed' "$WORK/upd.err"
expect "apt-get update failure: build.sh printed on stdout: $(head -n 3 "$WORK/upd.out")" \
  [ ! -s "$WORK/upd.out" ]
expect "apt-get update failure: build.sh went on to run cmake: $(cat "$log")" \
  lacks '^cmake' "$log"

finish
