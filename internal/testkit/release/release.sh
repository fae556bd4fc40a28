#!/usr/bin/env bash
# release.sh vX.Y.Z: tags every released module of the repository together
# at one commit (`make release VERSION=vX.Y.Z`):
#
#   vX.Y.Z               github.com/oncekit/oncekit
#   cmd/oncekit/vX.Y.Z   github.com/oncekit/oncekit/cmd/oncekit
#   oncekitotel/vX.Y.Z   github.com/oncekit/oncekit/oncekitotel
#
# as Go's tags for modules in subdirectories are named. Before it tags, it
# checks the API against the last listing (the changelog names every
# change), points every module's requirement of the library and go.work at
# vX.Y.Z, writes api/vX.Y.Z.txt, turns the changelog's Unreleased section
# into vX.Y.Z's, commits that, and installs the CLI and builds a module
# requiring oncekitotel from a module proxy made of the commit
# (TestInstallFromAModuleProxy). It pushes nothing: it prints the push.
# RELEASE_SKIP_CHECKS=1 skips the two go test runs (its own test does).
set -euo pipefail

version=${1:-}
die() { echo "release: $*" >&2; exit 1; }
[[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]] || die "want a version vX.Y.Z, got '$version'"
[[ ${BASH_REMATCH[1]} == 0 || ${BASH_REMATCH[1]} == 1 ]] || die "$version: a major version past v1 needs a /vN module path"
cd "$(git rev-parse --show-toplevel)"

library=github.com/oncekit/oncekit
released=(cmd/oncekit oncekitotel)
# The other modules of the workspace are not tagged, but build against the
# same version of the library.
others=(bench examples/kafka examples/orm examples/sqs internal/testkit/brokertests internal/testkit/browsertests)
tags=("$version")
for m in "${released[@]}"; do tags+=("$m/$version"); done

[[ -z $(git status --porcelain) ]] || die "the tree has uncommitted changes"
for tag in "${tags[@]}"; do
  ! git rev-parse -q --verify "refs/tags/$tag" >/dev/null || die "tag $tag exists"
done
[[ ! -e api/$version.txt ]] || die "api/$version.txt exists: $version was released"
grep -q '^## Unreleased$' CHANGELOG.md || die "CHANGELOG.md has no ## Unreleased section"

if [[ ${RELEASE_SKIP_CHECKS:-} != 1 ]]; then
  echo "release: the API against the last listing, and the changelog"
  go test -count=1 -run 'TestAPIKeepsTheReleasedSurface|TestPublicDocsMentionNoInternalPackage' .
fi

echo "release: every module requires $library@$version"
previous=$(awk -v lib="$library" '$1 == lib { print $2 }' cmd/oncekit/go.mod)
for m in "${released[@]}" "${others[@]}"; do
  (cd "$m" && go mod edit -require="$library@$version")
done
[[ -z $previous ]] || go work edit -dropreplace="$library@$previous"
go work edit -replace="$library@$version=./"

echo "release: api/$version.txt"
go run ./internal/testkit/apiguard/cmd/apilist > "api/$version.txt"
sed -i "s/^## Unreleased\$/## Unreleased\n\n## $version/" CHANGELOG.md

git add -A go.work CHANGELOG.md "api/$version.txt"
for m in "${released[@]}" "${others[@]}"; do git add "$m/go.mod"; done
git commit -q -m "release $version: every module requires $library@$version; api/$version.txt"

if [[ ${RELEASE_SKIP_CHECKS:-} != 1 ]]; then
  echo "release: install from a module proxy of the commit"
  go test -count=1 -run TestInstallFromAModuleProxy -v ./internal/testkit/release | grep -E 'install_test|^(ok|FAIL|---)'
fi

for tag in "${tags[@]}"; do git tag -a "$tag" -m "oncekit $version"; done
echo "release: tagged ${tags[*]} at $(git rev-parse --short HEAD)"
echo "release: publish with: git push origin HEAD ${tags[*]}"
