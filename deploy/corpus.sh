#!/usr/bin/env bash
# Writes the default training corpus to $1: real English text that every Debian machine
# already has, the copyright files of the installed packages (Debian policy requires one per
# package), in name order, deduplicated by content, capped at ${ZS_CORPUS_BYTES:-4000000}
# bytes.  Nothing is downloaded.
set -euo pipefail
out=$1
cap=${ZS_CORPUS_BYTES:-4000000}
tmp=$out.tmp
: > "$tmp"
declare -A seen
for f in $(ls /usr/share/doc/*/copyright 2>/dev/null | LC_ALL=C sort); do
  [ -r "$f" ] || continue
  sum=$(md5sum < "$f" | cut -c1-32)
  [ -n "${seen[$sum]:-}" ] && continue
  seen[$sum]=1
  cat "$f" >> "$tmp"
  [ "$(stat -c %s "$tmp")" -ge "$cap" ] && break
done
head -c "$cap" "$tmp" > "$out"
rm -f "$tmp"
size=$(stat -c %s "$out")
if [ "$size" -lt 1000000 ]; then
  echo "zshard: only $size bytes of text found under /usr/share/doc; need 1 MB" >&2
  exit 1
fi
