#!/usr/bin/env bash
# Installs fauxqs (an SQS emulator speaking the JSON protocol of the AWS SDKs:
# standard and FIFO queues, deduplication, visibility, redrive) and the
# Node.js 22 it needs, from the npm registry at the versions pinned by
# scripts/fauxqs/package-lock.json, into ONCEKIT_FAUXQS_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/oncekit/fauxqs). The SQS tests of
# examples/sqs run it. Idempotent: an install of the same files is left as
# it is (well under a second).
#
# Prints the install directory; start the emulator on 127.0.0.1 with
#   "$dir/node_modules/.bin/node" "$dir/serve.mjs"
set -euo pipefail

SRC=$(cd "$(dirname "$0")/fauxqs" && pwd)
DIR=${ONCEKIT_FAUXQS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/oncekit/fauxqs}
STAMP=$(cat "$SRC/package.json" "$SRC/package-lock.json" "$SRC/serve.mjs" | sha256sum | cut -d' ' -f1)

installed() {
  [[ -x $DIR/node_modules/.bin/node && -f $DIR/node_modules/fauxqs/package.json &&
    $(cat "$DIR/STAMP" 2>/dev/null) == "$STAMP" ]]
}
if installed; then
  echo "$DIR"
  exit 0
fi
# Test processes of several packages may call this at once: one installs,
# the others wait for it.
mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock"
flock 9
if installed; then
  echo "$DIR"
  exit 0
fi
command -v npm >/dev/null || { echo "install-fauxqs: npm is needed (apt-get install npm)" >&2; exit 1; }

rm -rf "$DIR.new"
mkdir -p "$DIR.new"
cp "$SRC/package.json" "$SRC/package-lock.json" "$SRC/serve.mjs" "$DIR.new/"
# npm ci installs exactly the lock file's versions, checked against its
# integrity hashes. fauxqs declares node >= 22.5 while npm itself may run
# on an older Node: the warning about it is expected.
(cd "$DIR.new" && npm ci --silent --no-audit --no-fund --loglevel=error >&2)
"$DIR.new/node_modules/.bin/node" --version >/dev/null
echo "$STAMP" > "$DIR.new/STAMP"
rm -rf "$DIR"
mv "$DIR.new" "$DIR"
echo "$DIR"
