#!/usr/bin/env bash
# FlashAttention-4 on the lent H200: install the default release (knowledge/fa4_pins.py DEFAULT_RELEASE, the one
# locks/gpu-machine-fa4.fa4-lock.json pins) through the toolkit from carried wheels, warm the kernel cache, time
# first calls cold vs warm (fresh processes), verify, then an earlier release (B36_RELEASE) in a second --target
# for one bench of both side by side, recommend. The machine has no network: prepare here first (git-ignored):
#   bash scripts/fetch_fa4_wheels.sh --also 4.0.0b36   # .whl-fa4/part1, 2, 3 (the default's), b36 (< 44 MiB each)
#   .whl/: the toolkit's dependencies the machine's python lacks (zstandard, pydantic, py-rattler, in-toto-attestation
#     and theirs, cp312 manylinux; the pip download line in scripts/gpu_cache.sh's header)
# Phases, in this order, each one `run` call under 9 minutes, on ONE warm machine (check each reply's "warm"):
#
#   run(command="bash scripts/gpu_fa4.sh deps", carry=[".whl"])                 # ~30 s: the toolkit's dependencies
#   run(command="bash scripts/gpu_fa4.sh carry", carry=[".whl-fa4/part1"])      # ~10 s each: copy the part to $STATE;
#   run(command="bash scripts/gpu_fa4.sh carry", carry=[".whl-fa4/part2"])      #   one call per .whl-fa4/partN folder
#   run(command="bash scripts/gpu_fa4.sh carry", carry=[".whl-fa4/part3"])      #   the fetch printed (3 for b40)
#   run(command="bash scripts/gpu_fa4.sh install")                              # ~6 min: join every part, install,
#                                                                               #   warm, latency, verify smoke, parity
#   run(command="bash scripts/gpu_fa4.sh b36", carry=[".whl-fa4/b36"])          # ~5 min: b36 installed beside, warm, smoke
#   run(command="bash scripts/gpu_fa4.sh bench")                                # ~6-8 min: bench b40, bench b36, recommend
#   run(command="bash scripts/gpu_fa4.sh dq-probe")                             # ~3 min: dQ at head dims 40/80/112 (sm_90)
#   run(command="bash scripts/gpu_fa4.sh verify-full")                          # ~9 min: the default release, full level
#
# Every phase writes under $OUT: steps.txt (each step's rc and seconds), the step logs, the JSON reports and
# fa4-results.tgz. A failing step is logged and the next steps still run. NO_GPU=1 stops each phase after its
# install (a dry run of the join and install steps on a machine without a GPU; PY names a python with torch).
set -u
STATE=${STATE:-/tmp/fa4-session}
OUT=${OUT:-$STATE/out}
RESULTS=$STATE/results
WHEELS=$STATE/wheels
TARGET=$STATE/site                    # the default release (the lock's)
CACHE=$STATE/kernel-cache
ARTIFACTS=$STATE/fa4-artifacts        # warm's cache artifact and its .kernel-cache.json record
B36_RELEASE=${B36_RELEASE:-4.0.0b36}  # the release benched beside it (its wheels: .whl-fa4/b36 + the shared closure)
B36_TARGET=$STATE/site-b36
B36_CACHE=$STATE/kernel-cache-b36
B36_ARTIFACTS=$STATE/fa4-artifacts-b36
LINE=${LINE:-gpu-machine-fa4}  # envs/gpu-machine-fa4.yaml: the image + FA4 instead of FA2
PY=${PY:-$(command -v python3)}
NO_GPU=${NO_GPU:-}
mkdir -p "$OUT" "$RESULTS" "$WHEELS"
export PYTHONUNBUFFERED=1

# shellcheck source=scripts/gpu_steps.sh
source scripts/gpu_steps.sh  # step, fa4_carry_parts, fa4_env

pack() {  # steps.txt, the logs and the reports (small) straight into $OUT, everything in one archive as well
  cp "$RESULTS"/steps.txt "$RESULTS"/*.log "$RESULTS"/machine.txt "$OUT"/ 2>/dev/null
  (cd "$RESULTS" && find . -maxdepth 2 \( -name '*.json' -o -name '*.png' -o -name '*.xml' \) -size -15M \
    -exec cp --parents {} "$OUT"/ \;) 2>/dev/null
  tar czf "$OUT/fa4-results.tgz" -C "$STATE" results \
    $(cd "$STATE" && ls -d fa4-artifacts*/*.kernel-cache.json 2>/dev/null)
  for artifact in "$ARTIFACTS"/*.tar.gz "$B36_ARTIFACTS"/*.tar.gz; do  # a warmed cache comes back if it fits one file
    [ -f "$artifact" ] && [ "$(stat -c %s "$artifact")" -lt 15000000 ] && cp "$artifact" "$OUT"/
  done
  ls -la "$OUT"
}

warm_and_smoke() {  # warm_and_smoke TARGET CACHE ARTIFACTS SUFFIX WARM_LIMIT BUDGET: warm, then the smoke verification
  step "warm$4" "$5" "$PY" -m toolkit.fa4 warm --target "$1" --python "$PY" --cache-dir "$2" --artifacts "$3" \
    --arch 90 --report "$RESULTS/latency$4.json" --budget-s "$6" --jobs 4
  fa4_env "$1" "$2"
  step "verify-fa4-smoke$4" 150 "$PY" -m toolkit verify "$LINE" --impl flash-attn-4 --python "$PY" --level smoke \
    --report-dir "$RESULTS/verify-fa4-smoke$4"
}

bench() {  # bench SUFFIX LIMIT: the line's bench with the FA4 that fa4_env chose, into bench$SUFFIX/
  local began
  began=$(date +%s)
  step "bench$1" "$2" "$PY" -m toolkit bench "$LINE" --report-dir "$RESULTS/bench$1" --head-dims 64,128
  # the verb checks the line's spec first; if that refused quickly, measure without it (no peak/targets/plot)
  if [ ! -f "$RESULTS/bench$1/bench.json" ] && [ $(( $(date +%s) - began )) -lt 60 ]; then
    step "bench$1-measure-only" $(( $2 - 60 )) "$PY" -m toolkit.verify.bench "$LINE" --report-dir "$RESULTS/bench$1" \
      --head-dims 64,128
  fi
}

case "${1:-}" in
  deps)  # the toolkit's own dependencies, from the carried .whl (no index here)
    step deps 120 "$PY" -m pip install --no-index --find-links .whl zstandard pydantic py-rattler
    step deps-import 30 "$PY" -c "import pydantic, zstandard, rattler; print('toolkit deps ok')"
    ;;
  carry)  # one carried part folder (or several) into $WHEELS; the machine's facts on the first
    fa4_carry_parts "$WHEELS"
    [ -f "$RESULTS/machine.txt" ] || { date -u; nvidia-smi; nproc; free -g; "$PY" -c 'import torch, sys; print(sys.version, torch.__version__, torch.version.cuda)'
      "$PY" -m pip list 2>/dev/null | grep -iE 'cuda|torch|triton|einops|protobuf|typing|packaging|yaml|rich|pydantic'; } \
      > "$RESULTS/machine.txt" 2>&1
    tail -n 25 "$RESULTS/machine.txt"
    ;;
  install)  # every carried part folder joined (a missing one: join names it), installed, warmed, verified
    step join 120 "$PY" -m toolkit.fa4 join --dest "$WHEELS/all" "$WHEELS"/part[0-9]*
    step install 240 "$PY" -m toolkit.fa4 install --lock "locks/$LINE.fa4-lock.json" --wheels "$WHEELS/all" \
      --target "$TARGET" --python "$PY"
    if [ -z "$NO_GPU" ]; then
      warm_and_smoke "$TARGET" "$CACHE" "$ARTIFACTS" "" 320 200
      step parity-fa4 90 "$PY" -m toolkit verify "$LINE" --impl flash-attn-4 --python "$PY" --level parity \
        --report-dir "$RESULTS/parity-fa4"
    fi
    ;;
  b36)  # the earlier release in a folder of its own: its own wheel(s) joined beside the shared closure
    cp -r .whl-fa4/b36 "$WHEELS"/ && echo "b36: $(ls "$WHEELS/b36" | wc -l) files"
    step join-b36 60 "$PY" -m toolkit.fa4 join --dest "$WHEELS/all" "$WHEELS/b36"
    step install-b36 120 "$PY" -m toolkit.fa4 install --release "$B36_RELEASE" --cuda-major 13 --wheels "$WHEELS/all" \
      --target "$B36_TARGET" --python "$PY"
    [ -z "$NO_GPU" ] && warm_and_smoke "$B36_TARGET" "$B36_CACHE" "$B36_ARTIFACTS" -b36 260 150
    ;;
  bench)  # the default release (its cache from the ARTIFACT, checked against its install's key), then b36
    record=$(ls "$ARTIFACTS"/*.kernel-cache.json 2>/dev/null | head -n 1)
    [ -n "$record" ] && step cache-install 30 "$PY" -m toolkit.fa4 cache-install --target "$TARGET" --python "$PY" \
      --arch 90 --cache-record "$record" --dest "$STATE/cache-from-artifact"
    [ -d "$STATE/cache-from-artifact" ] && CACHE=$STATE/cache-from-artifact
    fa4_env "$TARGET" "$CACHE"
    bench "" 250
    if [ -f "$B36_TARGET/fa4-install.json" ]; then  # else fa4_env would leave the default's PYTHONPATH in place
      fa4_env "$B36_TARGET" "$B36_CACHE"
      bench -b36 230
    else
      echo "$(date -u +%H:%M:%S) bench-b36 skipped: no $B36_RELEASE install (run the b36 phase first)" | tee -a "$RESULTS/steps.txt"
    fi
    fa4_env "$TARGET" "$CACHE"
    step recommend 30 "$PY" -m toolkit recommend --bench "$RESULTS/bench/bench.json" \
      --verified "flash-attn-4=$RESULTS/verify-fa4-smoke/verify.json" --out "$RESULTS/recommendation.json"
    ;;
  dq-probe)  # the sm_90 backward's head dims the knowledge lists as wrong (bwd_sm90_padding), measured again
    fa4_env "$TARGET" "$CACHE"
    step dq-probe 300 "$PY" scripts/fa4_dq_probe.py "$RESULTS/dq-probe.json"
    ;;
  verify-full)
    fa4_env "$TARGET" "$CACHE"
    step verify-fa4-full 520 "$PY" -m toolkit verify "$LINE" --impl flash-attn-4 --python "$PY" --level full \
      --report-dir "$RESULTS/verify-fa4-full"
    ;;
  *) echo "usage: $0 deps|carry|install|b36|bench|dq-probe|verify-full"; exit 2 ;;
esac
pack
