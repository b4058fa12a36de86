#!/usr/bin/env bash
# The GPU-machine run behind docs/results/: build flash-attn with the external spec, then verify,
# bench and doctor, in one hold of the lent H200 machine (see docs/results/README.md).
# Usage (from the repo root, on the GPU machine, with .whl/ and .cache/sdist/ carried):
#   bash scripts/gpu_session.sh start    # set up, start the build detached, wait up to ~9 min
#   bash scripts/gpu_session.sh wait     # keep waiting for the build (call again while it runs)
#   bash scripts/gpu_session.sh check    # verify (smoke + full + parity), bench, doctor; pack results
set -u
LINE=${LINE:-gpu-machine}
STATE=/tmp/fa-session
OUT=${OUT:-$STATE/out}
mkdir -p "$STATE" "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || echo "warning: could not install carried wheels"
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
# Sized by the toolkit (32 CPUs x threads_per_cpu 1.25 = 40 jobs); --mem-gb because this machine's MemTotal
# starts near 31 GiB and grows. A fresh machine has no earlier build: the knowledge's object costs
# (toolkit/knowledge/object_costs.yaml) order it longest first; the record's schedule.order says "knowledge".
BUILD_ARGS=${BUILD_ARGS:---mem-gb 240}

wait_for_build() {  # poll until the build ends or the command's time is nearly up
  local deadline=$(( $(date +%s) + ${1:-540} ))
  while [ ! -f "$STATE/build.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 10; done
  grep -aoE '\[[0-9]+/[0-9]+\]' "$STATE/build.log" | tail -1
  tail -c 3000 "$STATE/build.log"
  if [ -f "$STATE/build.rc" ]; then echo "BUILD FINISHED rc=$(cat "$STATE/build.rc")"; else echo "BUILD RUNNING"; fi
}

case "${1:-}" in
  start)
    { date -u; nvidia-smi; nproc; free -g; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; } \
      > "$STATE/machine.txt" 2>&1
    python3 -m toolkit doctor "$LINE" > "$STATE/doctor-before.txt" 2>&1
    cat "$STATE/doctor-before.txt"
    date -u +%s > "$STATE/build.started"
    # memory in use every 5 s while the build runs (MemTotal grows on this machine: used = total - available)
    setsid nohup bash -c "while [ ! -f $STATE/build.rc ]; do awk -v t=\$(date +%s) '/MemTotal/{m=\$2} /MemAvailable/{a=\$2} \
      END{printf \"%d %.1f\\n\", t, (m-a)/1048576}' /proc/meminfo; sleep 5; done > $STATE/memory-gb.txt" \
      >/dev/null 2>&1 < /dev/null &
    setsid nohup bash -c "python3 -m nox -s build-$LINE -- $BUILD_ARGS > $STATE/build.log 2>&1; echo \$? > $STATE/build.rc" \
      >/dev/null 2>&1 < /dev/null &
    sleep 5
    wait_for_build "${WAIT_S:-520}"
    ;;
  wait)
    wait_for_build "${WAIT_S:-540}"
    ;;
  check)
    # A second build with the same inputs must be a cache hit (under 1 s).
    python3 -m nox -s build-$LINE -- $BUILD_ARGS > "$STATE/build-cached.txt" 2>&1; echo "cached build rc=$?"; tail -3 "$STATE/build-cached.txt"
    python3 bench/build_efficiency.py "$LINE" > "$STATE/build-efficiency.txt" 2>&1; tail -12 "$STATE/build-efficiency.txt"
    python3 -m toolkit verify "$LINE" --level smoke --report-dir "reports/$LINE/smoke" > "$STATE/verify-smoke.txt" 2>&1
    echo "verify smoke rc=$?"; tail -5 "$STATE/verify-smoke.txt"
    python3 -m toolkit verify "$LINE" --level full > "$STATE/verify-full.txt" 2>&1; echo "verify full rc=$?"
    tail -15 "$STATE/verify-full.txt"
    python3 -m toolkit bench "$LINE" > "$STATE/bench.txt" 2>&1; echo "bench rc=$?"
    tail -25 "$STATE/bench.txt"
    python3 -m toolkit doctor "$LINE" > "$STATE/doctor-after.txt" 2>&1; echo "doctor rc=$?"
    python3 -m toolkit doctor "$LINE" --json > "$STATE/doctor-after.json" 2>&1
    cat "$STATE/doctor-after.txt"
    ;;
  *) echo "usage: $0 start|wait|check"; exit 2 ;;
esac
# Everything worth keeping, in one archive (the device returns at most 8 files).
tar czf "$OUT/session.tgz" -C "$STATE" --exclude out . -C "$PWD" \
  $(ls -d reports wheelhouse/$LINE/*.json wheelhouse/$LINE/*.png wheelhouse/$LINE/logs 2>/dev/null) 2>/dev/null
ls -la "$OUT"
