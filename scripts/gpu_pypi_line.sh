#!/usr/bin/env bash
# One hold of the lent H200 for a PyPI line's whole flash-attn build (envs/py-cu130-torch211.yaml): the locked
# nvcc, crt, nvvm and cccl wheels carried in three parts, `toolkit install --torch-from` taking the machine's own
# torch 2.11.0+cu130 and its CUDA wheels (same versions as the lock's: docs/results/2026-12-02-h200-pypi-line/
# machine-pip-list.txt) in place of the multi-GB wheels the machine cannot fetch, then `toolkit build` with no
# --order-from (a first build of this line), the import, `toolkit verify --level smoke`, `toolkit build-report`.
#
# Prepared here (git-ignored folders):
#   python scripts/fetch_pypi_line_wheels.py py-cu130-torch211 .gpu-pyline --machine docs/results/2026-12-02-h200-pypi-line/machine-pip-list.txt
#   .whl/: zstandard, pydantic, pydantic-core, annotated-types, typing-inspection for cp312 (the machine lacks them)
#   .cache/sdist/<sha256>/flash_attn-2.8.3.post2.tar.gz (the lock's pin; see scripts/gpu_replica_build.sh)
# Then, each call at once after the last (the machine goes back 30 s after a call):
#   run(kind="nvidia-h200", carry=[".whl", ".cache/sdist", ".gpu-pyline/part1"], command="bash scripts/gpu_pypi_line.sh carry1")
#   run(carry=[".gpu-pyline/part2"], command="bash scripts/gpu_pypi_line.sh carry2")
#   run(carry=[".gpu-pyline/part3"], command="bash scripts/gpu_pypi_line.sh start")   # joins, starts the pipeline
#   run(command="bash scripts/gpu_pypi_line.sh wait")                                # again while it says RUNNING
# Results under $OUT (steps.txt, step logs, build record, verify report); each call stays under 9.5 minutes.
set -u
LINE=py-cu130-torch211
STATE=/tmp/pyline
OUT=${OUT:-$STATE/out}
RESULTS=$STATE/results
PY=/opt/torch/.venv/bin/python3  # the machine's torch: --torch-from, and the toolkit's own interpreter
ENV=$STATE/env
SITE=$ENV/lib/python3.12/site-packages
T0=$(date +%s)
mkdir -p "$OUT" "$RESULTS" "$STATE/parts"
export PYTHONUNBUFFERED=1

# shellcheck source=scripts/gpu_steps.sh
source scripts/gpu_steps.sh  # step

pipeline() {
  export PYTHONPATH=$PWD TOOLKIT_CACHE=$STATE/cache
  { date -u; nproc; free -g | head -2; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    g++ --version | head -1; "$PY" -c 'import torch; print("machine torch", torch.__version__, torch.version.cuda)'
    git log -1 --format='project %h %s' 2>/dev/null; } > "$RESULTS/machine.txt" 2>&1
  step install 600 "$PY" -m toolkit install "$LINE" --prefix "$ENV" --python /usr/bin/python3.12 --torch-from "$PY" \
    --wheels "$STATE/wheels"
  cp "$ENV/etc/fa-envkit/lock.json" "$RESULTS/install-record.json" 2>/dev/null
  step nvcc 60 "$SITE/nvidia/cu13/bin/nvcc" --version
  step build 1500 "$PY" -m toolkit build "$LINE" --prefix "$ENV" --arch 90 --mem-gb 110 --keep-build-dir \
    --wheelhouse "$STATE/wheelhouse"
  cp "$STATE"/wheelhouse/"$LINE"/*.json "$RESULTS/" 2>/dev/null
  step import 120 "$ENV/bin/python" -c "import torch, flash_attn, flash_attn_2_cuda; print(torch.__version__, \
torch.__file__, flash_attn.__version__, flash_attn_2_cuda.__file__)"
  # The venv holds the line's packages only; the toolkit's own (yaml, rich, pydantic) come from the machine's
  # python, the venv's site-packages first on the path (torch, flash-attn).
  PYTHONPATH=$SITE:$PWD step verify-smoke 300 "$PY" -m toolkit verify "$LINE" --python "$PY" --level smoke \
    --report-dir "$RESULTS/verify-smoke" --wheelhouse "$STATE/wheelhouse"
  step build-report 60 "$PY" -m toolkit build-report "$LINE" --wheelhouse "$STATE/wheelhouse"
  echo done > "$STATE/pipeline.done"
}

collect() {  # what the pipeline has written so far, into $OUT (a call cut short still returns it)
  (cd "$RESULTS" && find . \( -name '*.json' -o -name '*.xml' -o -name '*.txt' -o -name '*.log' \) -size -15M \
    -exec cp --parents {} "$OUT"/ \;) 2>/dev/null
}

report() {
  collect
  tail -n 20 "$RESULTS/steps.txt" 2>/dev/null
  tail -n 3 "$RESULTS/build.log" 2>/dev/null
  [ -f "$STATE/pipeline.done" ] && echo "PIPELINE DONE" || echo "PIPELINE RUNNING"
}

fresh_check() {
  [ -f "$STATE/carry1.done" ] || { echo "FRESH MACHINE: the earlier calls' state went with the machine; carry1 again"; exit 3; }
}

case "${1:-}" in
  carry1)
    "$PY" -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -2
    "$PY" -c "import pydantic, zstandard; print('toolkit deps ok')"
    S=d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b
    mkdir -p "$STATE/cache/sdist/$S" && cp .cache/sdist/$S/*.tar.gz "$STATE/cache/sdist/$S/"
    cp .gpu-pyline/part1/* "$STATE/parts/" && touch "$STATE/carry1.done"
    ls -la "$STATE/parts" ;;
  carry2)
    fresh_check
    cp .gpu-pyline/part2/* "$STATE/parts/" && ls -la "$STATE/parts" ;;
  start)
    fresh_check
    cp .gpu-pyline/part3/* "$STATE/parts/"
    rm -rf "$STATE/wheels" && mkdir -p "$STATE/wheels"
    cat "$STATE"/parts/wheels.tar.* | tar x -C "$STATE/wheels" && ls "$STATE/wheels"
    export -f pipeline step
    export LINE STATE RESULTS PY ENV SITE
    setsid nohup bash -c pipeline > "$STATE/pipeline.log" 2>&1 < /dev/null &
    sleep 60
    while [ ! -f "$STATE/pipeline.done" ] && [ "$(date +%s)" -lt $(( T0 + 520 )) ]; do sleep 15; collect; done
    report ;;
  wait)
    fresh_check
    while [ ! -f "$STATE/pipeline.done" ] && [ "$(date +%s)" -lt $(( T0 + ${WAIT_S:-540} )) ]; do sleep 15; collect; done
    report ;;
  *) echo "usage: $0 carry1|carry2|start|wait"; exit 2 ;;
esac
