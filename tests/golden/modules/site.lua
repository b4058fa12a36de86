-- -*- lua -*-
-- flash-attn/2.8.3.post2-cu130-torch2.11-py<XY>: Lmod modulefile written by fa-envkit (`toolkit modules`) from /PROJECT/envs/site.yaml.
-- Generated: edit the spec or the template (toolkit/site/templates/modulefile.lua) and regenerate.

whatis("Name: flash-attn")
whatis("Version: 2.8.3.post2-cu130-torch2.11-py<XY>")
whatis("Description: FlashAttention 2.8.3.post2+cu130torch2.11 for CUDA 13.0 (cu130), torch 2.11.0+cu130, python <X.Y>")
whatis("URL: https://github.com/Dao-AILab/flash-attention")

help([[
flash-attn/2.8.3.post2-cu130-torch2.11-py<XY>: FlashAttention (flash-attn 2.8.3.post2+cu130torch2.11) from line site.
Site GPU nodes (CUDA 13.0 module, torch in a venv)

Inside:
  flash-attn  2.8.3.post2+cu130torch2.11
  torch       2.11.0+cu130
  CUDA        13.0
  python      <X.Y.Z>

Environment:  /PROJECT/site-venv (external toolchain, installed with /PROJECT/site-venv/bin/python)
Installed in: /PROJECT/site-venv/lib/python<X.Y>/site-packages
Spec:         /PROJECT/envs/site.yaml
              input sha256 <site.yaml input sha256>
Lock:         none (no /PROJECT/locks/site.conda-lock.yml when this module was written)
Build:        no record in /PROJECT/wheelhouse/site of building flash-attn 2.8.3.post2+cu130torch2.11
Requires:     cuda/13.0 (loaded with this module)
Sets:         PATH FLASH_ATTN_ROOT CUDA_HOME VIRTUAL_ENV
]])

-- One flash-attn at a time: loading another replaces this one (with LMOD_AUTO_SWAP=no, one of another name fails).
family("flash_attn")
depends_on("cuda/13.0")
prepend_path("PATH", "/PROJECT/site-venv/bin")
pushenv("FLASH_ATTN_ROOT", "/PROJECT/site-venv")
pushenv("CUDA_HOME", "/PROJECT/site-cuda")
pushenv("VIRTUAL_ENV", "/PROJECT/site-venv")
