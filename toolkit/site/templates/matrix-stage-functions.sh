# ---- How each stage runs and reports (the same in every script of a `toolkit matrix run`).
# The status file is what `toolkit matrix run` reads while it waits: one JSON object, replaced whole.
STATUS_FILE={{status_dir}}/$LINE.$PHASE.json
STARTED=$(date +%s.%N)
CURRENT_STAGE=start
JOB=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}  # an array task: <array>_<task>
JOB=${JOB:-${SLURM_JOB_ID:-local}}

write_status() {  # STATE EXIT_CODE FINISHED
    printf '{"line": "%s", "phase": "%s", "state": "%s", "stage": "%s", "exit_code": %s, "started": %s, "finished": %s, "host": "%s", "job": "%s"}\n' \
        "$LINE" "$PHASE" "$1" "$CURRENT_STAGE" "$2" "$STARTED" "$3" "$(hostname)" "$JOB" \
        >"$STATUS_FILE.tmp.$$" && mv -f "$STATUS_FILE.tmp.$$" "$STATUS_FILE"
}

stage() {  # NAME COMMAND: run one stage in its own bash; the first failure ends this job
    CURRENT_STAGE=$1
    echo "== $(date '+%F %T') $LINE $PHASE/$1: $2"
    write_status running null null
    bash -o pipefail -c "$2" 9>&-
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "== $(date '+%F %T') $LINE $PHASE/$1 failed (exit $rc)"
        write_status failed "$rc" "$(date +%s.%N)"
        exit "$rc"
    fi
}

finish() {  # STATE: done, or skipped (with the reason in CURRENT_STAGE)
    echo "== $(date '+%F %T') $LINE $PHASE: $1"
    write_status "$1" 0 "$(date +%s.%N)"
}

# One job at a time works on a line's lock, environment and wheelhouse, across runs and nodes:
# flock(1) on the line's lock file (the same flock(2) lock as toolkit.base.fslock.locked), held until exit.
LINE_LOCK={{line_locks}}/$LINE.lock
exec 9>>"$LINE_LOCK"
if ! flock -n 9; then
    echo "== $(date '+%F %T') waiting for $LINE_LOCK (another job is working on $LINE)"
    flock 9
fi
write_status running null null
