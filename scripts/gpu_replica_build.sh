#!/usr/bin/env bash
# On the lent GPU machine, lay its CUDA 13.0 (made of NVIDIA's PyPI wheels) out as
# conda-forge's packages (tests/conda_forge_replica: headers only under targets/x86_64-linux/include,
# conda-forge's patched nvcc.profile, cuda-nvcc's activate.d script), then build the real flash-attn 2.8.3.post2
# sdist with it as the toolchain (envs/gpu-replica.yaml, external: that prefix + torch 2.11.0+cu130), inside the
# environment conda-forge's activation makes (NVCC_PREPEND_FLAGS="-ccbin=$CXX"), archs 90.
#
# Exact invocation (the `run` tool, from the repo root; .cache/sdist/ holds the sdist, git-ignored):
#   run(kind="nvidia-h200", carry=[".cache/sdist", ".gpu-carry"], command="bash scripts/gpu_replica_build.sh start")
# .gpu-carry/ (git-ignored): cp -r /usr/local/cuda/dist-info .gpu-carry/cuda-dist-info; cp /usr/local/cuda/bin/nvcc.profile
#   .gpu-carry/ (on the CPU machine, whose CUDA 13.0 is NVIDIA's wheels; the GPU machine's came from the installer)
#   run(command="bash scripts/gpu_replica_build.sh wait")     # again while it prints BUILD RUNNING (no carry)
# Get the sdist here first (sha256 from PyPI's simple index page, as the lock pins it):
#   mkdir -p .cache/sdist/d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b && curl -sfLo \
#     .cache/sdist/d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b/flash_attn-2.8.3.post2.tar.gz \
#     https://files.pythonhosted.org/packages/6c/b1/b77625e3d11260d2bd6a4fc249a4be9a3da97ff848e2222e810c4f0e0211/flash_attn-2.8.3.post2.tar.gz
#
# `start` (about 9 minutes): replica prefix; (unless PROBE=0) a direct g++ compile of flash_api.cpp with torch's own include
# paths (expected: cuda_runtime.h not found) and with the toolkit's CPATH (expected: compiles); then the
# toolkit build detached, polled until ~8.5 minutes. flash_api.cpp is the first source of setup.py, so it and
# the first kernels compile in the first minutes; a whole build takes about 17 minutes on 16 cores (`wait`).
# Results under $OUT: summary.txt (what compiled, the exact g++/nvcc command lines, timing), probe.txt,
# build-log-tail.txt, objects.txt, build-record.json when it finishes. Every call stays under 9 minutes.
set -u
STATE=/tmp/fa-replica
OUT=${OUT:-$STATE/out}
LINE=gpu-replica
SHA=d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b
SDIST=flash_attn-2.8.3.post2.tar.gz
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
BUILD_ARGS=${BUILD_ARGS:---arch 90 --mem-gb 120 --keep-build-dir --install-target $STATE/site --wheelhouse $STATE/wheelhouse}
CXX_STD=${CXX_STD:-c++17}  # flash-attn 2.8.3.post2's own flag; torch 2.11's headers accept it
T0=$(date +%s)
mkdir -p "$STATE" "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOOLKIT_CACHE=$STATE/cache

cuda_root() {  # a CUDA laid out as NVIDIA's wheels lay it (what the replica reads its payload by)
    if [ -d "${CUDA_INSTALL:-/usr/local/cuda}/dist-info" ]; then echo "${CUDA_INSTALL:-/usr/local/cuda}"; return; fi
    # This machine's CUDA 13.0 came from NVIDIA's installer (targets/x86_64-linux/{include,lib}), not the
    # wheels: a view of it in the wheels' layout, with the wheels' RECORDs and bin/nvcc.profile carried from
    # the project's CPU machine (the same nvcc build, cuda_13.0.r13.0/compiler.36424714_0) in .gpu-carry/.
    local view=$STATE/cuda-view cuda=${CUDA_INSTALL:-/usr/local/cuda}
    rm -rf "$view" && mkdir -p "$view/bin"
    cp -r .gpu-carry/cuda-dist-info "$view/dist-info"
    for f in "$cuda"/bin/*; do ln -s "$f" "$view/bin/"; done
    cp --remove-destination .gpu-carry/nvcc.profile "$view/bin/nvcc.profile"
    ln -s "$cuda/targets/x86_64-linux/include" "$view/include"
    ln -s "$cuda/targets/x86_64-linux/lib" "$view/lib"
    ln -s "$cuda/nvvm" "$view/nvvm"
    echo "$view"
}

setup() {  # the replica prefix and the sdist in /tmp (a later call replaces carried folders)
    { date -u; hostname; nproc; free -g | head -2; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
      /usr/local/cuda/bin/nvcc --version | tail -2; g++ --version | head -1
      "$PYTHON" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; git log -1 --format='project %h %s'; } \
      > "$OUT/machine.txt" 2>&1
    mkdir -p "$TOOLKIT_CACHE/sdist/$SHA"
    cp -n ".cache/sdist/$SHA/$SDIST" "$TOOLKIT_CACHE/sdist/$SHA/" 2>/dev/null
    echo "$SHA  $TOOLKIT_CACHE/sdist/$SHA/$SDIST" | sha256sum -c - || { echo "no sdist: carry .cache/sdist"; exit 2; }
    site=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
    rm -rf "$STATE/prefix"
    "$PYTHON" tests/conda_forge_replica/replica.py prefix "$STATE/prefix" --cuda-root "$(cuda_root)" --nvidia-site "$site" \
        | tee "$OUT/replica.txt"
    ls "$STATE/prefix" "$STATE/prefix/targets/x86_64-linux/include" | head -20 >> "$OUT/replica.txt"
}

probe() {  # flash_api.cpp through g++: torch's include paths alone, then with the toolkit's CPATH
    mkdir -p "$STATE/src" && tar xzf "$TOOLKIT_CACHE/sdist/$SHA/$SDIST" -C "$STATE/src"
    src=$(echo "$STATE"/src/flash_attn-2.8.3.post2)
    flags=$("$PYTHON" - "$STATE/prefix" "$src" <<'EOF'
import os, sys, sysconfig
os.environ["CUDA_HOME"] = sys.argv[1]
from torch.utils import cpp_extension
src = sys.argv[2]
paths = cpp_extension.include_paths(device_type="cuda") if "device_type" in cpp_extension.include_paths.__code__.co_varnames \
    else cpp_extension.include_paths(cuda=True)
paths += [f"{src}/csrc/flash_attn", f"{src}/csrc/flash_attn/src", f"{src}/csrc/cutlass/include", sysconfig.get_paths()["include"]]
print(" ".join(f"-I{p}" for p in paths))
EOF
)
    cpath=$(PYTHONPATH=$PWD "$PYTHON" -c "from pathlib import Path; from toolkit.machine.line_env import include_environment; print(include_environment(Path('$STATE/prefix'))['CPATH'])")
    cmd="g++ -std=$CXX_STD -O0 -fsyntax-only -D_GLIBCXX_USE_CXX11_ABI=1 -DTORCH_EXTENSION_NAME=flash_attn_2_cuda $flags $src/csrc/flash_attn/flash_api.cpp"
    { echo "\$ $cmd"; timeout 240 $cmd 2>&1 | grep -m3 -E "error|fatal"; echo "rc=${PIPESTATUS[0]} (torch's include paths only)"
      echo; echo "\$ CPATH=$cpath $cmd"; CPATH=$cpath timeout 240 $cmd 2>&1 | grep -m3 -E "error|fatal"
      echo "rc=${PIPESTATUS[0]} (with the toolkit's CPATH)"; } > "$OUT/probe.txt" 2>&1
    cat "$OUT/probe.txt"
}

start_build() {  # conda-forge's activation (gxx_linux-64 sets CXX/CC; cuda-nvcc adds -ccbin=$CXX), then the toolkit
    export CONDA_PREFIX=$STATE/prefix CXX=$(command -v g++) CC=$(command -v gcc)
    set +u  # conda-forge's script reads unset CFLAGS/CPPFLAGS/NVCC_* as empty
    # shellcheck disable=SC1090
    source "$STATE/prefix/etc/conda/activate.d/~cuda-nvcc_activate.sh" || echo "activate.sh failed" >> "$OUT/activated-env.txt"
    set -u
    env | grep -E '^(NVCC_PREPEND_FLAGS|NVCC_APPEND_FLAGS|CXX|CC|CXXFLAGS)=' >> "$OUT/activated-env.txt"
    date -u +%s > "$STATE/build.started"
    setsid nohup bash -c "'$PYTHON' -m toolkit build $LINE $BUILD_ARGS > $STATE/build.log 2>&1; echo \$? > $STATE/build.rc" \
        >/dev/null 2>&1 < /dev/null &
}

report() {  # what compiled so far, the exact command lines, timing
    build_dir=$(ls -d "$TOOLKIT_CACHE"/build/$LINE-* 2>/dev/null | tail -1)
    find "${build_dir:-/nonexistent}" -name '*.o' -printf '%TT %s %P\n' 2>/dev/null | sort > "$OUT/objects.txt"
    ninja_file=$(find "${build_dir:-/nonexistent}" -name build.ninja 2>/dev/null | head -1)
    [ -n "$ninja_file" ] && cp "$ninja_file" "$OUT/build.ninja"
    tail -c 6000 "$STATE/build.log" > "$OUT/build-log-tail.txt" 2>/dev/null
    {
        echo "date: $(date -u)   build started: $(date -u -d @"$(cat "$STATE/build.started" 2>/dev/null || echo 0)")"
        echo "elapsed since build start: $(( $(date +%s) - $(cat "$STATE/build.started" 2>/dev/null || date +%s) )) s"
        echo "progress: $(grep -aoE '\[[0-9]+/[0-9]+\]' "$STATE/build.log" | tail -1)"
        echo "objects compiled: $(wc -l < "$OUT/objects.txt") (flash_api: $(grep -c flash_api "$OUT/objects.txt"))"
        echo "--- the g++ command line of flash_api.cpp (ninja -v):"
        grep -a -E '(g|c)\+\+ .*flash_api\.cpp' "$STATE/build.log" | head -1 | cut -c1-6000
        echo "--- the nvcc command line of the first kernel (ninja -v):"
        grep -a -E 'bin/nvcc .*\.cu( |$)' "$STATE/build.log" | head -1 | cut -c1-6000
        echo "--- errors:"
        grep -a -m5 -E '^error:|fatal error|error:' "$STATE/build.log" | cut -c1-600
        rec=$(ls -t "$STATE"/wheelhouse/$LINE/*.build.json 2>/dev/null | head -1)
        if [ -n "$rec" ]; then
            cp "$rec" "$OUT/build-record.json"
            echo "--- from the build record:"
            "$PYTHON" -c 'import json, sys; r = json.load(open(sys.argv[1])); o = r["outputs"]
print("CPATH", r["environment"].get("CPATH")); print("neutralised", r.get("neutralised_environment"))
print("wheel", o["wheel"], o["wheel_sha256"], "archs", o["archs_compiled"]); print("wall_s", o["wall_s"], "objects", len(o["objects"]))' "$rec"
        fi
        [ -f "$STATE/build.rc" ] && echo "BUILD FINISHED rc=$(cat "$STATE/build.rc")" || echo "BUILD RUNNING"
    } > "$OUT/summary.txt"
    cat "$OUT/summary.txt"
}

wait_for_build() {  # poll until the build ends or this call's 9 minutes are nearly used
    local deadline=$(( T0 + ${1:-510} ))
    while [ ! -f "$STATE/build.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 10; done
    report
}

case "${1:-}" in
    start) setup; [ "${PROBE:-1}" = 0 ] || probe; start_build; sleep 5; wait_for_build "${WAIT_S:-500}" ;;
    wait) wait_for_build "${WAIT_S:-520}" ;;
    probe) setup; probe ;;  # the include-path proof alone (about a minute)
    build) start_build; sleep 5; wait_for_build "${WAIT_S:-500}" ;;  # the build alone, on a laid-out prefix
    *) echo "usage: $0 start|wait|probe|build"; exit 2 ;;
esac
