#!/usr/bin/env bash
# One hold of the lent H200 for the binary cache (issue 35 item 6): "built once, installed everywhere" on real parts.
# Detached, in one pipeline: envs/gpu-machine-fa3.yaml's FA3 compiled by `toolkit build` from the pinned archives
# (wheelhouse A), its smoke verification (the report `toolkit publish` puts beside the wheel), `toolkit publish` into
# an index served on 127.0.0.1; a second build of the same line (wheelhouse B, a TOOLKIT_CACHE without the archives,
# so a miss fails in seconds instead of compiling) with `--cache URL` that must substitute; `toolkit export --for pip`
# installed by pip, hash-checked, into a fresh folder; FA3's smoke verification from that folder alone (not the
# build's install target) and `toolkit doctor --cache URL` naming the published build; summary.json of both.
# ORDER_FROM (default: the 2026-12-02 H200 build record) starts the objects longest first.
#
# Prepared here (git-ignored folders):
#   .cache/flash-attn-3/<commit>/: the two archives (docs/fa3.md, "Building it on the GPU machine" step 1)
#   .whl/: cp312 manylinux wheels of the toolkit dependencies the machine lacks (docs/gpu-machine.md): zstandard,
#     pydantic (+ pydantic-core, annotated-types, typing-inspection, typing-extensions), py-rattler 0.28.0,
#     in-toto-attestation (+ protobuf; `toolkit publish` writes the provenance statement with it):
#     pip download --only-binary :all: --python-version 3.12 --implementation cp --abi cp312
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl
#       zstandard 'pydantic>=2.5' py-rattler==0.28.0 'in-toto-attestation>=0.9.3'
# Then, each call at once after the last (the machine goes back 30 s after a call; check each reply's "warm"):
#   run(kind="nvidia-h200", carry=[".whl", ".cache/flash-attn-3"], command="bash scripts/gpu_cache.sh start")
#   run(command="WAIT_S=560 bash scripts/gpu_cache.sh wait")        # again while it says PIPELINE RUNNING
# `after` runs steps 2-6 again on the warm machine without compiling (after a fix of a later step).
# Results under $OUT: results.tgz (steps.txt, step logs, both build records, verify reports, requirements file,
# doctor.json, summary.json), steps.txt and summary.json. `check` needs no GPU (runs here too).
set -u
LINE=gpu-machine-fa3
FOLDER=$LINE+fa3               # the wheelhouse folder of a line's FA3 (base.workspace.wheel_folders)
STATE=${STATE:-/tmp/cache-hold}
OUT=${OUT:-$STATE/out}
RESULTS=$STATE/results
WHEELHOUSE_A=$STATE/wheelhouse-a
WHEELHOUSE_B=$STATE/wheelhouse-b
INDEX=$STATE/index             # `toolkit publish --to`
FRESH=$STATE/fresh             # what pip installed from the index, alone
PY=${PY:-/opt/torch/.venv/bin/python3}
ORDER_FROM=${ORDER_FROM-docs/results/2026-12-02-h200-fa3/build-record.json}
T0=$(date +%s)
mkdir -p "$OUT" "$RESULTS"
export PYTHONUNBUFFERED=1

# shellcheck source=scripts/gpu_steps.sh
source scripts/gpu_steps.sh  # step, report, wait_until, fresh

build_pipeline() {  # step 1: the compile (the machine's CPUs), then the rest
  export PYTHONPATH=$PWD TOOLKIT_CACHE=$STATE/cache
  step build-a 1500 "$PY" -m toolkit build "$LINE" --arch 90 --mem-gb 110 --install-target "$STATE/fa3-site-a" \
    --wheelhouse "$WHEELHOUSE_A" ${ORDER_FROM:+--order-from "$ORDER_FROM"}
  after_build
}

serve() {  # serve the index on a free loopback port; URL and the server's pid into $STATE
  local port
  port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  setsid "$PY" -m http.server --bind 127.0.0.1 --directory "$INDEX" "$port" > "$RESULTS/http.log" 2>&1 < /dev/null &
  echo $! > "$STATE/http.pid"
  URL=http://127.0.0.1:$port/
  for _ in $(seq 50); do
    "$PY" -c "import urllib.request; urllib.request.urlopen('${URL}simple/', timeout=2)" 2>/dev/null && break
    sleep 0.2
  done
  echo "$(date -u +%H:%M:%S) serving $INDEX at $URL" | tee -a "$RESULTS/steps.txt"
}

after_build() {  # steps 2-6, from wheelhouse A as the build left it
  export PYTHONPATH=$STATE/fa3-site-a:$PWD TOOLKIT_CACHE=$STATE/cache
  cp "$WHEELHOUSE_A/$FOLDER"/*.build.json "$RESULTS/record-a.json" 2>/dev/null
  rm -rf "reports/$LINE/flash-attn-3" "$INDEX" "$WHEELHOUSE_B" "$STATE/cache-b" "$FRESH"
  # 2. the report goes where publish takes it from (reports/<line>/flash-attn-3/ of the workspace)
  step verify-a 300 "$PY" -m toolkit verify "$LINE" --impl flash-attn-3 --level smoke
  cp -r "reports/$LINE/flash-attn-3" "$RESULTS/verify-a" 2>/dev/null
  # 3. publish, serve
  export PYTHONPATH=$PWD
  step publish 180 "$PY" -m toolkit publish "$LINE" --to "$INDEX" --wheelhouse "$WHEELHOUSE_A"
  (cd "$INDEX" && find . -type f | sort) > "$RESULTS/index-files.txt" 2>/dev/null
  serve
  # 4. the same line again, from the cache: no archives in its TOOLKIT_CACHE, so a miss cannot compile for long
  TOOLKIT_CACHE=$STATE/cache-b step build-b 300 "$PY" -m toolkit build "$LINE" --arch 90 --mem-gb 110 \
    --install-target "$STATE/fa3-site-b" --wheelhouse "$WHEELHOUSE_B" --cache "$URL"
  cp "$WHEELHOUSE_B/$FOLDER"/*.build.json "$RESULTS/record-b.json" 2>/dev/null
  # 5. what a user does: export, pip install (hash-checked; torch is the machine's), verify and doctor from there
  step export 60 bash -c 'out=$1; shift; "$@" > "$out"' _ "$RESULTS/requirements.txt" \
    "$PY" -m toolkit export "$LINE" --index "$URL" --for pip
  cat "$RESULTS/requirements.txt"
  step pip-fresh 240 "$PY" -m pip install --no-deps --require-hashes --target "$FRESH" --index-url "${URL}simple" \
    --retries 0 --timeout 10 -r "$RESULTS/requirements.txt"
  export PYTHONPATH=$FRESH:$PWD  # the fresh folder alone: neither install target is on the path
  step verify-fresh 300 "$PY" -m toolkit verify "$LINE" --impl flash-attn-3 --level smoke \
    --report-dir "$RESULTS/verify-fresh"
  TOOLKIT_CACHE=$STATE/cache-b step doctor 180 bash -c 'out=$1; shift; "$@" > "$out"' _ "$RESULTS/doctor.json" \
    "$PY" -m toolkit doctor "$LINE" --python "$PY" --cache "$URL" --json
  TOOLKIT_CACHE=$STATE/cache-b TAIL=40 step doctor-table 180 "$PY" -m toolkit doctor "$LINE" --python "$PY" --cache "$URL"
  kill "$(cat "$STATE/http.pid")" 2>/dev/null
  # 6. the summary
  TAIL=60 step summary 60 "$PY" - "$RESULTS" "$WHEELHOUSE_A/$FOLDER" "$WHEELHOUSE_B/$FOLDER" "$FRESH" <<'EOF'
import hashlib, json, pathlib, re, sys
results, folder_a, folder_b, fresh = map(pathlib.Path, sys.argv[1:])
def load(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
def wheels(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.whl"))}
steps = {}
for line in (results / "steps.txt").read_text().splitlines():
    found = re.match(r"\S+ (\S+) rc=(\d+) (\d+)s$", line)
    if found:
        steps[found[1]] = {"rc": int(found[2]), "s": int(found[3])}
def verdict(name):
    report = load(results / name / "verify.json") or {}
    return {"summary": report.get("summary"), "flash_attn": report.get("flash_attn")}
record_a, record_b = load(results / "record-a.json") or {}, load(results / "record-b.json") or {}
doctor = load(results / "doctor.json") or {}
build_b_log = (results / "build-b.log").read_text(errors="replace") if (results / "build-b.log").exists() else ""
a, b = wheels(folder_a), wheels(folder_b)
summary = {
    "steps": steps,
    "wheelhouse_a": a, "wheelhouse_b": b, "same_wheel": bool(a) and a == b,
    "record_a": {k: record_a.get(k) for k in ("inputs_key", "status", "started", "finished")}
                | {"wall_s": (record_a.get("outputs") or {}).get("wall_s")},
    "record_b": {"inputs_key": record_b.get("inputs_key"), "substituted_from": record_b.get("substituted_from")},
    "build_b_said": [l for l in build_b_log.splitlines() if re.search(r"substituted|published build|cached:|refused", l)],
    "build_b_compiled": any((folder_b / "logs").glob("build-*.log")),
    "fresh_files": sorted(p.name for p in fresh.iterdir()) if fresh.is_dir() else [],
    "verify_a": verdict("verify-a"), "verify_fresh": verdict("verify-fresh"),
    "doctor_ok": doctor.get("ok"),
    "doctor_published_rows": [r for r in doctor.get("rows", []) if "published" in json.dumps(r)],
}
(results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
EOF
  echo done > "$STATE/pipeline.done"
}

detach() {  # detach FUNCTION: run it in a session of its own (it outlives this call)
  export -f build_pipeline after_build serve step
  export STATE RESULTS LINE FOLDER WHEELHOUSE_A WHEELHOUSE_B INDEX FRESH PY ORDER_FROM
  setsid nohup bash -c "echo \$\$ > '$STATE/pipeline.sid'; $1" > "$STATE/$1.log" 2>&1 < /dev/null &
}

collect() {  # what the pipeline has written so far, into $OUT as few files (a call brings back at most 8, and no
  # name with a '+'; a call cut short still returns them)
  tar czf "$OUT/results.tgz" -C "$RESULTS" . 2>/dev/null
  cp "$RESULTS/steps.txt" "$RESULTS/summary.json" "$OUT/" 2>/dev/null
}

stop_previous() {  # a start (or after) before this one: its session and its server
  [ -f "$STATE/pipeline.sid" ] && pkill -TERM -s "$(cat "$STATE/pipeline.sid")"
  [ -f "$STATE/http.pid" ] && kill "$(cat "$STATE/http.pid")" 2>/dev/null
  rm -f "$STATE/pipeline.sid" "$STATE/http.pid" "$STATE/pipeline.done"
}

case "${1:-}" in
  check)  # no GPU needed: the line, the archives, and the carried wheels as a cp312 closure
    "$PY" -m toolkit check "$LINE" || exit 1
    ls -l .cache/flash-attn-3/*/ 2>/dev/null || echo "missing: .cache/flash-attn-3/<commit>/ (docs/fa3.md)"
    for d in .whl .cache/flash-attn-3; do
      [ -d "$d" ] && echo "$d: $(du -sm "$d" | cut -f1) MiB (carry limit 64 per call, all paths together)" \
        || echo "missing: $d"
    done
    [ -z "$ORDER_FROM" ] || [ -f "$ORDER_FROM" ] || echo "missing: ORDER_FROM $ORDER_FROM"
    if command -v uv > /dev/null; then  # resolves for the machine's python from .whl alone
      printf 'zstandard\npydantic>=2.5\npy-rattler==0.28.0\nin-toto-attestation>=0.9.3\n' \
        | uv pip compile -q --no-index --find-links .whl --python-version 3.12 \
            --python-platform x86_64-manylinux_2_28 --only-binary :all: --no-header - \
        && echo ".whl: a complete cp312 closure of the toolkit dependencies the machine lacks"
    fi
    ;;
  start)
    "$PY" -m pip install -q --no-index --find-links .whl zstandard pydantic py-rattler in-toto-attestation 2>&1 | tail -2
    "$PY" -c "import pydantic, zstandard, rattler, in_toto_attestation, google.protobuf; print('toolkit deps ok')" \
      || exit 1
    stop_previous
    rm -rf "$RESULTS" "$STATE/cache" && mkdir -p "$RESULTS" "$STATE/cache"
    cp -r .cache/flash-attn-3 "$STATE/cache/"  # TOOLKIT_CACHE of build A: the archives (build B has none)
    { date -u; nproc; free -g | head -2; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
      git log -1 --format='project %h %s' 2>/dev/null; } > "$RESULTS/machine.txt" 2>&1
    detach build_pipeline
    date -u +%s > "$STATE/pipeline.started"
    sleep 25
    report
    ;;
  after)  # steps 2-6 again from wheelhouse A (no compile), in the foreground of this call
    [ -d "$WHEELHOUSE_A/$FOLDER" ] || { echo "no build in $WHEELHOUSE_A/$FOLDER (start first)"; exit 3; }
    stop_previous
    mkdir -p "$RESULTS" && echo "$(date -u +%H:%M:%S) after: steps 2-6 again" >> "$RESULTS/steps.txt"
    date -u +%s > "$STATE/pipeline.started"
    detach after_build
    wait_until "${WAIT_S:-540}" ;;
  wait)
    fresh
    wait_until "${WAIT_S:-540}" ;;
  *) echo "usage: $0 check|start|wait|after"; exit 2 ;;
esac
