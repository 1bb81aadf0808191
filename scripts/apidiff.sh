#!/usr/bin/env bash
# List the exported-API changes of this tree against the last released version, so that a breaking
# change is a decision and not an accident (make lint runs it).
#
# The last release is the first "## [x.y.z]" heading of CHANGELOG.md; its commit is the tag vx.y.z,
# or, in a clone without tags, the commit scripts/releases.txt records for it. The release's API is
# written once by apidiff (golang.org/x/exp/cmd/apidiff) from a worktree of that commit, and kept in
# .cache/apidiff/. Every change is printed; the run fails when an incompatible change's identifier is
# not named in the CHANGELOG's [Unreleased] section, where each breaking change gets its line and
# its migration.
#
# Usage: scripts/apidiff.sh            (from the repository, or anywhere: it finds its root)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The library's module alone: in the workspace (go.work) its import path's pattern would take in the
# integration module's packages too, and the release's worktree under .cache/ would be taken for a
# directory of this workspace that no `use` names.
export GOWORK=off

apidiff_version=v0.0.0-20261113113407-e3970619a1a4
# apidiff says which internal packages it skips, one line each: not news.
apidiff() { go run "golang.org/x/exp/cmd/apidiff@$apidiff_version" "$@" 2> >(grep -v '^Ignoring internal package' >&2); }
module=$(go list -m)

version=$(sed -n 's/^## \[\([0-9][0-9.]*[^]]*\)\].*/\1/p' CHANGELOG.md | head -1)
if [ -z "$version" ]; then
  echo "apidiff: CHANGELOG.md names no released version (a heading '## [x.y.z] - date'): nothing to compare" >&2
  exit 0
fi
tag="v$version"
commit=$(git rev-parse -q --verify "refs/tags/$tag^{commit}" 2>/dev/null || true)
if [ -z "$commit" ] && [ -f scripts/releases.txt ]; then
  commit=$(awk -v t="$tag" '$1 == t { print $2 }' scripts/releases.txt)
fi
if [ -z "$commit" ]; then
  # The release being prepared: CHANGELOG.md names it and no tag exists yet, so there is nothing
  # earlier to compare with. Once tagged (and recorded in scripts/releases.txt) it is the base.
  echo "apidiff: $tag is not tagged yet (no tag, not in scripts/releases.txt): no released API to compare with"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "apidiff: $tag's commit $commit is not in this clone (a shallow checkout?): fetch the history to list API changes" >&2
  exit 0
fi

cache="$root/.cache/apidiff"
mkdir -p "$cache"
base="$cache/$tag-${commit:0:12}.export"
if [ ! -s "$base" ]; then
  wt="$cache/worktree-$tag"
  git worktree remove --force "$wt" >/dev/null 2>&1 || rm -rf "$wt"
  git worktree add --quiet --detach "$wt" "$commit"
  trap 'git -C "$root" worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
  (cd "$wt" && apidiff -m -w "$base.tmp" "$module")
  mv "$base.tmp" "$base"
fi
current="$cache/current.export"
apidiff -m -w "$current" "$module"

report=$(apidiff -m "$base" "$current")
if [ -z "$report" ]; then
  echo "apidiff: the exported API is $tag's"
  exit 0
fi
echo "apidiff: exported-API changes since $tag (${commit:0:12}):"
printf '%s\n' "$report" | sed 's/^/  /'

# The incompatible changes: apidiff prints them under "Incompatible changes:" per package, each as
# "- Name: what changed"; every Name must appear in the [Unreleased] section of CHANGELOG.md.
unreleased=$(awk '/^## \[Unreleased\]/ { on = 1; next } /^## \[/ { on = 0 } on' CHANGELOG.md)
missing=()
while IFS= read -r name; do
  [ -n "$name" ] || continue
  case "$name" in
    "package "*) short=${name##*/} ;; # a package removed: its name
    *) short=${name##*.} ;;           # ./pkg.Type.Field: the identifier itself
  esac
  if ! grep -qF -- "$short" <<<"$unreleased"; then
    missing+=("$name")
  fi
done < <(printf '%s\n' "$report" | awk '
  /^Incompatible changes:/ { inc = 1; next }
  /^Compatible changes:/ { inc = 0; next }
  /^[^ -]/ && !/changes:$/ { inc = 0 }
  inc && /^- / { sub(/^- /, ""); sub(/:.*/, ""); print }')
if [ ${#missing[@]} -gt 0 ]; then
  echo "apidiff: breaking changes the CHANGELOG's [Unreleased] section does not name:" >&2
  printf '  %s\n' "${missing[@]}" >&2
  echo "apidiff: say each in CHANGELOG.md under [Unreleased] (### Changed or ### Removed) with its migration, or undo it" >&2
  exit 1
fi
