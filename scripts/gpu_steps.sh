# Shell functions the GPU-machine scripts share (sourced by scripts/gpu_fa4.sh and scripts/gpu_hold.sh).
# Callers set RESULTS (the folder for step logs and steps.txt) and PY (the python that runs the toolkit).

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $RESULTS/NAME.log, never abort
  local name=$1 limit=$2 begin rc
  shift 2
  begin=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  rc=$?
  echo "$(date -u +%H:%M:%S) $name rc=$rc $(( $(date +%s) - begin ))s" | tee -a "$RESULTS/steps.txt"
  tail -n "${TAIL:-12}" "$RESULTS/$name.log"
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
