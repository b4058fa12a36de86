# Shell functions the GPU-machine scripts share (sourced by scripts/gpu_fa4.sh, gpu_hold.sh, gpu_fa3.sh, gpu_cache.sh).
# Callers set RESULTS (the folder for step logs and steps.txt) and PY (the python that runs the toolkit); the
# detached-pipeline ones (report, wait_until, fresh) also STATE, T0 and a `collect` of their own.

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $RESULTS/NAME.log, never abort
  local name=$1 limit=$2 begin rc
  shift 2
  begin=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  rc=$?
  echo "$(date -u +%H:%M:%S) $name rc=$rc $(( $(date +%s) - begin ))s" | tee -a "$RESULTS/steps.txt"
  tail -n "${TAIL:-12}" "$RESULTS/$name.log"
}

fa4_carry_parts() {  # fa4_carry_parts WHEELS: copy each .whl-fa4/partN folder present into WHEELS, where the
  # install phase joins them (each part is one `run` carry of its own: 64 MiB a call, the working tree included)
  local part found=
  for part in .whl-fa4/part[0-9]*; do
    [ -d "$part" ] || continue
    rm -rf "${1:?}/${part##*/}" && cp -r "$part" "$1"/ && found=1
    echo "${part##*/}: $(ls "$1/${part##*/}" | wc -l) files"
  done
  [ -n "$found" ] || echo "no .whl-fa4/partN folder here: carry one, e.g. carry=[\".whl-fa4/part1\"]"
  echo "carried so far: $(cd "$1" && ls -d part[0-9]* 2>/dev/null | tr '\n' ' ')"
}

fa4_env() {  # fa4_env TARGET CACHE: export what an FA4 install and its kernel cache need. The toolkit prints
  # NAME=VALUE lines; they are read as data (only these names, never eval'd)
  local name value
  while IFS='=' read -r name value; do
    case "$name" in
      PYTHONPATH) export PYTHONPATH="$PWD:$value" ;;
      FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED|FLASH_ATTENTION_CUTE_DSL_CACHE_DIR|CUTE_DSL_CACHE_DIR) export "$name=$value" ;;
    esac
  done < <("$PY" -m toolkit.fa4 env --target "$1" --cache-dir "$2")
}

report() {
  collect
  tail -n 20 "$RESULTS/steps.txt" 2>/dev/null
  [ -f "$STATE/pipeline.done" ] && echo "PIPELINE DONE" || echo "PIPELINE RUNNING"
}

wait_until() {  # poll until the pipeline ends or this call's time is nearly used
  local last=0
  while [ ! -f "$STATE/pipeline.done" ] && [ "$(date +%s)" -lt $(( T0 + ${1:-540} )) ]; do
    sleep 10
    [ $(( $(date +%s) - last )) -ge 60 ] && { collect; last=$(date +%s); }
  done
  report
}

fresh() {  # a call after the machine was given back finds none of the pipeline's state
  [ -f "$STATE/pipeline.started" ] && return 0
  echo "FRESH MACHINE: no pipeline here (its state went with the machine that was given back); start again"
  exit 3
}
