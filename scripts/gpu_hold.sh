#!/usr/bin/env bash
# One hold of the lent H200 for issues 13 and 16 together. Two detached pipelines share the machine:
#  - the FA2 pipeline (from `start`): the whole flash-attn 2.8.3.post2 build through the toolkit on the machine's
#    CUDA 13.0 laid out as conda-forge's packages (scripts/gpu_replica_build.sh), 16 CPUs for about 20 minutes;
#  - the FA4 pipeline (from `fa4`, once its wheels are joined): FlashAttention-4 installed by the toolkit in a
#    folder of its own, its kernel cache warmed, its full verification. It needs the GPU and a few CPUs, so it
#    runs while the build compiles (a 30-minute hold has no room for the two one after the other).
# When the build ends, the FA2 pipeline imports and verifies FA2, stops the FA4 verification if it is still
# running (its report is written per case), installs FA4 BESIDE FA2 in FA2's folder, and runs one `toolkit bench`
# of FA2, FA4 and torch's SDPA backends together (the GPU otherwise idle), then the recommendation.
#
#   run(kind="nvidia-h200", carry=[".whl", ".cache/sdist", ".gpu-carry"], command="bash scripts/gpu_hold.sh start")
#   run(carry=[".whl-fa4/part1"], command="bash scripts/gpu_hold.sh carry")       # one call per .whl-fa4/partN
#   run(carry=[".whl-fa4/part2"], command="bash scripts/gpu_hold.sh carry")       #   folder (3 for b40)
#   run(carry=[".whl-fa4/part3"], command="bash scripts/gpu_hold.sh carry")
#   run(command="bash scripts/gpu_hold.sh fa4")                                   # joins; starts the FA4 pipeline
#   run(command="WAIT_S=560 bash scripts/gpu_hold.sh wait")                       # again while it says RUNNING
# The machine is given back 30 s after a call returns: make the next call at once, and check each reply's "warm".
#
# .whl/ (zstandard, pydantic, py-rattler for Python 3.12), .cache/sdist/ and .gpu-carry/: see
# scripts/gpu_replica_build.sh; .whl-fa4/: scripts/fetch_fa4_wheels.sh. Results under $OUT (steps.txt, the
# reports, the build record, logs); each call stays under 9.5 minutes.
set -u
STATE=${STATE:-/tmp/fa-hold}
OUT=${OUT:-$STATE/out}
RESULTS=$STATE/results
SITE=/tmp/fa-replica/site  # gpu_replica_build.sh installs FA2 there (--install-target)
FA4_SITE=$STATE/fa4-site   # FA4 alone, while FA2 builds
CACHE=$STATE/kernel-cache  # FA4's kernel cache, shared by both installs (same FA4, cutlass-dsl, torch, python)
LINE=gpu-replica
PY=${PY:-/opt/torch/.venv/bin/python3}
T0=$(date +%s)
mkdir -p "$OUT" "$RESULTS" "$STATE/wheels"
export PYTHONUNBUFFERED=1

# shellcheck source=scripts/gpu_steps.sh
source scripts/gpu_steps.sh  # step, fa4_carry_parts, fa4_env

fa4_install() {  # fa4_install TARGET LOGNAME: the toolkit's hash-checked install of the lock's FA4 pins
  step "$2" 240 "$PY" -m toolkit.fa4 install --lock "locks/$LINE.fa4-lock.json" --wheels "$STATE/wheels/all" \
    --target "$1" --python "$PY"
}

fa4_pipeline() {  # FA4 alone in its own folder, beside the build: install, warm, full verification
  export PYTHONPATH=$PWD
  fa4_install "$FA4_SITE" fa4-install
  step fa4-warm 420 "$PY" -m toolkit.fa4 warm --target "$FA4_SITE" --cache-dir "$CACHE" \
    --artifacts "$STATE/fa4-artifacts" --arch 90 --report "$RESULTS/latency.json" --budget-s 150 --jobs 4
  fa4_env "$FA4_SITE" "$CACHE"
  step fa4-verify-full 1500 "$PY" -m toolkit verify "$LINE" --impl flash-attn-4 --python "$PY" --level full \
    --report-dir "$RESULTS/verify-fa4-full"
  touch "$STATE/fa4.done"
}

fa2_pipeline() {  # the build (polled inside), FA2's checks, then FA4 beside FA2, one bench of all, recommend
  export PYTHONPATH=$PWD
  PROBE=0 BUILD_ARGS="--arch 90 --mem-gb 110 --keep-build-dir --install-target $SITE --wheelhouse /tmp/fa-replica/wheelhouse \
--order-from docs/results/2026-11-29-h200-seeded-build/build-record.json" \
    WAIT_S=1700 OUT=$RESULTS/replica step replica-build 1750 bash scripts/gpu_replica_build.sh start
  export PYTHONPATH=$SITE:$PWD
  step fa2-import 120 "$PY" -c "import torch, flash_attn, flash_attn_2_cuda; print(flash_attn.__version__, flash_attn.__file__)"
  step fa2-verify-smoke 200 "$PY" -m toolkit verify "$LINE" --level smoke --report-dir "$RESULTS/verify-fa2-smoke" \
    --wheelhouse /tmp/fa-replica/wheelhouse
  local waited=0  # the bench must have the GPU to itself
  while [ ! -f "$STATE/fa4.done" ] && [ $waited -lt 60 ]; do sleep 5; waited=$((waited + 5)); done
  if [ ! -f "$STATE/fa4.done" ] && [ -f "$STATE/fa4.sid" ]; then
    pkill -TERM -s "$(cat "$STATE/fa4.sid")"
    echo "$(date -u +%H:%M:%S) fa4-pipeline stopped at the build's end (verification report: the cases judged so far)" \
      | tee -a "$RESULTS/steps.txt"
  fi
  fa4_install "$SITE" fa4-install-beside-fa2
  fa4_env "$SITE" "$CACHE"
  step both-import 120 "$PY" -c "import torch, flash_attn, flash_attn.cute as c; print(flash_attn.__version__, \
flash_attn.flash_attn_func.__module__, c.__file__, c.flash_attn_func.__module__)"
  step bench 420 "$PY" -m toolkit bench "$LINE" --report-dir "$RESULTS/bench" --head-dims 64,128 \
    --wheelhouse /tmp/fa-replica/wheelhouse
  step recommend 60 "$PY" -m toolkit recommend --bench "$RESULTS/bench/bench.json" \
    --verified "fa4=$RESULTS/verify-fa4-full/verify.json" --verified "flash-attn=$RESULTS/verify-fa2-smoke/verify.json" \
    --out "$RESULTS/recommendation.json"
  echo done > "$STATE/pipeline.done"
}

detach() {  # detach FUNCTION SIDFILE: run it in a session of its own (it outlives this call); SIDFILE gets its id
  export -f fa2_pipeline fa4_pipeline fa4_install step fa4_env
  export STATE RESULTS SITE FA4_SITE CACHE LINE PY
  setsid nohup bash -c "echo \$\$ > '$STATE/$2'; $1" > "$STATE/$1.log" 2>&1 < /dev/null &
}

report() {
  collect
  tail -n 20 "$RESULTS/steps.txt" 2>/dev/null
  [ -f "$RESULTS/replica/summary.txt" ] && head -n 4 "$RESULTS/replica/summary.txt"
  for log in "$RESULTS"/*.log; do [ -f "$log" ] && { echo "--- $(basename "$log")"; tail -n 6 "$log"; }; done
  [ -f "$STATE/pipeline.done" ] && echo "PIPELINE DONE" || echo "PIPELINE RUNNING"
}

collect() {  # what the pipeline has written so far, into $OUT (a call cut short still returns it)
  cp "$RESULTS"/steps.txt "$OUT"/ 2>/dev/null
  (cd "$RESULTS" && find . \( -name '*.json' -o -name '*.png' -o -name '*.xml' -o -name '*.txt' -o -name '*.log' \) \
    -size -15M -exec cp --parents {} "$OUT"/ \;) 2>/dev/null
}

wait_until() {  # poll until the pipeline ends or this call's time is nearly used
  local last=0
  while [ ! -f "$STATE/pipeline.done" ] && [ "$(date +%s)" -lt $(( T0 + ${1:-540} )) ]; do
    sleep 10
    [ $(( $(date +%s) - last )) -ge 60 ] && { collect; last=$(date +%s); }
  done
  report
}

case "${1:-}" in
  start)
    "$PY" -m pip install -q --no-index --find-links .whl zstandard pydantic py-rattler 2>&1 | tail -2
    "$PY" -c "import rattler, pydantic, zstandard; print('toolkit deps ok')"
    rm -rf /tmp/fa-replica "$RESULTS" && mkdir -p "$RESULTS"
    # the carried .cache/sdist and .gpu-carry are read in the build's first seconds (gpu_replica_build.sh setup)
    detach fa2_pipeline pipeline.sid
    date -u +%s > "$STATE/pipeline.started"
    sleep 25
    report
    ;;
  carry)
    [ -f "$STATE/pipeline.started" ] || { echo "FRESH MACHINE: no pipeline here; start again"; exit 3; }
    fa4_carry_parts "$STATE/wheels"
    report
    ;;
  fa4)
    [ -f "$STATE/pipeline.started" ] || { echo "FRESH MACHINE: no pipeline here; start again"; exit 3; }
    PYTHONPATH=$PWD "$PY" -m toolkit.fa4 join --dest "$STATE/wheels/all" "$STATE/wheels"/part[0-9]* \
      && detach fa4_pipeline fa4.sid
    sleep 5
    report
    ;;
  wait)
    if [ ! -f "$STATE/pipeline.started" ]; then  # the lent machine was given back and this is a fresh one
      echo "FRESH MACHINE: no pipeline here (its state went with the machine that was given back); start again"
      exit 3
    fi
    wait_until "${WAIT_S:-540}" ;;
  *) echo "usage: $0 start|carry|fa4|wait"; exit 2 ;;
esac
