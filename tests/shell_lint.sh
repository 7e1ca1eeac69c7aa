#!/usr/bin/env bash
# Checks the project's shell scripts for a pipeline that can fail although it found what it
# looked for: `CMD | grep -q` (or -m).  grep stops reading at its first match; CMD, if it is
# still writing, then dies of SIGPIPE, and under `set -o pipefail` (every script here has it)
# the pipeline's status is CMD's 141.  How often depends on timing: `cat LOGS | grep -q` made
# integration.launch_matches_train fail about one run in seven.  Write `grep -q PAT FILE...`
# or `grep -q PAT <<<"$(CMD)"` instead.  Prints each offending line as FILE:LINE: TEXT and
# exits 1 if there is any.  tests/run.sh runs it beside tests/format.sh (a property of the
# sources, not of a build).
#   tests/shell_lint.sh [FILE...]   (default: the tracked *.sh, or every *.sh outside git)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." >/dev/null && pwd)
cd "$root"

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    while IFS= read -r -d '' f; do
      [ -f "$f" ] && files+=("$f")
    done < <(git ls-files -z -- '*.sh')
  else
    while IFS= read -r -d '' f; do
      files+=("${f#./}")
    done < <(find . -type d \( -path './build*' -o -name .git \) -prune -o -type f -name '*.sh' \
               -print0 | LC_ALL=C sort -z)
  fi
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "shell_lint.sh: no *.sh files found under $root" >&2
  exit 1
fi

# A pipe into grep with -q or -m among its first options, outside a comment.
bad=$(grep -nE '^[^#]*\|[[:space:]]*grep([[:space:]]+-[[:alnum:]]+)*[[:space:]]+-[[:alnum:]]*[qm]' \
  "${files[@]}" /dev/null || true)
if [ -n "$bad" ]; then
  printf '%s\n' "$bad" >&2
  echo "shell_lint.sh: a pipe into grep -q or -m fails under pipefail when grep stops reading" \
    "early; use 'grep -q PAT FILE' or 'grep -q PAT <<<\"\$(CMD)\"' (see the header of $0)" >&2
  exit 1
fi
echo "shell_lint.sh: ${#files[@]} scripts have no pipe into grep -q or -m"
