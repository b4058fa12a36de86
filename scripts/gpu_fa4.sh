#!/usr/bin/env bash
# FlashAttention-4 on the lent H200: install through the toolkit from carried wheels, warm
# the kernel cache, time first calls cold vs warm (fresh processes), verify, bench beside FA2/SDPA,
# recommend. The machine has no network: run scripts/fetch_fa4_wheels.sh here first (it fills
# .whl-fa4/part1 and .whl-fa4/part2, each < 60 MiB). Phases, each under 9 minutes, on ONE warm machine:
#
#   run(command="bash scripts/gpu_fa4.sh carry1", carry=[".whl-fa4/part1"])   # ~10 s: copy part1 to /tmp
#   run(command="bash scripts/gpu_fa4.sh carry2", carry=[".whl-fa4/part2"])   # ~5-8 min: join, install, warm, latency, verify smoke, parity
#   run(command="bash scripts/gpu_fa4.sh bench")                              # ~4-6 min: bench + recommend
#   run(command="bash scripts/gpu_fa4.sh verify-full")                        # optional, ~9 min: FA4 full level
#
# Every phase writes under $OUT: steps.txt (each step's rc and seconds), the logs, the JSON reports and
# fa4-results.tgz. A failing step is logged and the next steps still run.
set -u
STATE=/tmp/fa4-session
OUT=${OUT:-$STATE/out}
RESULTS=$STATE/results
WHEELS=$STATE/wheels
TARGET=$STATE/site
CACHE=$STATE/kernel-cache
ARTIFACTS=$STATE/fa4-artifacts  # warm's cache artifact and its .kernel-cache.json record
LINE=${LINE:-gpu-machine-fa4}  # envs/gpu-machine-fa4.yaml: the image + FA4 instead of FA2
PY=$(command -v python3)
mkdir -p "$OUT" "$RESULTS" "$WHEELS"
export PYTHONUNBUFFERED=1

# shellcheck source=scripts/gpu_steps.sh
source scripts/gpu_steps.sh  # step, fa4_env

pack() {  # the reports (small) straight into $OUT, everything else in one archive
  cp "$RESULTS"/steps.txt "$OUT"/ 2>/dev/null
  (cd "$RESULTS" && find . -maxdepth 2 \( -name '*.json' -o -name '*.png' -o -name '*.xml' \) -size -15M \
    -exec cp --parents {} "$OUT"/ \;) 2>/dev/null
  tar czf "$OUT/fa4-results.tgz" -C "$STATE" results $(cd "$STATE" && ls -d fa4-artifacts/*.kernel-cache.json 2>/dev/null)
  for artifact in "$ARTIFACTS"/*.tar.gz; do  # the warmed cache comes back if it fits one file
    [ -f "$artifact" ] && [ "$(stat -c %s "$artifact")" -lt 15000000 ] && cp "$artifact" "$OUT"/
  done
  ls -la "$OUT"
}

case "${1:-}" in
  carry1)
    cp -r .whl-fa4/part1 "$WHEELS"/ && echo "part1: $(ls "$WHEELS/part1" | wc -l) files"
    { date -u; nvidia-smi; nproc; free -g; "$PY" -c 'import torch, sys; print(sys.version, torch.__version__, torch.version.cuda)'
      "$PY" -m pip list 2>/dev/null | grep -iE 'cuda|torch|triton|einops|protobuf|typing|packaging|yaml|rich'; } \
      > "$RESULTS/machine.txt" 2>&1
    tail -n 25 "$RESULTS/machine.txt"
    ;;
  carry2)
    cp -r .whl-fa4/part2 "$WHEELS"/ && echo "part2: $(ls "$WHEELS/part2" | wc -l) files"
    step join 120 "$PY" -m toolkit.fa4 join --dest "$WHEELS/all" "$WHEELS/part1" "$WHEELS/part2"
    step install 240 "$PY" -m toolkit.fa4 install --lock "locks/$LINE.fa4-lock.json" --wheels "$WHEELS/all" \
      --target "$TARGET" --python "$PY"
    step warm 320 "$PY" -m toolkit.fa4 warm --target "$TARGET" --python "$PY" --cache-dir "$CACHE" --artifacts "$ARTIFACTS" \
      --arch 90 --report "$RESULTS/latency.json" --budget-s 200 --jobs 4
    fa4_env "$TARGET" "$CACHE"
    step verify-fa4-smoke 150 "$PY" -m toolkit verify "$LINE" --impl flash-attn-4 --python "$PY" --level smoke \
      --report-dir "$RESULTS/verify-fa4-smoke"
    step parity-fa4 90 "$PY" -m toolkit verify "$LINE" --impl flash-attn-4 --python "$PY" --level parity \
      --report-dir "$RESULTS/parity-fa4"
    ;;
  bench)
    # the env uses the ARTIFACT: unpacked into a fresh folder, checked against this install's key
    record=$(ls "$ARTIFACTS"/*.kernel-cache.json 2>/dev/null | head -n 1)
    [ -n "$record" ] && step cache-install 60 "$PY" -m toolkit.fa4 cache-install --target "$TARGET" --python "$PY" --arch 90 \
      --cache-record "$record" --dest "$STATE/cache-from-artifact"
    [ -d "$STATE/cache-from-artifact" ] && CACHE=$STATE/cache-from-artifact
    fa4_env "$TARGET" "$CACHE"
    began=$(date +%s)
    step bench 360 "$PY" -m toolkit bench "$LINE" --report-dir "$RESULTS/bench" --head-dims 64,128
    # the verb checks the line's spec first; if that refused quickly, measure without it (no peak/targets/plot)
    if [ ! -f "$RESULTS/bench/bench.json" ] && [ $(( $(date +%s) - began )) -lt 60 ]; then
      step bench-measure-only 400 "$PY" -m toolkit.verify.bench "$LINE" --report-dir "$RESULTS/bench" --head-dims 64,128
    fi
    step recommend 60 "$PY" -m toolkit recommend --bench "$RESULTS/bench/bench.json" \
      --verified "fa4=$RESULTS/verify-fa4-smoke/verify.json" --out "$RESULTS/recommendation.json"
    ;;
  verify-full)
    fa4_env "$TARGET" "$CACHE"
    step verify-fa4-full 520 "$PY" -m toolkit verify "$LINE" --impl flash-attn-4 --python "$PY" --level full \
      --report-dir "$RESULTS/verify-fa4-full"
    ;;
  *) echo "usage: $0 carry1|carry2|bench|verify-full"; exit 2 ;;
esac
pack
