#!/usr/bin/env bash
# Compare this tree's bench (internal/cmd/bench) with an earlier commit's, run alternately on the
# same machine in the same hour, so that a change of the machine is not mistaken for a change of
# the code.
#
# Usage: scripts/bench-compare.sh [--rounds N] [--scenarios a,b] REF [bench flags…]
#
# Builds REF's bench in a git worktree under .cache/bench-compare/ (kept for the next run) and this
# tree's (uncommitted changes included), then, scenario by scenario, runs them in turn — ref,
# current, ref, current … — N rounds (default 3), each run with the same bench flags and its own
# --json file. Prints per scenario, for each figure both builds report, the ratio current/ref of
# each round's medians (its median and range over the rounds), and each run's own ratios to stock
# Watermill. Scenarios default to drain,consumer; a --scenario among the bench flags names them
# instead (comma-separated). Outputs stay in bench-results/compare-<time>/.
set -euo pipefail

rounds=3
scenarios=drain,consumer
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
    --rounds=*) rounds=${1#*=}; shift ;;
    --scenarios) scenarios=${2:?--scenarios needs a list}; shift 2 ;;
    --scenarios=*) scenarios=${1#*=}; shift ;;
    *) break ;;
  esac
done
ref=${1:-}
if [ -z "$ref" ]; then
  echo "bench-compare: name the earlier commit: scripts/bench-compare.sh REF (make bench-compare REF=<commit>)" >&2
  exit 2
fi
shift
case "$rounds" in
  ''|*[!0-9]*|0) echo "bench-compare: --rounds must be a whole number of at least 1, not '$rounds'" >&2; exit 2 ;;
esac

# The bench flags, less --scenario (run one scenario at a time) and --json (one file per run).
bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --scenario|-scenario) scenarios=${2:?--scenario needs a name}; shift 2 ;;
    --scenario=*|-scenario=*) scenarios=${1#*=}; shift ;;
    --json|-json) shift 2 ;;
    --json=*|-json=*) shift ;;
    *) bench_args+=("$1"); shift ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
sha=$(git rev-parse --verify --quiet "$ref^{commit}") || {
  echo "bench-compare: '$ref' is not a commit of this repository (git fetch it, or name a hash or branch)" >&2
  exit 2
}
short=${sha:0:7}
cache=$root/.cache/bench-compare
mkdir -p "$cache/bin"

tree=$cache/$short
if [ ! -e "$tree/.git" ]; then
  git worktree prune
  git worktree add --detach --quiet "$tree" "$sha"
fi
# Commits before the harnesses left cmd/ have the bench at cmd/bench: build whichever REF has.
ref_pkg=""
for pkg in internal/cmd/bench cmd/bench; do
  if git cat-file -e "$sha:$pkg/main.go" 2>/dev/null; then
    ref_pkg=$pkg
    break
  fi
done
if [ -z "$ref_pkg" ]; then
  echo "bench-compare: $short has no bench (neither internal/cmd/bench nor cmd/bench)" >&2
  exit 2
fi
echo "building ref $short's $ref_pkg in $tree"
# GOWORK=off: the tree lies under this one, whose go.work (if it has none of its own) does not use it.
(cd "$tree" && GOWORK=off go build -o "$cache/bin/bench-$short" "./$ref_pkg")

current=$(git rev-parse --short=7 HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || current="$current+changes"
echo "building current ($current) internal/cmd/bench"
go build -o "$cache/bin/bench-current" ./internal/cmd/bench

out=$root/bench-results/compare-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
echo "runs and their output in $out"

IFS=, read -r -a names <<<"$scenarios"
failed=""
for sc in "${names[@]}"; do
  mkdir -p "$out/$sc"
  for r in $(seq 1 "$rounds"); do
    for side in ref current; do
      bin=$cache/bin/bench-current
      [ "$side" = ref ] && bin=$cache/bin/bench-$short
      echo "== $sc round $r/$rounds: $side"
      # The ref runs in its own tree, so that anything it reads relative to its sources is its own.
      dir=$root
      [ "$side" = ref ] && dir=$tree
      if ! (cd "$dir" && "$bin" --scenario "$sc" --json "$out/$sc/round$r-$side.json" "${bench_args[@]}") \
        >"$out/$sc/round$r-$side.txt" 2>&1; then
        echo "   $side run failed (see $out/$sc/round$r-$side.txt):"
        tail -n 3 "$out/$sc/round$r-$side.txt" | sed 's/^/   /'
        rm -f "$out/$sc/round$r-$side.json"
        failed="$failed $sc/round$r-$side"
      fi
    done
  done
done

go run ./internal/cmd/benchpair --scenarios "$scenarios" --ref "$short" --current "$current" "$out" | tee "$out/ratios.txt"
if [ -n "$failed" ]; then
  echo "bench-compare: runs that failed:$failed" >&2
  exit 1
fi
