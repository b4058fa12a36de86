-- -*- lua -*-
-- flash-attn/2.8.3.post2-cu126-torch2.9-py312: Lmod modulefile written by fa-envkit (`toolkit modules`) from /PROJECT/envs/cu126.yaml.
-- Generated: edit the spec or the template (toolkit/site/templates/modulefile.lua) and regenerate.

whatis("Name: flash-attn")
whatis("Version: 2.8.3.post2-cu126-torch2.9-py312")
whatis("Description: FlashAttention 2.8.3.post2+cu126torch2.9 for CUDA 12.6 (cu126), torch 2.9.1, python 3.12")
whatis("URL: https://github.com/Dao-AILab/flash-attention")

help([[
flash-attn/2.8.3.post2-cu126-torch2.9-py312: FlashAttention (flash-attn 2.8.3.post2+cu126torch2.9) from line cu126.
CUDA 12.6 line

Inside:
  flash-attn  2.8.3.post2+cu126torch2.9
  torch       2.9.1
  CUDA        12.6.85
  python      3.12.8

Environment:  /PROJECT/.envs/cu126 (conda prefix installed from the lock)
Installed in: /PROJECT/.envs/cu126/lib/python3.12/site-packages
Spec:         /PROJECT/envs/cu126.yaml
              input sha256 <cu126.yaml input sha256>
Lock:         /PROJECT/locks/cu126.conda-lock.yml
              input sha256 cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd
              flash-attn sdist flash_attn-2.8.3.post2.tar.gz sha256 efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef
Build:        /PROJECT/wheelhouse/cu126/flash_attn-2.8.3.post2+cu126torch2.9-cp312-cp312-linux_x86_64.whl.build.json
              wheel flash_attn-2.8.3.post2+cu126torch2.9-cp312-cp312-linux_x86_64.whl
              wheel sha256 1212121212121212121212121212121212121212121212121212121212121212
              sdist sha256 efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef
              archs sm_80 sm_90
              toolchain cxx11_abi=True, gcc=13.3.0, kind=locked, nvcc=12.6, torch=2.9.1+cu126
              finished 2026-11-29T12:00:00+00:00
Sets:         PATH MANPATH FLASH_ATTN_ROOT CUDA_HOME CONDA_PREFIX CONDA_DEFAULT_ENV (no LD_LIBRARY_PATH: conda prefixes use RPATH)
]])

-- One flash-attn at a time: loading another replaces this one (with LMOD_AUTO_SWAP=no, one of another name fails).
family("flash_attn")
prepend_path("PATH", "/PROJECT/.envs/cu126/bin")
prepend_path("MANPATH", "/PROJECT/.envs/cu126/share/man")
pushenv("FLASH_ATTN_ROOT", "/PROJECT/.envs/cu126")
pushenv("CUDA_HOME", "/PROJECT/.envs/cu126")
pushenv("CONDA_PREFIX", "/PROJECT/.envs/cu126")
pushenv("CONDA_DEFAULT_ENV", "/PROJECT/.envs/cu126")
