#!/usr/bin/env bash
# Demo: start the simulator, backfill every resource from it, mutate, sync.
set -euo pipefail
bin=${1:-bin/backstop}
work=$(mktemp -d)
trap 'kill "$sim_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
port=${DEMO_PORT:-18081}
"$bin" sim --listen 127.0.0.1:$port --objects 5000 --limit 60 --window 2s --mutation-rate 20 >"$work/sim.out" 2>"$work/sim.log" &
sim_pid=$!
for _ in $(seq 100); do
  grep -q '^api_key=' "$work/sim.out" 2>/dev/null && break
  kill -0 "$sim_pid" 2>/dev/null || break
  sleep 0.1
done
if ! grep -q '^api_key=' "$work/sim.out" 2>/dev/null; then
  echo "demo: the simulator did not start (is port $port taken? set DEMO_PORT):" >&2
  cat "$work/sim.log" >&2
  exit 1
fi
cat >"$work/schedules.yaml" <<YAML
source:
  base_url: http://127.0.0.1:$port
  api_key: \${BOTIX_API_KEY}
  page_size: 100
  rate_limit: {per_minute: 1800, reserve: 5, window: 2s}
store:
  path: ./backstop.db
YAML
export BOTIX_API_KEY=$(sed -n 's/^api_key=//p' "$work/sim.out")
echo "== backfill (sim: 5,000 objects per resource, 60 requests per 2 s window: about 7 s)"
"$bin" --config "$work/schedules.yaml" backfill
echo "== sync (picks up what the sim changed meanwhile)"
"$bin" --config "$work/schedules.yaml" sync
echo "== cursors"
"$bin" --config "$work/schedules.yaml" cursors
