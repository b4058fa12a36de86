#!/usr/bin/env bash
# One hold of the lent H200 for FlashAttention-3 (issue 25 items 2, 3, 5): envs/gpu-machine-fa3.yaml
# (hopper-training-fp8 profile) built by `toolkit build` detached from the pinned archives, installed into a folder of
# its own; FA4 installed by the toolkit into another folder and verified at the full level while FA3 compiles; then
# FA3's verification (`toolkit verify --impl flash-attn-3`, smoke and full), and, once FA4's verification has
# ended, one `toolkit bench` of FA3, FA4 and torch's SDPA backends with the GPU alone, and `toolkit recommend` over
# both reports. ORDER_FROM=<build record> (e.g. docs/results/2026-12-02-h200-fa3/build-record.json) starts the
# objects longest first by that record's times; without it the knowledge's FA3 costs of the commit and profile do.
#
# Prepared here (git-ignored folders):
#   .cache/flash-attn-3/<commit>/: the two archives (docs/fa3.md, "On the GPU machine" step 1), then
#     `toolkit check gpu-machine-fa3`
#   .whl/: zstandard, pydantic (+ pydantic-core, annotated-types, typing-inspection, typing-extensions), py-rattler
#     0.28.0 for cp312 (the machine lacks them; `toolkit build` needs py-rattler)
#   .whl-fa4/part1, part2, part3: bash scripts/fetch_fa4_wheels.sh (each part under 44 MiB, one carry each)
#   locks/gpu-machine-fa4.fa4-lock.json: the FA4 lock gpu_fa4.sh uses (committed)
# Then, each call at once after the last (the machine goes back 30 s after a call; check each reply's "warm"):
#   run(kind="nvidia-h200", carry=[".whl", ".cache/flash-attn-3"], command="bash scripts/gpu_fa3.sh start")
#   run(carry=[".whl-fa4/part1"], command="bash scripts/gpu_fa3.sh carry")    # one call per .whl-fa4/partN
#   run(carry=[".whl-fa4/part2"], command="bash scripts/gpu_fa3.sh carry")    #   folder (3 for b40)
#   run(carry=[".whl-fa4/part3"], command="bash scripts/gpu_fa3.sh carry")
#   run(command="bash scripts/gpu_fa3.sh fa4")                                # joins, installs FA4 beside the build
#   run(command="WAIT_S=560 bash scripts/gpu_fa3.sh wait")                     # again while it says RUNNING
# FA4_REPORT=<an FA4 full verification report of the same GPU and pins> on start and fa4 skips FA4's verification
# (about 15 minutes) and gives the recommendation that report.
# Budget: 30 min of device time, each call under 9.5 min, carry under 64 MiB per call. Results under $OUT
# (steps.txt, step logs, the build record, verify.json/xml, bench.json/png, recommendation.json).
# `bash scripts/gpu_fa3.sh check` runs the parts that need no GPU (here too): the line's check and the carried files.
set -u
LINE=gpu-machine-fa3
STATE=${STATE:-/tmp/fa3-hold}
OUT=${OUT:-$STATE/out}
RESULTS=$STATE/results
FA3_SITE=$STATE/fa3-site       # `toolkit build --install-target`: FA3 alone (the profile builds no FA2)
FA4_SITE=$STATE/fa4-site       # FA4 in its own folder; both folders go on PYTHONPATH for the bench
CACHE=$STATE/kernel-cache      # FA4's kernel cache
WHEELHOUSE=$STATE/wheelhouse
PY=${PY:-/opt/torch/.venv/bin/python3}
T0=$(date +%s)
mkdir -p "$OUT" "$RESULTS" "$STATE/wheels"
export PYTHONUNBUFFERED=1

# shellcheck source=scripts/gpu_steps.sh
source scripts/gpu_steps.sh  # step, fa4_env, report, wait_until, fresh

build_pipeline() {  # the FA3 build (the machine's 16 CPUs), FA3's checks, then the bench with the GPU alone
  export PYTHONPATH=$PWD TOOLKIT_CACHE=$STATE/cache
  step build 1500 "$PY" -m toolkit build "$LINE" --arch 90 --mem-gb 110 --keep-build-dir \
    --install-target "$FA3_SITE" --wheelhouse "$WHEELHOUSE" ${ORDER_FROM:+--order-from "$ORDER_FROM"}
  cp "$WHEELHOUSE/$LINE+fa3"/*.json "$RESULTS/" 2>/dev/null
  export PYTHONPATH=$FA3_SITE:$PWD
  step fa3-import 120 "$PY" -c "import torch, flash_attn_interface as f, flash_attn_config as c; \
print(torch.__version__, f.__file__); print(c.CONFIG['build_flags'])"
  step fa3-verify-smoke 300 "$PY" -m toolkit verify "$LINE" --impl flash-attn-3 --level smoke \
    --report-dir "$RESULTS/verify-fa3-smoke" --wheelhouse "$WHEELHOUSE"
  step fa3-verify-full 600 "$PY" -m toolkit verify "$LINE" --impl flash-attn-3 --level full \
    --report-dir "$RESULTS/verify-fa3-full" --wheelhouse "$WHEELHOUSE"
  bench_pipeline
}

bench_pipeline() {  # after FA3's checks: wait for FA4's verification, then the bench with the GPU alone, recommend
  export PYTHONPATH=$FA3_SITE:$PWD
  local waited=0  # FA4's full verification (beside the build) must end before the bench: the bench has the GPU alone
  while [ ! -f "$STATE/fa4.done" ] && [ $waited -lt "${FA4_WAIT_S:-420}" ]; do sleep 5; waited=$((waited + 5)); done
  if [ ! -f "$STATE/fa4.done" ] && [ -f "$STATE/fa4.sid" ]; then
    pkill -TERM -s "$(cat "$STATE/fa4.sid")"
    echo "$(date -u +%H:%M:%S) fa4-pipeline stopped before the bench (verification report: the cases judged so far)" \
      | tee -a "$RESULTS/steps.txt"
  fi
  fa4_env "$FA4_SITE" "$CACHE"  # FA4's folder on the path (after $PWD)
  export PYTHONPATH=$FA3_SITE:$PYTHONPATH
  step both-import 120 "$PY" -c "import torch, flash_attn_interface as f3, flash_attn.cute as f4; \
print(f3.__file__, f4.__file__)"
  step bench 420 "$PY" -m toolkit bench "$LINE" --report-dir "$RESULTS/bench" --head-dims 64,128 \
    --wheelhouse "$WHEELHOUSE"
  step recommend 60 "$PY" -m toolkit recommend --bench "$RESULTS/bench/bench.json" \
    --verified "flash-attn-3=$RESULTS/verify-fa3-full/verify.json" --verified "fa4=${FA4_REPORT:-$RESULTS/verify-fa4-full/verify.json}" \
    --out "$RESULTS/recommendation.json"
  echo done > "$STATE/pipeline.done"
}

fa4_pipeline() {  # FA4 into its own folder from the joined wheels, then its full verification, beside the build
  export PYTHONPATH=$PWD
  step fa4-install 240 "$PY" -m toolkit.fa4 install --lock locks/gpu-machine-fa4.fa4-lock.json \
    --wheels "$STATE/wheels/all" --target "$FA4_SITE" --python "$PY"
  fa4_env "$FA4_SITE" "$CACHE"
  [ -n "${FA4_REPORT:-}" ] || \
    step fa4-verify-full 1500 "$PY" -m toolkit verify "$LINE" --impl flash-attn-4 --python "$PY" --level full \
      --report-dir "$RESULTS/verify-fa4-full"
  touch "$STATE/fa4.done"
}

detach() {  # detach FUNCTION SIDFILE: run it in a session of its own (it outlives this call)
  export -f build_pipeline bench_pipeline fa4_pipeline step fa4_env
  export STATE RESULTS FA3_SITE FA4_SITE CACHE WHEELHOUSE LINE PY ORDER_FROM FA4_WAIT_S FA4_REPORT
  setsid nohup bash -c "echo \$\$ > '$STATE/$2'; $1" > "$STATE/$1.log" 2>&1 < /dev/null &
}

collect() {  # what the pipeline has written so far, into $OUT as one file (a call brings back at most 8, and no name
  # with a '+'; a call cut short still returns it)
  tar czf "$OUT/results.tgz" -C "$RESULTS" . 2>/dev/null
  cp "$RESULTS/steps.txt" "$OUT/" 2>/dev/null
}

case "${1:-}" in
  check)  # no GPU needed: the line, the archives and the carried folders as the calls above would see them
    "$PY" -m toolkit check "$LINE" || exit 1
    ls .cache/flash-attn-3/*/ 2>/dev/null || echo "missing: .cache/flash-attn-3/<commit>/ (docs/fa3.md)"
    for d in .whl .cache/flash-attn-3 .whl-fa4/part[0-9]*; do
      [ -d "$d" ] && echo "$d: $(du -sm "$d" | cut -f1) MiB (carry limit 64, the working tree included)" \
        || echo "missing: $d"
    done
    [ -f locks/gpu-machine-fa4.fa4-lock.json ] || echo "missing: locks/gpu-machine-fa4.fa4-lock.json"
    ;;
  start)
    "$PY" -m pip install -q --no-index --find-links .whl zstandard pydantic py-rattler 2>&1 | tail -2
    "$PY" -c "import pydantic, zstandard, rattler; print('toolkit deps ok')" || exit 1
    for sid in "$STATE"/*.sid; do [ -f "$sid" ] && pkill -TERM -s "$(cat "$sid")"; done  # a start before this one
    rm -rf "$RESULTS" "$STATE"/*.sid "$STATE"/*.done && mkdir -p "$RESULTS" "$STATE/cache"
    cp -r .cache/flash-attn-3 "$STATE/cache/"  # TOOLKIT_CACHE: the build reads the archives from there
    { date -u; nproc; free -g | head -2; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
      git log -1 --format='project %h %s' 2>/dev/null; } > "$RESULTS/machine.txt" 2>&1
    detach build_pipeline pipeline.sid
    date -u +%s > "$STATE/pipeline.started"
    sleep 25
    report
    ;;
  carry)
    fresh
    fa4_carry_parts "$STATE/wheels"
    report
    ;;
  fa4)
    fresh
    PYTHONPATH=$PWD "$PY" -m toolkit.fa4 join --dest "$STATE/wheels/all" "$STATE/wheels"/part[0-9]* \
      && detach fa4_pipeline fa4.sid
    sleep 5
    report
    ;;
  bench)  # the FA3 part is done but FA4's verification needs longer than the pipeline waits: wait again, then bench
    fresh
    pkill -TERM -s "$(cat "$STATE/pipeline.sid")"
    FA4_WAIT_S=${FA4_WAIT_S:-900} detach bench_pipeline pipeline.sid
    sleep 2
    report
    ;;
  wait)
    fresh
    wait_until "${WAIT_S:-540}" ;;
  *) echo "usage: $0 check|start|carry|fa4|wait|bench"; exit 2 ;;
esac
