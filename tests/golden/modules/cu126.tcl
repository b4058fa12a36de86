#%Module1.0
# flash-attn/2.8.3.post2-cu126-torch2.9-py312: Tcl modulefile (Environment Modules) written by fa-envkit (`toolkit modules`) from /PROJECT/envs/cu126.yaml.
# Generated: edit the spec or the template (toolkit/site/templates/modulefile.tcl) and regenerate.

module-whatis "Name: flash-attn"
module-whatis "Version: 2.8.3.post2-cu126-torch2.9-py312"
module-whatis "Description: FlashAttention 2.8.3.post2+cu126torch2.9 for CUDA 12.6 (cu126), torch 2.9.1, python 3.12"
module-whatis "URL: https://github.com/Dao-AILab/flash-attention"

proc ModulesHelp {} {
    puts stderr "flash-attn/2.8.3.post2-cu126-torch2.9-py312: FlashAttention (flash-attn 2.8.3.post2+cu126torch2.9) from line cu126."
    puts stderr "CUDA 12.6 line"
    puts stderr ""
    puts stderr "Inside:"
    puts stderr "  flash-attn  2.8.3.post2+cu126torch2.9"
    puts stderr "  torch       2.9.1"
    puts stderr "  CUDA        12.6.85"
    puts stderr "  python      3.12.8"
    puts stderr ""
    puts stderr "Environment:  /PROJECT/.envs/cu126 (conda prefix installed from the lock)"
    puts stderr "Installed in: /PROJECT/.envs/cu126/lib/python3.12/site-packages"
    puts stderr "Spec:         /PROJECT/envs/cu126.yaml"
    puts stderr "              input sha256 <cu126.yaml input sha256>"
    puts stderr "Lock:         /PROJECT/locks/cu126.conda-lock.yml"
    puts stderr "              input sha256 cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
    puts stderr "              flash-attn sdist flash_attn-2.8.3.post2.tar.gz sha256 efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef"
    puts stderr "Build:        /PROJECT/wheelhouse/cu126/flash_attn-2.8.3.post2+cu126torch2.9-cp312-cp312-linux_x86_64.whl.build.json"
    puts stderr "              wheel flash_attn-2.8.3.post2+cu126torch2.9-cp312-cp312-linux_x86_64.whl"
    puts stderr "              wheel sha256 1212121212121212121212121212121212121212121212121212121212121212"
    puts stderr "              sdist sha256 efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef"
    puts stderr "              archs sm_80 sm_90"
    puts stderr "              toolchain cxx11_abi=True, gcc=13.3.0, kind=locked, nvcc=12.6, torch=2.9.1+cu126"
    puts stderr "              finished 2026-11-29T12:00:00+00:00"
    puts stderr "Sets:         PATH MANPATH FLASH_ATTN_ROOT CUDA_HOME CONDA_PREFIX CONDA_DEFAULT_ENV (no LD_LIBRARY_PATH: conda prefixes use RPATH)"
}

# One flash-attn at a time: Environment Modules refuses to load a second one.
# Lmod users: use the Lua tree (Lmod 8.6 does not restore a Tcl pushenv on unload, TACC/Lmod#584).
family flash_attn
prepend-path PATH "/PROJECT/.envs/cu126/bin"
prepend-path MANPATH "/PROJECT/.envs/cu126/share/man"
pushenv FLASH_ATTN_ROOT "/PROJECT/.envs/cu126"
pushenv CUDA_HOME "/PROJECT/.envs/cu126"
pushenv CONDA_PREFIX "/PROJECT/.envs/cu126"
pushenv CONDA_DEFAULT_ENV "/PROJECT/.envs/cu126"
