#!/usr/bin/env bash
# Checks that every C and CUDA source (*.c *.h *.cu) is formatted as the project's
# .clang-format says: `clang-format --dry-run -Werror` on each, the offending names printed,
# exit status 1 if any differ.  In a git checkout the files are the tracked ones, so that
# generated and scratch files do not count; outside one (a release tarball), every such file
# under the tree except the build*/ directories.  tests/run.sh runs it; it is not a CTest
# test because formatting is a property of the sources, not of a build.
#   tests/format.sh        (CLANG_FORMAT=path picks the binary; default clang-format-14)
set -euo pipefail
# cd prints the directory it went to when CDPATH resolves it; that would leak into $root.
root=$(cd "$(dirname "$0")/.." >/dev/null && pwd)
cd "$root"

# The code base was formatted with clang-format 14; other major versions break some lines
# differently, so 14 is preferred where both are installed.
cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null; then
      cf=$c
      break
    fi
  done
fi
if [ -z "$cf" ] || ! command -v "$cf" >/dev/null; then
  echo "format.sh: clang-format not found${cf:+ ($cf)}; deploy/install-deps.sh installs it" >&2
  exit 1
fi
# Without the project's style file clang-format would quietly check against LLVM style.
if [ ! -f .clang-format ]; then
  echo "format.sh: $root/.clang-format is missing" >&2
  exit 1
fi
version=$("$cf" --version)
case "$version" in
  *" version 14."*) ;;
  *) echo "format.sh: note: $version; the code is formatted with clang-format 14" >&2 ;;
esac

files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  while IFS= read -r -d '' f; do
    # A tracked file deleted in the working tree (a rename in progress) has nothing to check.
    [ -f "$f" ] && files+=("$f")
  done < <(git ls-files -z -- '*.c' '*.h' '*.cu')
else
  while IFS= read -r -d '' f; do
    files+=("${f#./}")
  done < <(find . -type d \( -path './build*' -o -name .git \) -prune -o -type f \
             \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -print0 | LC_ALL=C sort -z)
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "format.sh: no *.c *.h *.cu files found under $root" >&2
  exit 1
fi

# One file at a time, so that each offender is named once instead of once per changed line.
# Any failure other than a formatting difference (an unreadable file, a style file this
# clang-format cannot parse) is reported as itself rather than as a badly formatted file.
bad=()
for f in "${files[@]}"; do
  if ! err=$("$cf" --dry-run -Werror "$f" 2>&1 >/dev/null); then
    case "$err" in
      *clang-format-violations*) bad+=("$f") ;;
      *)
        echo "format.sh: $cf failed on $f: $err" >&2
        exit 1 ;;
    esac
  fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "format.sh: ${#bad[@]} of ${#files[@]} files differ from .clang-format ($cf):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "format.sh: see the changes with '$cf --dry-run FILE', apply them with '$cf -i FILE'" >&2
  exit 1
fi
echo "format.sh: ${#files[@]} files match .clang-format ($cf)"
